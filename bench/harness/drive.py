"""Drive a real ComfyUI server through a scripted scenario and record what it logged.

Standard library only: this script runs under any Python 3.10+, while the ComfyUI server runs under the
interpreter named by ``--python`` (a venv that has ComfyUI's requirements).

What one run does:

1. makes ``--out``/base a ComfyUI base directory (``--base-directory``, and ``--database-url`` in it where the tree
   has that flag): ``custom_nodes/`` with copies of the node packs next to this file (``memx_test_nodes`` by
   default, ``--pack`` for others), ``input/``, ``output/``, ``temp/``, ``user/``, and ``--checkpoint`` symlinked
   into ``models/checkpoints/``; nothing is written into the tree, so one unpacked tree serves many servers;
2. starts ComfyUI on 127.0.0.1 and a free port, with ``--cpu``, through one of three launchers:
   ``plain`` (``python main.py``), ``module`` (``python -m comfy_memx main.py``) or
   ``env`` (``python main.py`` with ``COMFY_MEMX=1``); under comfy_memx, ``COMFY_MEMX_EVENTS`` is
   ``--out``/events.jsonl unless ``--no-events``;
3. waits for ``GET /system_stats``, submits the scenario's prompts with ``POST /prompt`` one after the
   other (each awaited through ``GET /history/<id>``), sends ``POST /free``, then, with ``--post-memx-free``,
   ``POST /memx/free`` (its receipt goes to ``memx_free`` in the summary), then GETs any ``--get`` URLs;
4. stops the server (SIGINT, then SIGTERM, then SIGKILL; always, whatever failed) and writes
   ``server.log`` (the full server output), ``steps.json`` and ``summary.json`` into ``--out``.

Scenarios:

``basic``  loader -> sampler, then the same loader -> sampler with another seed (the loader's output is
           reused from ComfyUI's cache), then ``/free``. No leak is expected.
``leak``   loader("memx-leak-a") -> sampler and -> MemxLeakyCache, then loader("memx-leak-b") -> sampler.
           The changed loader input makes ComfyUI's output cache drop the first patcher while
           MemxLeakyCache still holds its torch module, so ComfyUI logs "Potential memory leak detected
           with model MemxTinyNet" and "WARNING, memory leak with model MemxTinyNet" during the second
           prompt; then ``/free``.
``t2i``    ComfyUI's default text-to-image workflow (``workflows/default_t2i.json``) on ``--checkpoint``, then
           again with another seed, then ``/free``.

For tests, :class:`Session` keeps one server open for any number of steps (prompts, queued prompts, HTTP calls,
calls at the same moment) and records where each step starts and ends in the server log and in the event log;
``tests/real/test_real_comfyui.py`` builds its scenarios on it. :func:`ensure_checkpoint` builds the random-weight
checkpoint with ``make_checkpoint.py`` when a cache does not hold it yet.

Example::

    python -m bench.harness.drive --tree /work/comfy/c0270 --python /work/comfy/venv/bin/python \\
        --scenario leak --launcher module --out /tmp/memx_run --get /memx/models

Exit status: 0 when the server booted, every HTTP call answered 2xx and every prompt succeeded;
1 otherwise (details in summary.json); 2 for bad command-line arguments.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from bench.harness import waits

HOST = "127.0.0.1"
NODE_PACK_NAME = "memx_test_nodes"
NODE_PACK_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), NODE_PACK_NAME)
LAUNCHERS = ("plain", "module", "env")
SCENARIOS = ("basic", "leak", "t2i")
FREE_ALL = {"unload_models": True, "free_memory": True}
LEAK_INFO_TEXT = "Potential memory leak detected with model"
LEAK_WARNING_TEXT = "WARNING, memory leak with model"
TINY_MODEL_CLASS = "MemxTinyNet"


def loader_node(name, width=512, depth=4):
    """Return a prompt node for MemxTinyModelLoader; a different ``name`` builds a different model."""
    return {"class_type": "MemxTinyModelLoader", "inputs": {"name": name, "width": width, "depth": depth}}


def sampler_node(model_node_id, seed):
    """Return a prompt node for MemxTinySampler fed by the MODEL output of ``model_node_id``."""
    return {"class_type": "MemxTinySampler", "inputs": {"model": [model_node_id, 0], "seed": seed}}


def leaky_cache_node(model_node_id, key):
    """Return a prompt node for MemxLeakyCache, which keeps the torch module of its MODEL input."""
    return {"class_type": "MemxLeakyCache", "inputs": {"model": [model_node_id, 0], "key": key}}


def scenario_steps(scenario):
    """Return the ordered steps of a scenario: dicts with ``kind`` "prompt" (and ``prompt``) or "free" (and ``body``).

    Node ids stay the same across prompts on purpose: ComfyUI's output cache then replaces the loader's
    entry when (and only when) the loader's inputs change.
    """
    if scenario == "basic":
        return [
            {"kind": "prompt", "name": "first", "prompt": {
                "1": loader_node("memx-basic"), "2": sampler_node("1", 1)}},
            {"kind": "prompt", "name": "reseeded", "prompt": {
                "1": loader_node("memx-basic"), "2": sampler_node("1", 2)}},
            {"kind": "free", "name": "free", "body": dict(FREE_ALL)},
        ]
    if scenario == "leak":
        return [
            {"kind": "prompt", "name": "leaky", "prompt": {
                "1": loader_node("memx-leak-a"), "2": sampler_node("1", 1), "3": leaky_cache_node("1", "a")}},
            {"kind": "prompt", "name": "replace_loader", "prompt": {
                "1": loader_node("memx-leak-b"), "2": sampler_node("1", 2)}},
            {"kind": "free", "name": "free", "body": dict(FREE_ALL)},
        ]
    if scenario == "t2i":
        return [
            {"kind": "prompt", "name": "t2i", "prompt": default_workflow(0)},
            {"kind": "prompt", "name": "reseeded", "prompt": default_workflow(1)},
            {"kind": "free", "name": "free", "body": dict(FREE_ALL)},
        ]
    raise ValueError(f"unknown scenario {scenario!r}; expected one of {SCENARIOS}")


def free_port():
    """Ask the kernel for a currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def parse_env_pairs(pairs):
    """Turn ``["K=V", ...]`` into a dict; raises ValueError for an item without ``=`` or with an empty key."""
    result = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--env expects K=V, got {pair!r}")
        result[key] = value
    return result


