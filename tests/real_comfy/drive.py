"""Drive a real ComfyUI server through a scripted scenario and record what it logged.

Standard library only: this script runs under any Python 3.10+, while the ComfyUI server runs under the
interpreter named by ``--python`` (a venv that has ComfyUI's requirements).

What one run does:

1. copies the model-free node pack ``memx_test_nodes`` (next to this file) into ``<tree>/custom_nodes/``;
2. starts ComfyUI on 127.0.0.1 and a free port, with ``--cpu`` and per-run user/input/output/temp
   directories and database under ``--out``, through one of three launchers:
   ``plain`` (``python main.py``), ``module`` (``python -m comfy_memx main.py``) or
   ``env`` (``python main.py`` with ``COMFY_MEMX=1``);
3. waits for ``GET /system_stats``, submits the scenario's prompts with ``POST /prompt`` one after the
   other (each awaited through ``GET /history/<id>``), sends ``POST /free``, then, with ``--post-memx-free``,
   ``POST /memx/free`` (its receipt goes to ``memx_free`` in the summary), then GETs any ``--get`` URLs;
4. stops the server (SIGINT, then SIGTERM, then SIGKILL; always, whatever failed) and writes
   ``server.log`` (the full server output) and ``summary.json`` into ``--out``.

Scenarios:

``basic``  loader -> sampler, then the same loader -> sampler with another seed (the loader's output is
           reused from ComfyUI's cache), then ``/free``. No leak is expected.
``leak``   loader("memx-leak-a") -> sampler and -> MemxLeakyCache, then loader("memx-leak-b") -> sampler.
           The changed loader input makes ComfyUI's output cache drop the first patcher while
           MemxLeakyCache still holds its torch module, so ComfyUI logs "Potential memory leak detected
           with model MemxTinyNet" and "WARNING, memory leak with model MemxTinyNet" during the second
           prompt; then ``/free``.

Example::

    python tests/real_comfy/drive.py --tree /work/comfy/c0270 --python /work/comfy/venv/bin/python \\
        --scenario leak --out /tmp/memx_run --get /memx/models

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

HOST = "127.0.0.1"
NODE_PACK_NAME = "memx_test_nodes"
NODE_PACK_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), NODE_PACK_NAME)
LAUNCHERS = ("plain", "module", "env")
SCENARIOS = ("basic", "leak")
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


def isolated_dir_args(run_dir):
    """Create per-run ComfyUI directories under ``run_dir`` and return the ComfyUI flags that select them.

    Keeps runs from sharing the tree's user folder and sqlite database with each other.
    """
    args = []
    for flag, name in (("--user-directory", "user"), ("--input-directory", "input"),
                       ("--output-directory", "output"), ("--temp-directory", "temp")):
        path = os.path.join(run_dir, name)
        os.makedirs(path, exist_ok=True)
        args += [flag, path]
    args += ["--database-url", "sqlite:///" + os.path.join(run_dir, "comfyui.db")]
    return args


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

    def start(self):
        """Start the process; stdout and stderr both go to ``log_path``."""
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self):
        """True while the server process has not exited."""
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout):
        """Poll ``GET /system_stats`` until it answers 200; return the stats, or None on timeout or early exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            status, body = http_call("GET", self.base_url + "/system_stats", timeout=2.0)
            if status == 200 and isinstance(body, dict):
                return body
            time.sleep(0.25)
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
    """Poll ``GET /history/<id>`` until the prompt has finished; return its history entry or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.alive():
        status, body = http_call("GET", f"{server.base_url}/history/{prompt_id}")
        if status == 200 and isinstance(body, dict) and prompt_id in body:
            entry = body[prompt_id]
            if entry.get("status", {}).get("completed") is not None or entry.get("outputs"):
                return entry
        time.sleep(0.2)
    return None


def run_prompt_step(server, step, timeout):
    """Submit a prompt step and wait for it; return the step's result record."""
    started = time.monotonic()
    status, body = submit_prompt(server, step["prompt"])
    record = {"name": step["name"], "kind": "prompt", "http_status": status, "response": body}
    prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
    record["prompt_id"] = prompt_id
    record["ok"] = False
    if status == 200 and prompt_id:
        entry = wait_for_history(server, prompt_id, timeout)
        if entry is None:
            record["error"] = "no history entry before timeout or server exit"
        else:
            run_status = entry.get("status", {})
            record["status_str"] = run_status.get("status_str")
            record["completed"] = run_status.get("completed")
            record["outputs"] = entry.get("outputs", {})
            record["messages"] = [message[0] for message in run_status.get("messages", [])]
            record["ok"] = record["status_str"] == "success"
            if not record["ok"]:
                record["error_messages"] = [m for m in run_status.get("messages", []) if m[0] == "execution_error"]
    record["seconds"] = round(time.monotonic() - started, 3)
    return record


