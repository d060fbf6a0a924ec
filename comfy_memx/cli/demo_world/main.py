"""Runnable stand-in for ComfyUI's ``main.py`` (same start-up order, serving ``server.PromptServer``); the version
layer, first, gives the version's log format, its executor and what its prompt worker passes on.

Order as in the real file: enable argv parsing, parse args, set up logging, run custom-node prestartup
scripts (before torch), warn if torch is already imported, import comfy.utils (torch), execution
(→ comfy.model_management), server, nodes; under ``__main__`` log the versions, load custom nodes between
hook_breaker save/restore, ``add_routes()``, start ``prompt_worker``, exit 0 with ``--quick-test-for-ci``, else
serve on ``--listen``/``--port`` until interrupted.
Run: ``python comfy_memx/cli/demo_world/main.py --cpu --quick-test-for-ci`` (ComfyUI 0.27.0; 0.3.64:
``tests/fake_comfy/v0_3_64/main.py``, which runs this file).
"""
import logging

import stand_in_version

stand_in_version.apply_layer(globals())   # the version's log format, executor and worker hooks

import comfy.options
comfy.options.enable_args_parsing()

import importlib.util  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from comfy.cli_args import args  # noqa: E402
import folder_paths  # noqa: E402

def setup_logger(log_level="INFO", use_stdout=False):
    """Root logger at ``log_level``; errors to stderr, the rest to stdout with ``--log-stdout``."""
    logger = logging.getLogger()
    logger.setLevel(log_level)
    stream_handler = logging.StreamHandler()
    stream_handler.setFormatter(LOG_FORMATTER("%(message)s"))
    if use_stdout:
        stream_handler.addFilter(lambda record: record.levelno >= logging.ERROR)
        stdout_handler = logging.StreamHandler(sys.stdout)
        stdout_handler.setFormatter(LOG_FORMATTER("%(message)s"))
        stdout_handler.addFilter(lambda record: record.levelno < logging.ERROR)
        logger.addHandler(stdout_handler)
    logger.addHandler(stream_handler)


setup_logger(log_level=args.verbose, use_stdout=args.log_stdout)

if __name__ == "__main__":
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    os.environ["DO_NOT_TRACK"] = "1"


def execute_prestartup_script():
    """Run every ``custom_nodes/<pack>/prestartup_script.py`` (still before torch is imported)."""
    if args.disable_all_custom_nodes and len(args.whitelist_custom_nodes) == 0:
        return
    for custom_node_path in folder_paths.get_folder_paths("custom_nodes"):
        if not os.path.isdir(custom_node_path):
            continue
        for possible_module in sorted(os.listdir(custom_node_path)):
            script_path = os.path.join(custom_node_path, possible_module, "prestartup_script.py")
            if possible_module.endswith(".disabled") or not os.path.isfile(script_path):
                continue
            if args.disable_all_custom_nodes and possible_module not in args.whitelist_custom_nodes:
                logging.info(f"Prestartup Skipping {possible_module} due to disable_all_custom_nodes and whitelist_custom_nodes")
                continue
            try:
                spec = importlib.util.spec_from_file_location(os.path.splitext(script_path)[0], script_path)
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except Exception as e:
                logging.error(f"Failed to execute startup-script: {script_path} / {e}")


execute_prestartup_script()

import asyncio  # noqa: E402
import gc  # noqa: E402
import threading  # noqa: E402

if "torch" in sys.modules:
    logging.warning("WARNING: Potential Error in code: Torch already imported, torch should never be imported before this point.")

import comfy.utils  # noqa: E402,F401

import execution  # noqa: E402
import server  # noqa: E402
import nodes  # noqa: E402
import comfy.model_management  # noqa: E402
import comfyui_version  # noqa: E402
import hook_breaker_ac10a0  # noqa: E402
for _name in STARTUP_MODULES:        # what the version's main.py imports beyond these
    importlib.import_module(_name)