def install_node_pack(tree):
    """Copy the test node pack into ``<tree>/custom_nodes/`` (replacing our earlier copy) and return its path.

    A copy rather than a symlink, so that ComfyUI's byte-code caches never land in the repository.
    """
    custom_nodes = os.path.join(tree, "custom_nodes")
    if not os.path.isdir(custom_nodes):
        raise FileNotFoundError(f"{custom_nodes} does not exist; is {tree} a ComfyUI tree?")
    target = os.path.join(custom_nodes, NODE_PACK_NAME)
    shutil.copytree(NODE_PACK_SOURCE, target, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


def server_command(python, tree, launcher, port, comfy_args=()):
    """Return ``(argv, extra_env)`` that start ComfyUI in ``tree`` on 127.0.0.1:``port`` with ``launcher``."""
    main_py = os.path.join(os.path.abspath(tree), "main.py")
    if launcher == "module":
        prefix = [python, "-m", "comfy_memx", main_py]
    elif launcher in ("plain", "env"):
        prefix = [python, main_py]
    else:
        raise ValueError(f"unknown launcher {launcher!r}; expected one of {LAUNCHERS}")
    extra_env = {"COMFY_MEMX": "1"} if launcher == "env" else {}
    argv = prefix + ["--cpu", "--listen", HOST, "--port", str(port)] + list(comfy_args)
    return argv, extra_env


def inherited_env():
    """Return this process's environment without ``COMFY_MEMX*`` variables.

    Only ``--launcher`` and ``--env`` decide whether and how comfy_memx is active in the server; a
    ``COMFY_MEMX=1`` left in the caller's shell would otherwise turn a ``plain`` run into an ``env`` run.
    """
    return {key: value for key, value in os.environ.items() if not key.startswith("COMFY_MEMX")}


def http_call(method, url, body=None, timeout=10.0):
    """Do one HTTP request; return ``(status, parsed JSON or text)``, status 0 and the error text on failure."""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except (urllib.error.URLError, OSError) as error:
        return 0, f"{type(error).__name__}: {error}"
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _default_sigint():
    """Run in the server's process before ComfyUI: SIGINT back to its default.  A driver started in the background
    by a non-interactive shell (``nohup ... &``, some CI runners) passes SIGINT on ignored, and Python then installs
    no KeyboardInterrupt handler, so ComfyUI would never stop on the SIGINT that :meth:`ComfyServer.stop` sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ComfyServer:
    """One ComfyUI server process in its own session, with its output going to a log file."""

    def __init__(self, argv, cwd, env, log_path, port):
        self.argv = argv
        self.cwd = cwd
        self.env = env
        self.log_path = log_path
        self.base_url = f"http://{HOST}:{port}"
        self.process = None
        self.stop_method = None
        self.interrupted_at = None

    def start(self):
        """Start the process; stdout and stderr both go to ``log_path``."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=_default_sigint)

    def alive(self):
        """True while the server process has not exited."""
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout):
        """Poll ``GET /system_stats`` until it answers 200; return the stats, or None when the server exited or its
        log did not grow for ``timeout`` seconds (a slow start that keeps logging is waited for)."""
        try:
            return waits.wait_for_server(self.base_url, self.process, self.log_path, stall_s=timeout)
        except waits.WaitFailed:
            return None

    def stop(self, grace=15.0):
        """Stop the server: SIGINT, then SIGTERM to its process group, then SIGKILL; return its exit code."""
        if self.process is None:
            return None
        if self.process.poll() is not None:
            self.stop_method = self.stop_method or "exited"
        else:
            for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    if sig == signal.SIGINT:
                        self.interrupted_at = os.path.getsize(self.log_path)
                        self.process.send_signal(sig)
                    else:
                        os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=wait)
                    self.stop_method = sig.name
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._kill_leftovers()
        return self.process.poll()

    def _kill_leftovers(self):
        """Kill whatever is left in the server's own process group (children it may have spawned)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def submit_prompt(server, prompt, client_id="memx-drive"):
    """POST one prompt; return ``(http_status, response body)``."""
    return http_call("POST", server.base_url + "/prompt", {"prompt": prompt, "client_id": client_id})


def wait_for_history(server, prompt_id, timeout):
    """Wait until the prompt has its ``/history`` entry and return it; None when the server exited or neither the
    prompt's place in ``/queue`` nor the server log moved for ``timeout`` seconds (a slow prompt is waited for)."""
    try:
        return waits.wait_for_prompt(server.base_url, prompt_id, server.alive, server.log_path, stall_s=timeout)
    except waits.WaitFailed:
        return None