def run_free_step(server, step, settle):
    """POST /free and give the worker ``settle`` seconds to act on it (it answers before acting)."""
    status, body = http_call("POST", server.base_url + "/free", step["body"])
    time.sleep(settle)
    return {"name": step["name"], "kind": "free", "request": step["body"], "http_status": status,
            "response": body, "ok": 200 <= status < 300}


def lines_containing(text, needle):
    """Return the lines of ``text`` that contain ``needle``, without ANSI colour codes, in order."""
    found = []
    for line in text.splitlines():
        clean = strip_ansi(line)
        if needle in clean:
            found.append(clean.strip())
    return found


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


def run(options):
    """Execute one scenario as described by parsed ``options``; return the summary dict (also written to disk)."""
    out_dir = os.path.abspath(options.out)
    os.makedirs(out_dir, exist_ok=True)
    log_path = os.path.join(out_dir, "server.log")
    tree = os.path.abspath(options.tree)
    port = options.port or free_port()
    summary = {
        "tree": tree, "python": options.python, "launcher": options.launcher, "scenario": options.scenario,
        "port": port, "ok": False, "error": None, "steps": [], "gets": [],
    }
    server = None
    try:
        summary["node_pack"] = install_node_pack(tree)
        comfy_args = isolated_dir_args(os.path.join(out_dir, "comfy_dirs")) + list(options.comfy_arg)
        argv, launcher_env = server_command(options.python, tree, options.launcher, port, comfy_args)
        env = inherited_env()
        env.update(launcher_env)
        env.update(parse_env_pairs(options.env))
        env["PYTHONUNBUFFERED"] = "1"
        summary["command"] = argv
        summary["extra_env"] = {**launcher_env, **parse_env_pairs(options.env)}
        server = ComfyServer(argv, tree, env, log_path, port)
        started = time.monotonic()
        server.start()
        stats = server.wait_ready(options.boot_timeout)
        summary["boot_seconds"] = round(time.monotonic() - started, 3)
        if stats is None:
            summary["error"] = "server did not answer /system_stats" + ("" if server.alive() else " (exited)")
            return summary
        summary["system_stats"] = stats
        summary["comfyui_version"] = stats.get("system", {}).get("comfyui_version")
        all_ok = True
        for step in scenario_steps(options.scenario):
            if step["kind"] == "prompt":
                record = run_prompt_step(server, step, options.prompt_timeout)
            else:
                record = run_free_step(server, step, options.settle)
            summary["steps"].append(record)
            all_ok = all_ok and record["ok"]
            if not server.alive():
                summary["error"] = f"server exited during step {step['name']!r}"
                all_ok = False
                break
        if options.post_memx_free is not None:
            url = f"{server.base_url}/memx/free?timeout={options.post_memx_free:g}"
            status, body = http_call("POST", url, dict(FREE_ALL), timeout=options.post_memx_free + 60.0)
            summary["memx_free"] = {"url": url, "http_status": status, "body": body}
            all_ok = all_ok and status in (200, 202)
        for path in options.get:
            url = path if path.startswith("http://") else server.base_url + "/" + path.lstrip("/")
            status, body = http_call("GET", url)
            summary["gets"].append({"url": url, "http_status": status, "body": body})
            all_ok = all_ok and 200 <= status < 300
        summary["ok"] = all_ok and summary["error"] is None
    except Exception as error:  # record any harness failure; the server is still stopped below
        summary["error"] = f"{type(error).__name__}: {error}"
    finally:
        if server is not None:
            summary["server_exit_code"] = server.stop()
            summary["stop_method"] = server.stop_method
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