class HeadlessServer:
    """What prompt_worker needs of ``server.PromptServer``, without HTTP (for tests that drive the worker directly)."""

    def __init__(self, loop):
        self.loop = loop
        self.client_id = None
        self.last_node_id = None
        self.last_prompt_id = None
        self.prompt_queue = execution.PromptQueue(self)

    def send_sync(self, event, data, sid=None):
        pass

    def queue_updated(self):
        pass


def _run_queued_prompt(q, executor, server_instance, item, item_id):
    started = time.perf_counter()
    number, prompt_id, prompt, extra_data, outputs = item[:5]
    server_instance.last_prompt_id = prompt_id
    executor.execute(prompt, prompt_id, prompt_extra_data(item), outputs)
    status = execution.PromptQueue.ExecutionStatus(status_str="success" if executor.success else "error",
                                                   completed=executor.success, messages=executor.status_messages)
    q.task_done(item_id, executor.history_result, status=status, **TASK_DONE_OPTIONS)
    logging.info("Prompt executed in {:.2f} seconds".format(time.perf_counter() - started))


def prompt_worker(q, server_instance):
    """Execute queued prompts; handle ``unload_models`` / ``free_memory`` flags and the 10 s GC pass."""
    executor = make_executor(server_instance)
    gc_interval = 10.0
    last_gc = 0.0
    gc_pending = False
    while True:
        wait = max(gc_interval - (time.perf_counter() - last_gc), 0.0) if gc_pending else 1000.0
        queued = q.get(timeout=wait)
        if queued is not None:
            _run_queued_prompt(q, executor, server_instance, *queued)
            gc_pending = True

        flags = q.get_flags()
        free_memory = flags.get("free_memory", False)
        unload_models = flags.get("unload_models", free_memory)
        if unload_models:
            comfy.model_management.unload_all_models()
        if free_memory:
            executor.reset()
        if unload_models or free_memory:
            gc_pending, last_gc = True, 0.0

        if gc_pending and time.perf_counter() - last_gc > gc_interval:
            gc.collect()
            comfy.model_management.soft_empty_cache()
            last_gc, gc_pending = time.perf_counter(), False
            hook_breaker_ac10a0.restore_functions()


async def run(server_instance, address="", port=8188, verbose=True, call_on_start=None):
    """Serve on every comma-separated ``address`` and drain the server's messages."""
    addresses = [(addr, port) for addr in address.split(",")]
    await asyncio.gather(server_instance.start_multi_address(addresses, call_on_start, verbose),
                         server_instance.publish_loop())


def start_comfyui(asyncio_loop=None):
    """Create the PromptServer, load custom nodes, add the routes, start the prompt worker thread.

    Exits 0 here with ``--quick-test-for-ci``; otherwise returns ``(loop, server, start_all)``.
    """
    if not asyncio_loop:
        asyncio_loop = asyncio.new_event_loop()
        asyncio.set_event_loop(asyncio_loop)
    prompt_server = server.PromptServer(asyncio_loop)

    hook_breaker_ac10a0.save_functions()
    asyncio_loop.run_until_complete(nodes.init_extra_nodes(
        init_custom_nodes=(not args.disable_all_custom_nodes) or len(args.whitelist_custom_nodes) > 0,
        init_api_nodes=not args.disable_api_nodes))
    hook_breaker_ac10a0.restore_functions()

    prompt_server.add_routes()
    threading.Thread(target=prompt_worker, daemon=True, args=(prompt_server.prompt_queue, prompt_server)).start()

    if args.quick_test_for_ci:
        exit(0)

    async def start_all():
        await prompt_server.setup()
        await run(prompt_server, address=args.listen, port=args.port)

    return asyncio_loop, prompt_server, start_all


if __name__ == "__main__":
    logging.info("Python version: {}".format(sys.version))
    logging.info("ComfyUI version: {}".format(comfyui_version.__version__))
    event_loop, _, start_all_func = start_comfyui()
    try:
        event_loop.run_until_complete(start_all_func())
    except KeyboardInterrupt:
        logging.info("\nStopped server")