def run_prompt_step(server, step, timeout):
    """Submit a prompt step and wait for it; return the step's result record."""
    started = time.monotonic()
    status, body = submit_prompt(server, step["prompt"])
    record = prompt_record(step["name"], status, body)
    if record["prompt_id"]:
        finish_prompt_record(server, record, timeout)
    record["seconds"] = round(time.monotonic() - started, 3)
    return record


def prompt_record(name, status, body):
    """The record of a submitted prompt (``ok`` False until :func:`finish_prompt_record` saw it succeed)."""
    prompt_id = body.get("prompt_id") if isinstance(body, dict) and status == 200 else None
    return {"name": name, "kind": "prompt", "http_status": status, "response": body, "prompt_id": prompt_id,
            "ok": False}


def finish_prompt_record(server, record, timeout):
    """Wait for the prompt of ``record`` through ``/history`` and fill in its status, outputs and messages."""
    entry = wait_for_history(server, record["prompt_id"], timeout)
    if entry is None:
        record["error"] = "no history entry: the server exited or made no progress for the stall window"
        return record
    run_status = entry.get("status", {})
    record["status_str"] = run_status.get("status_str")
    record["completed"] = run_status.get("completed")
    record["outputs"] = entry.get("outputs", {})
    record["messages"] = [message[0] for message in run_status.get("messages", [])]
    record["ok"] = record["status_str"] == "success"
    if not record["ok"]:
        record["error_messages"] = [m for m in run_status.get("messages", []) if m[0] == "execution_error"]
    return record


def lines_containing(text, needle):
    """Return the lines of ``text`` that contain ``needle``, without ANSI colour codes, in order."""
    found = []
    for line in text.splitlines():
        clean = strip_ansi(line)
        if needle in clean:
            found.append(clean.strip())
    return found


