"""Stand-in for ComfyUI 0.27.0 ``execution.py``: PromptExecutor, PromptQueue and the output caches.

A prompt is ``{node_id: {"class_type": ..., "inputs": {...}}}`` with links ``[node_id, output_index]``.  Nodes
run in dependency order, each inside ``CurrentNodeContext``; outputs are cached across prompts by input
signature (so a loader's ModelPatcher stays alive as in ComfyUI).  Memory calls match the real executor:
``cleanup_models_gc()`` once per prompt after cache set-up, ``unload_all_models()`` in the OOM handler and at
the end when DISABLE_SMART_MEMORY, the RAM-pressure step after each node.  No validation, subgraphs or UI.
"""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/execution")

import psutil

import comfy.memory_management


class CacheType(Enum):
    CLASSIC = 0
    LRU = 1
    NONE = 2
    RAM_PRESSURE = 3


class OutputCache(_SharedOutputCache):
    """Node outputs keyed by input signature (class and inputs, links resolved recursively).

    CLASSIC drops what the current prompt does not use, LRU keeps the ``lru_size`` most recent, NONE keeps
    nothing across prompts, RAM_PRESSURE keeps everything until ``ram_release`` finds RAM short.
    """

    def clean_unused(self):
        used = set(self.signatures.values())
        if self.cache_type in (CacheType.CLASSIC, CacheType.NONE):
            self.entries = {k: v for k, v in self.entries.items() if k in used and self.cache_type == CacheType.CLASSIC}
        elif self.cache_type == CacheType.LRU:
            while len(self.entries) > max(self.lru_size, len(used)):
                self.entries.pop(next(k for k in self.entries if k not in used))

    def ram_release(self, target, free_active=False):
        """Drop entries the current prompt does not use (all with ``free_active``) while available RAM < target."""
        if psutil.virtual_memory().available >= target:
            return 0
        used = set(self.signatures.values())
        dropped = [k for k in self.entries if free_active or k not in used]
        for k in dropped:
            del self.entries[k]
        return len(dropped)


class CacheSet:
    """The executor's caches; only ``outputs`` is modelled."""

    def __init__(self, cache_type=None, cache_args={}):
        cache_type = cache_type if isinstance(cache_type, CacheType) else CacheType.CLASSIC
        self.outputs = OutputCache(cache_type, (cache_args or {}).get("lru", 0))
        self.all = [self.outputs]


class PromptExecutor(_SharedPromptExecutor):
    """Runs prompts, keeping node outputs cached between them."""

    def __init__(self, server, cache_type=False, cache_args=None):
        self.cache_args = cache_args
        self.cache_type = cache_type
        self.server = server if server is not None else _SilentServer()
        self.reset()

    def reset(self):
        """Drop every cached output (what ``/free`` with ``free_memory`` triggers)."""
        self.caches = CacheSet(cache_type=self.cache_type, cache_args=self.cache_args)
        self.objects = {}
        self.status_messages = []
        self.success = True

    async def execute_async(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        """Run ``prompt``; ``execute_outputs`` defaults to its OUTPUT_NODE nodes (or all nodes if none)."""
        nodes.interrupt_processing(False)
        self.server.client_id = extra_data.get("client_id")
        self.status_messages = []
        self.add_message("execution_start", {"prompt_id": prompt_id}, broadcast=False)
        cache_args = self.cache_args or {}
        ram_headroom = int(cache_args.get("ram", 0) * (1024 ** 3))
        ram_inactive_headroom = int(cache_args.get("ram_inactive", 0) * (1024 ** 3))
        ram_release_callback = self.caches.outputs.ram_release if self.cache_type == CacheType.RAM_PRESSURE else None
        comfy.memory_management.set_ram_cache_release_state(ram_release_callback, ram_headroom)
        try:
            with torch.inference_mode():
                self.caches.outputs.set_prompt(prompt)
                self.caches.outputs.clean_unused()
                cached_nodes = [n for n in prompt if self.caches.outputs.get(n) is not None]
                comfy.model_management.cleanup_models_gc()
                self.add_message("execution_cached", {"nodes": cached_nodes, "prompt_id": prompt_id}, broadcast=False)
                targets = list(execute_outputs) or [n for n in prompt if getattr(
                    nodes.NODE_CLASS_MAPPINGS[prompt[n]["class_type"]], "OUTPUT_NODE", False)] or list(prompt)
                self.success = True
                for node_id in _dependency_order(prompt, targets):
                    if self.caches.outputs.get(node_id) is not None:
                        continue
                    if not await self._execute_node(prompt, prompt_id, node_id):
                        break
                    if ram_release_callback is not None:
                        ram_release_callback(ram_inactive_headroom)
                        ram_shortfall = ram_headroom - psutil.virtual_memory().available
                        freed = comfy.model_management.free_pins(ram_shortfall + 512 * (1024 ** 2))
                        if freed < ram_shortfall:
                            ram_release_callback(ram_headroom, free_active=True)
                else:
                    self.add_message("execution_success", {"prompt_id": prompt_id}, broadcast=False)
                if self.cache_type == CacheType.NONE:
                    self.caches.outputs.entries.clear()
                self.history_result = {"outputs": {}, "meta": {}}
                self.server.last_node_id = None
                if comfy.model_management.DISABLE_SMART_MEMORY:
                    comfy.model_management.unload_all_models()
        finally:
            comfy.memory_management.set_ram_cache_release_state(None, 0)

    async def _execute_node(self, prompt, prompt_id, node_id):
        class_type = prompt[node_id]["class_type"]
        class_def = nodes.NODE_CLASS_MAPPINGS[class_type]
        try:
            inputs = {name: self.caches.outputs.get(v[0])[v[1]] if _is_link(v) else v
                      for name, v in prompt[node_id]["inputs"].items()}
            obj = self.objects.get((node_id, class_type))
            if obj is None:
                obj = self.objects[(node_id, class_type)] = class_def()
            nodes.before_node_execution()
            result = await get_output_data(prompt_id, node_id, obj, inputs)
            if isinstance(result, dict):
                result = result.get("result", ())
            self.caches.outputs.set(node_id, tuple(result))
            return True
        except comfy.model_management.InterruptProcessingException:
            logging.info("Processing interrupted")
            self.add_message("execution_interrupted", {"prompt_id": prompt_id, "node_id": node_id}, broadcast=True)
        except Exception as ex:
            logging.error(f"!!! Exception during processing !!! {ex}")
            logging.error(traceback.format_exc())
            if comfy.model_management.is_oom(ex):
                logging.info("Memory summary:\n{}".format(comfy.model_management.debug_memory_summary()))
                logging.error("Got an OOM, unloading all loaded models.")
                comfy.model_management.unload_all_models()
            self.add_message("execution_error", {"prompt_id": prompt_id, "node_id": node_id, "node_type": class_type,
                                                 "exception_message": str(ex), "exception_type": type(ex).__name__},
                             broadcast=False)
        self.success = False
        return False