TRACEBACK_HEAD = "Traceback (most recent call last):"


def tracebacks(text):
    """Each traceback in ``text`` as ``(its text, the exception line)``; the exception line is the first line after
    the head that is not indented (the frames and their source lines are)."""
    found = []
    lines = strip_ansi(text).splitlines()
    for index, line in enumerate(lines):
        if TRACEBACK_HEAD not in line:
            continue
        end = index + 1
        while end < len(lines) and lines[end][:1] in (" ", "\t"):
            end += 1
        exception = lines[end].strip() if end < len(lines) else ""
        found.append(("\n".join(lines[index:end + 1]), exception))
    return found


def failure_tracebacks(serving, interrupted):
    """The tracebacks that are failures, given the log written before the stop's SIGINT (``serving``) and after it
    (``interrupted``): all of them, except a ``KeyboardInterrupt`` written after the SIGINT.  That one is the signal
    itself: when it lands while the event loop runs a task (aiohttp closing a connection), ComfyUI's ``except
    KeyboardInterrupt`` stops the server, and asyncio also logs the interrupted task's exception, with a traceback."""
    return [text for text, _ in tracebacks(serving)] + [
        text for text, exception in tracebacks(interrupted) if exception != "KeyboardInterrupt"]


def strip_ansi(line):
    """Remove ANSI escape sequences (0.27.0 colours its log level prefixes) from one line."""
    out = []
    index = 0
    while index < len(line):
        if line[index] == "\x1b" and index + 1 < len(line) and line[index + 1] == "[":
            index += 2
            while index < len(line) and not line[index].isalpha():
                index += 1
            index += 1
            continue
        out.append(line[index])
        index += 1
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Sessions: one server, many steps, every step marked in the server log and the event log
# ---------------------------------------------------------------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
PACK_SOURCES = {NODE_PACK_NAME: NODE_PACK_SOURCE,
                "memx_unload_nodes": os.path.join(HERE, "memx_unload_nodes")}
CHECKPOINT_NAME = "memx_sd15_random.safetensors"
SMALL_CHECKPOINT_NAME = "memx_small_random.safetensors"                # --arch small: one-level UNet, CLIP-L, TAESD
SMALL_NO_CLIP_CHECKPOINT_NAME = "memx_small_noclip_random.safetensors"  # the same without the text encoder
DEFAULT_WORKFLOW = os.path.join(HERE, "workflows", "default_t2i.json")
MAKE_CHECKPOINT = os.path.join(HERE, "make_checkpoint.py")
BASE_SUBDIRS = ("custom_nodes", "input", "output", "temp", "user", os.path.join("models", "checkpoints"))


def default_workflow(seed=None):
    """ComfyUI's default text-to-image workflow (``workflows/default_t2i.json``), optionally with another seed."""
    with open(DEFAULT_WORKFLOW, encoding="utf-8") as handle:
        workflow = json.load(handle)
    if seed is not None:
        workflow["3"]["inputs"]["seed"] = seed
    return workflow


def tree_accepts(tree, flag):
    """True when ComfyUI's argument parser in ``tree`` (``comfy/cli_args.py``) defines ``flag``."""
    return f'"{flag}"' in read_text(os.path.join(tree, "comfy", "cli_args.py"))


def prepare_base_dir(base, packs=(NODE_PACK_NAME,), checkpoint=None):
    """Make ``base`` a ComfyUI base directory: its folders, copies of ``packs`` (names of ``PACK_SOURCES`` or
    folders) in ``custom_nodes/``, and ``checkpoint`` symlinked as ``models/checkpoints/<CHECKPOINT_NAME>``.

    Copies rather than symlinks for the packs, so that ComfyUI's byte-code caches never land in the repository.
    """
    for name in BASE_SUBDIRS:
        os.makedirs(os.path.join(base, name), exist_ok=True)
    for pack in packs:
        source = PACK_SOURCES.get(pack, pack)
        shutil.copytree(source, os.path.join(base, "custom_nodes", os.path.basename(os.path.normpath(source))),
                        dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if checkpoint:
        link = os.path.join(base, "models", "checkpoints", CHECKPOINT_NAME)
        if not os.path.lexists(link):
            try:
                os.symlink(os.path.abspath(checkpoint), link)
            except OSError:
                os.link(checkpoint, link)
    return base


def base_dir_args(tree, base):
    """ComfyUI flags that make ``base`` its base directory, with the database there where the tree has the flag."""
    args = ["--base-directory", base]
    if tree_accepts(tree, "--database-url"):
        args += ["--database-url", "sqlite:///" + os.path.join(base, "user", "comfyui.db")]
    return args


def ensure_checkpoint(python, tree, path, timeout=900, arch="sd15", clip=True):
    """Return ``path`` after building the random-weight checkpoint there with make_checkpoint.py if absent: SD1.5
    (``arch`` ``sd15``) or the small one of the same family (``small``), without its text encoder when ``clip`` is
    false.

    Built into ``<path>.<pid>.partial`` and renamed, so a cache never holds half a file.
    """
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return path
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        command = [python, MAKE_CHECKPOINT, "--tree", os.path.abspath(tree), "--out", partial, "--arch", arch]
        result = subprocess.run(command + ([] if clip else ["--no-clip"]),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                                cwd=os.path.dirname(os.path.abspath(path)), env=inherited_env())
        if result.returncode != 0 or not os.path.isfile(partial):
            raise RuntimeError(f"make_checkpoint.py failed ({result.returncode}): {result.stdout[-3000:]}")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path


def in_parallel(*calls):
    """Run the no-argument callables at the same time in threads; return their results (or exceptions) in order."""
    import threading

    results = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def work(index, call):
        try:
            barrier.wait(timeout=10)
            results[index] = call()
        except Exception as error:  # handed back to the caller
            results[index] = error

    threads = [threading.Thread(target=work, args=(index, call), daemon=True) for index, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


class Session:
    """One ComfyUI server under a launcher, driven step by step; every step records where it starts and ends in
    the server log (byte offsets) and in comfy_memx's event log (line numbers), so that tests can tell which
    step logged what.

    ``out`` gets ``server.log``, ``events.jsonl`` (``COMFY_MEMX_EVENTS`` when ``events`` and comfy_memx is on),
    ``steps.json`` and the ComfyUI base directory ``base/`` (``packs`` in its ``custom_nodes``, ``checkpoint`` in
    ``models/checkpoints``). ``env`` adds server environment variables (``COMFY_MEMX_LEAK_MODE=strict``, ...).
    """

    def __init__(self, tree, python, out, launcher="plain", env=None, comfy_args=(), packs=(NODE_PACK_NAME,),
                 checkpoint=None, events=True, port=0):
        self.tree = os.path.abspath(tree)
        self.python = python
        self.out = os.path.abspath(out)
        self.launcher = launcher
        self.port = port or free_port()
        os.makedirs(self.out, exist_ok=True)
        self.base = prepare_base_dir(os.path.join(self.out, "base"), packs, checkpoint)
        self.log_path = os.path.join(self.out, "server.log")
        self.events_path = os.path.join(self.out, "events.jsonl") if events and launcher != "plain" else None
        argv, launcher_env = server_command(python, self.tree, launcher, self.port,
                                            base_dir_args(self.tree, self.base) + list(comfy_args))
        server_env = inherited_env()
        server_env.update(launcher_env)
        if self.events_path:
            server_env["COMFY_MEMX_EVENTS"] = self.events_path
        server_env.update(env or {})
        server_env["PYTHONUNBUFFERED"] = "1"
        self.extra_env = {key: value for key, value in server_env.items() if key.startswith("COMFY_MEMX")}
        self.argv = argv
        self.server = ComfyServer(argv, self.tree, server_env, self.log_path, self.port)
        self.base_url = self.server.base_url
        self.steps = []
        self.stats = None
        self.comfyui_version = None
        self.boot_seconds = None
        self.exit_code = None
        self.stop_method = None

    # -- life cycle -------------------------------------------------------------------------------------------------

    def start(self, boot_timeout=180.0):
        """Start the server and wait for ``/system_stats``; returns True when it answered."""
        started = time.monotonic()
        self.server.start()
        self.stats = self.server.wait_ready(boot_timeout)
        self.boot_seconds = round(time.monotonic() - started, 3)
        if self.stats is not None:
            self.comfyui_version = self.stats.get("system", {}).get("comfyui_version")
        return self.stats is not None

    def stop(self):
        """Stop the server (SIGINT first); returns its exit code and writes ``steps.json``."""
        self.exit_code = self.server.stop()
        self.stop_method = self.server.stop_method
        with open(os.path.join(self.out, "steps.json"), "w", encoding="utf-8") as handle:
            json.dump({"argv": self.argv, "env": self.extra_env, "boot_seconds": self.boot_seconds,
                       "comfyui_version": self.comfyui_version, "exit_code": self.exit_code,
                       "stop_method": self.stop_method, "steps": self.steps}, handle, indent=2, default=str)
        return self.exit_code

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def alive(self):
        return self.server.alive()

    # -- marks --------------------------------------------------------------------------------------------------------

    def mark(self):
        """``(server log size in bytes, number of complete event lines)`` now."""
        try:
            log_size = os.path.getsize(self.log_path)
        except OSError:
            log_size = 0
        return log_size, len(self._event_lines())

    def _event_lines(self):
        if not self.events_path:
            return []
        lines = read_text(self.events_path).split("\n")
        return lines[:-1]  # the part after the last newline is not a complete line yet

    def _record(self, record, before):
        after = self.mark()
        record["log_span"] = [before[0], after[0]]
        record["event_span"] = [before[1], after[1]]
        self.steps.append(record)
        return record

    # -- steps --------------------------------------------------------------------------------------------------------

    def prompt(self, name, prompt, timeout=300.0):
        """Run ``prompt`` and wait for it; returns its record (``ok``, ``outputs``, ``prompt_id``, spans)."""
        before = self.mark()
        started = time.monotonic()
        record = run_prompt_step(self.server, {"name": name, "prompt": prompt}, timeout)
        record["seconds"] = round(time.monotonic() - started, 3)
        return self._record(record, before)

    def submit(self, name, prompt):
        """Queue ``prompt`` without waiting; returns its record (finish it with :meth:`finish`)."""
        status, body = submit_prompt(self.server, prompt)
        record = prompt_record(name, status, body)
        record["submitted"] = time.monotonic()
        record["mark"] = self.mark()
        return record

    def finish(self, record, timeout=300.0):
        """Wait for a prompt queued by :meth:`submit`; its spans start at the submission."""
        if record["prompt_id"]:
            finish_prompt_record(self.server, record, timeout)
        record["seconds"] = round(time.monotonic() - record.pop("submitted"), 3)
        return self._record(record, record.pop("mark"))

    def wait_running(self, prompt_id, timeout=waits.STALL_S):
        """Poll ``GET /queue`` until ``prompt_id`` is the running prompt; True when it was seen running, False when
        it had already finished, the server exited, or nothing moved for ``timeout`` seconds."""
        seen = {}

        def ready():
            seen["place"] = waits.place_of(prompt_id, http_call("GET", self.base_url + "/queue", timeout=5.0),
                                           http_call("GET", f"{self.base_url}/history/{prompt_id}", timeout=5.0))
            return seen["place"][0] in ("running", "done")

        try:
            waits.wait_until(ready, self.alive, lambda: (seen.get("place"), waits.log_size(self.log_path)()),
                             f"prompt {prompt_id} to start", timeout, poll_s=0.05)
        except waits.WaitFailed:
            return False
        return seen["place"][0] == "running"

    def call(self, name, method, path, body=None, timeout=30.0):
        """One HTTP call to the server as a step; returns its record (``http_status``, ``body``)."""
        before = self.mark()
        record = self.request(name, method, path, body, timeout)
        return self._record(record, before)

    def request(self, name, method, path, body=None, timeout=30.0):
        """One HTTP call, not recorded as a step (for calls made in parallel); returns its record."""
        started = time.monotonic()
        status, answer = http_call(method, self.base_url + path, body, timeout=timeout)
        return {"name": name, "kind": "http", "method": method, "path": path, "request": body,
                "http_status": status, "body": answer, "started": started, "ended": time.monotonic(),
                "seconds": round(time.monotonic() - started, 3)}

    def memx_free(self, name, body=None, timeout=60.0, record=True):
        """``POST /memx/free?timeout=...`` with ComfyUI's ``/free`` body (default: unload and free all)."""
        path = f"/memx/free?timeout={timeout:g}"
        body = dict(FREE_ALL) if body is None else body
        if record:
            return self.call(name, "POST", path, body, timeout=timeout + 60.0)
        return self.request(name, "POST", path, body, timeout=timeout + 60.0)

    def comfy_free(self, name, body=None, record=True):
        """ComfyUI's own ``POST /free`` (it answers before the worker acts on it)."""
        body = dict(FREE_ALL) if body is None else body
        if record:
            return self.call(name, "POST", "/free", body)
        return self.request(name, "POST", "/free", body)

    def parallel(self, name, *calls):
        """Run ``calls`` (no-argument callables, e.g. ``lambda: s.memx_free("a", record=False)``) at once; one
        step whose ``results`` are theirs."""
        before = self.mark()
        results = in_parallel(*calls)
        record = {"name": name, "kind": "parallel", "ok": not any(isinstance(r, Exception) for r in results),
                  "results": [r if not isinstance(r, Exception) else {"error": f"{type(r).__name__}: {r}"}
                              for r in results]}
        return self._record(record, before)

    def note(self, name, **fields):
        """An empty step that only marks the logs (e.g. "the receipts came back here")."""
        return self._record(dict(fields, name=name, kind="note"), self.mark())

    # -- reading back -------------------------------------------------------------------------------------------------

    def step(self, name):
        """The recorded step called ``name`` (the last one when several are)."""
        found = [step for step in self.steps if step["name"] == name]
        if not found:
            raise KeyError(f"no step {name!r}; steps: {[step['name'] for step in self.steps]}")
        return found[-1]

    def log_text(self, start=0, end=None):
        """The server log between two byte offsets, ANSI colours kept (see :func:`strip_ansi`)."""
        with open(self.log_path, "rb") as handle:
            handle.seek(start)
            raw = handle.read() if end is None else handle.read(max(0, end - start))
        return raw.decode("utf-8", "replace")

    def failure_tracebacks(self):
        """The tracebacks in the server log that are failures (see :func:`failure_tracebacks`)."""
        cut = self.server.interrupted_at
        return failure_tracebacks(self.log_text(0, cut), self.log_text(cut) if cut is not None else "")

    def step_log(self, name):
        """The server log written during step ``name``."""
        return self.log_text(*self.step(name)["log_span"])

    def events(self, start=0, end=None):
        """comfy_memx's events between two line numbers, parsed; a line that is not JSON raises ValueError."""
        return [json.loads(line) for line in self._event_lines()[start:end]]

    def step_events(self, name, *kinds):
        """The events written during step ``name``, only those of ``kinds`` when given."""
        start, end = self.step(name)["event_span"]
        return [event for event in self.events(start, end) if not kinds or event.get("event") in kinds]

    def events_after(self, name, *kinds):
        """The events written after step ``name`` ended, only those of ``kinds`` when given."""
        return [event for event in self.events(self.step(name)["event_span"][1])
                if not kinds or event.get("event") in kinds]


def run(options):
    """Execute one scenario as described by parsed ``options``; return the summary dict (also written to disk)."""
    out_dir = os.path.abspath(options.out)
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "server.log")
    tree = os.path.abspath(options.tree)
    summary = {
        "tree": tree, "python": options.python, "launcher": options.launcher, "scenario": options.scenario,
        "port": None, "ok": False, "error": None, "steps": [], "gets": [],
    }
    session = None
    try:
        if not os.path.isfile(os.path.join(tree, "main.py")):
            raise FileNotFoundError(f"{tree} has no main.py; is it a ComfyUI tree?")
        checkpoint = options.checkpoint
        if checkpoint is None and options.scenario == "t2i":
            raise ValueError("the t2i scenario needs --checkpoint (see make_checkpoint.py)")
        packs = tuple(options.pack) or (NODE_PACK_NAME,)
        session = Session(tree, options.python, out_dir, launcher=options.launcher, env=parse_env_pairs(options.env),
                          comfy_args=options.comfy_arg, packs=packs, checkpoint=checkpoint,
                          events=options.events, port=options.port)
        summary.update(port=session.port, command=session.argv, extra_env=session.extra_env,
                       node_pack=os.path.join(session.base, "custom_nodes", NODE_PACK_NAME),
                       base_directory=session.base, events_log=session.events_path)
        ready = session.start(options.boot_timeout)
        summary["boot_seconds"] = session.boot_seconds
        if not ready:
            summary["error"] = "server did not answer /system_stats" + ("" if session.alive() else " (exited)")
            return summary
        summary["system_stats"] = session.stats
        summary["comfyui_version"] = session.comfyui_version
        all_ok = True
        for step in scenario_steps(options.scenario):
            if step["kind"] == "prompt":
                record = session.prompt(step["name"], step["prompt"], options.prompt_timeout)
            else:
                record = session.comfy_free(step["name"], step["body"])
                record["ok"] = 200 <= record["http_status"] < 300
                time.sleep(options.settle)  # ComfyUI answers /free before its worker acts on it
            summary["steps"].append(record)
            all_ok = all_ok and record["ok"]
            if not session.alive():
                summary["error"] = f"server exited during step {step['name']!r}"
                all_ok = False
                break
        if options.post_memx_free is not None:
            record = session.memx_free("memx_free", timeout=options.post_memx_free)
            summary["memx_free"] = {"url": session.base_url + record["path"], "http_status": record["http_status"],
                                    "body": record["body"]}
            all_ok = all_ok and record["http_status"] in (200, 202)
        for path in options.get:
            url = path if path.startswith("http://") else session.base_url + "/" + path.lstrip("/")
            status, body = http_call("GET", url)
            summary["gets"].append({"url": url, "http_status": status, "body": body})
            all_ok = all_ok and 200 <= status < 300
        summary["ok"] = all_ok and summary["error"] is None
    except Exception as error:  # record any harness failure; the server is still stopped below
        summary["error"] = f"{type(error).__name__}: {error}"
    finally:
        if session is not None:
            summary["server_exit_code"] = session.stop()
            summary["stop_method"] = session.stop_method
        log_text = read_text(log_path)
        summary["leak_info_lines"] = lines_containing(log_text, LEAK_INFO_TEXT)
        summary["leak_warning_lines"] = lines_containing(log_text, LEAK_WARNING_TEXT)
        summary["server_log"] = log_path
        with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2, default=str)
    return summary


def read_text(path):
    """Return a file's text (undecodable bytes replaced), or "" if it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def build_parser():
    """Return the command-line parser of this script."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, help="ComfyUI source tree (the folder with main.py)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs ComfyUI")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="plain")
    parser.add_argument("--scenario", choices=SCENARIOS, default="basic")
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="extra server env (repeatable)")
    parser.add_argument("--out", required=True, help="folder for server.log, summary.json and per-run ComfyUI dirs")
    parser.add_argument("--get", action="append", default=[], metavar="PATH",
                        help="URL path to GET after the scenario, e.g. /memx/models (repeatable)")
    parser.add_argument("--post-memx-free", type=float, default=None, metavar="TIMEOUT",
                        help="after the scenario, POST /memx/free?timeout=TIMEOUT and record the receipt (comfy_memx)")
    parser.add_argument("--comfy-arg", action="append", default=[], metavar="ARG",
                        help="extra ComfyUI argument, e.g. --comfy-arg=--cache-classic (repeatable)")
    parser.add_argument("--pack", action="append", default=[], metavar="NAME",
                        help=f"node pack to copy into custom_nodes: {', '.join(sorted(PACK_SOURCES))} or a folder "
                             f"(repeatable; default {NODE_PACK_NAME})")
    parser.add_argument("--checkpoint", default=None, metavar="PATH",
                        help=f"checkpoint linked as models/checkpoints/{CHECKPOINT_NAME} (needed by --scenario t2i)")
    parser.add_argument("--no-events", dest="events", action="store_false",
                        help="do not set COMFY_MEMX_EVENTS (default: events.jsonl in --out under comfy_memx)")
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--boot-timeout", type=float, default=180.0)
    parser.add_argument("--prompt-timeout", type=float, default=120.0)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds to wait after POST /free")
    parser.add_argument("--quiet", action="store_true", help="do not print the server log")
    return parser


def main(argv=None):
    """Command-line entry point: run the scenario, print the log and the summary, return the exit status."""
    options = build_parser().parse_args(argv)
    try:
        parse_env_pairs(options.env)
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    summary = run(options)
    if not options.quiet:
        sys.stdout.write(read_text(summary["server_log"]))
        sys.stdout.write("\n")
    print(json.dumps({key: value for key, value in summary.items() if key != "system_stats"}, indent=2, default=str))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
