"""The production surface under concurrent traffic: ``GET /memx/models`` against ComfyUI's own ``GET /queue`` under
the same load, with and without a CPU-bound node and with and without concurrent holder searches.

::

    python -m bench.exposed [--requests 2000] [--clients 8] [--rounds 2] [--busy-s 0.3] [--cpu-node both|on|off]
                            [--json OUT]

One stand-in ComfyUI 0.27.0 server (written from the stand-in source shipped with comfy_memx, the tree the demo and
the tests run; under ``python -m comfy_memx``, ``--cpu``) with one generated node pack: ``MemxBenchLoader`` loads a
model and, for every third prompt, keeps it alive in a class-level cache (the classic leak, so there is something to
search), and ``MemxBusy`` loads its input model again, then spins the CPU for ``--busy-s`` seconds in Python (a
CPU-bound prompt node, like a sampler on the CPU).  A prompt thread runs prompts back to back (the loader, then the
busy node) and times each one; meanwhile ``--clients`` threads send ``--requests`` requests in all, drawn from a fixed mix:

=======================  ============  ===============
request                  ``searches``  ``no_searches``
=======================  ============  ===============
GET /memx/models         27.5 %        37.5 %
GET /queue (ComfyUI's)   27.5 %        37.5 %
GET /memx/metrics        10 %          10 %
POST /memx/free?timeout=0 (unload)  15 %   15 %
POST /memx/models/{id}/search  20 %    (shared by the two GETs above)
=======================  ============  ===============

``/memx/models`` and ``/queue`` have the same share, so their p99s stand on the same number of samples (550 each per
variant and round at 2,000 requests; a p99 on fewer than :data:`MIN_P99_SAMPLES` is left unjudged).  Two loads: the
``cpu_node`` load runs ``MemxBusy`` with ``--busy-s`` seconds, the ``no_cpu_node`` load with 0 (the node still loads
its model, it does not spin); ``--cpu-node on`` or ``off`` runs one of them only.  Every round runs both variants of
every load on the same server, alternating which goes first.

Judged: per load and variant, ``/memx/models`` p99 over ``/queue`` p99 of the same round (the median of the
per-round ratios, target <= 1.05: comfy_memx's read route is no slower than ComfyUI's own under the same load), and,
under the CPU-bound node, the ratios ``searches`` / ``no_searches`` of the median and p90 prompt latency per round
(target <= 1.10).  The p50 and p99 seconds of both routes, the median prompt latency and every answer's status are
recorded as information: an absolute latency on a shared machine measures the machine.  Standard library only (the
server runs under this interpreter, which needs the test extras: aiohttp).
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import quote

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from bench import common

CASE = "exposed"
MIX = {"searches": (("models", 55), ("queue", 55), ("metrics", 20), ("free", 30), ("search", 40)),
       "no_searches": (("models", 75), ("queue", 75), ("metrics", 20), ("free", 30))}
LOADS = ("cpu_node", "no_cpu_node")
CPU_NODE_CHOICES = {"both": LOADS, "on": ("cpu_node",), "off": ("no_cpu_node",)}
RATIO_TARGET = 1.05        # /memx/models p99 over /queue p99
PROMPT_RATIO_TARGET = 1.10
MIN_P99_SAMPLES = 100      # fewer samples per p99 (per route, round and variant) leave the ratio unjudged
BENCH_PACK = '''
import time

import comfy.model_base
import comfy.model_management
import comfy.model_patcher


class MemxBenchLoader:
    _cache = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "m"}), "tensor_count": ("INT", {"default": 8}),
                             "tensor_numel": ("INT", {"default": 4096}), "leak": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"

    def load(self, name, tensor_count, tensor_numel, leak):
        mm = comfy.model_management
        module = comfy.model_base.BaseModel(tensor_count, tensor_numel)
        if leak:
            MemxBenchLoader._cache[name] = module
        patcher = comfy.model_patcher.ModelPatcher(module, load_device=mm.get_torch_device(),
                                                   offload_device=mm.unet_offload_device())
        mm.load_models_gpu([patcher])
        return (patcher,)


class MemxBusy:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "seconds": ("FLOAT", {"default": 0.3})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "spin"
    OUTPUT_NODE = True

    def spin(self, model, seconds):
        comfy.model_management.load_models_gpu([model])
        end, n = time.thread_time() + seconds, 0
        while time.thread_time() < end:   # CPU seconds of this thread: the same work whatever else runs
            n += 1
        return (n,)


NODE_CLASS_MAPPINGS = {"MemxBenchLoader": MemxBenchLoader, "MemxBusy": MemxBusy}
'''


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method, url, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Server:
    """The stand-in ComfyUI under ``python -m comfy_memx`` on a free loopback port."""

    def __init__(self, folder):
        nodes = os.path.join(folder, "custom_nodes")
        main_py = common.write_stand_in_tree(os.path.join(folder, "ComfyUI"))
        os.makedirs(os.path.join(nodes, "memx_bench"))
        with open(os.path.join(nodes, "memx_bench", "__init__.py"), "w") as f:
            f.write(BENCH_PACK)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
        env.update(FAKE_COMFY_CUSTOM_NODE_DIRS=nodes, PYTHONUNBUFFERED="1", COMFY_MEMX_LEAK_MODE="report",
                   PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
        self.log = open(os.path.join(folder, "server.log"), "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "comfy_memx", main_py, "--cpu", "--listen",
                                         "127.0.0.1", "--port", str(self.port)], stdout=self.log,
                                        stderr=subprocess.STDOUT, env=env, cwd=folder)
        for _ in range(1200):
            try:
                if http("GET", self.url + "/system_stats", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError("the stand-in server did not start; see " + self.log.name)

    def prompt(self, index, busy_s):
        """Run one prompt and return its seconds (queued to done)."""
        prompt = {"1": {"class_type": "MemxBenchLoader", "inputs": {"name": f"m{index % 3}", "tensor_count": 8,
                                                                    "tensor_numel": 4096, "leak": index % 3 == 0}},
                  "3": {"class_type": "MemxBusy", "inputs": {"model": ["1", 0],
                                                             "seconds": busy_s + index * 1e-9}}}  # never cached
        started = time.monotonic()
        status, raw = http("POST", self.url + "/prompt", {"prompt": prompt})
        assert status == 200, raw
        prompt_id = json.loads(raw)["prompt_id"]
        for _ in range(20000):
            status, raw = http("GET", f"{self.url}/history/{prompt_id}")
            if prompt_id in json.loads(raw):
                return time.monotonic() - started
            time.sleep(0.01)
        raise RuntimeError(f"prompt {prompt_id} did not finish")

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def percentile(values, share):
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, int(round(share * (len(ordered) - 1)))))]


def one_load(server, variant, requests, clients, busy_s, seed):
    """Prompts back to back while ``requests`` mixed requests of ``variant`` are sent; returns the timings."""
    rng = random.Random(seed)
    kinds = [kind for kind, weight in MIX[variant] for _ in range(weight)]
    plan = [rng.choice(kinds) for _ in range(requests)]
    lock = threading.Lock()
    models_s, queue_s, prompt_s, statuses = [], [], [], {}
    done = threading.Event()

    def target():
        status, raw = http("GET", server.url + "/memx/models")
        rows = json.loads(raw) if status == 200 else []
        leaked = [row for row in rows if row["state"] == "leaked"] or rows   # a leak lives through the frees
        return quote(leaked[0]["model_id"], safe="") if leaked else "none"

    model = [target()]

    def client():
        while True:
            with lock:
                if not plan:
                    return
                kind = plan.pop()
            started = time.monotonic()
            if kind == "models":
                status, _ = http("GET", server.url + "/memx/models")
            elif kind == "queue":
                status, _ = http("GET", server.url + "/queue")
            elif kind == "metrics":
                status, _ = http("GET", server.url + "/memx/metrics")
            elif kind == "free":
                status, _ = http("POST", server.url + "/memx/free?timeout=0", {"unload_models": True})
            else:
                status, _ = http("POST", f"{server.url}/memx/models/{model[0]}/search")
            elapsed = time.monotonic() - started
            if kind == "search" and status == 404:
                model[0] = target()   # freed meanwhile: search a live one next time
            with lock:
                statuses[(kind, status)] = statuses.get((kind, status), 0) + 1
                if kind == "models":
                    models_s.append(elapsed)
                elif kind == "queue":
                    queue_s.append(elapsed)

    def prompts():
        index = 0
        while not done.is_set() or index < 2:
            prompt_s.append(server.prompt(index, busy_s))
            index += 1

    prompter = threading.Thread(target=prompts)
    prompter.start()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    prompter.join()
    return {"models_s": models_s, "queue_s": queue_s, "prompt_s": prompt_s,
            "statuses": {f"{kind} {status}": count for (kind, status), count in sorted(statuses.items())}}


def run(requests=2000, clients=8, rounds=2, busy_s=0.3, cpu_node="both"):
    """Measure every variant of every load of ``cpu_node`` (``both``, ``on``, ``off``) ``rounds`` times, alternating
    the order, on one server; returns the records (:func:`records_of`)."""
    loads = CPU_NODE_CHOICES[cpu_node]
    folder = tempfile.mkdtemp(prefix="memx-exposed-")
    server = Server(folder)
    results = {(load, variant): [] for load in loads for variant in MIX}
    try:
        for index in range(2):  # warm-up: models exist, a leak to search
            server.prompt(index * 3, 0.01)
        for round_index in range(rounds):
            order = [(load, variant) for load in loads for variant in MIX]
            for load, variant in order if round_index % 2 == 0 else order[::-1]:
                busy = busy_s if load == "cpu_node" else 0.0
                results[load, variant].append(one_load(server, variant, requests, clients, busy, seed=round_index))
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return records_of(results, requests=requests, clients=clients, busy_s=busy_s)


def records_of(results, **labels):
    """The records of ``results`` (``{(load, variant): [one_load's timings per round]}``): per load and variant the
    p50/p99 seconds of both routes, the judged ratio of their p99s (:data:`RATIO_TARGET`), the median prompt latency
    and the statuses; per load the prompt-latency ratios with over without searches (judged under the CPU-bound node:
    :data:`PROMPT_RATIO_TARGET`)."""
    records = []
    for (load, variant), runs in results.items():
        records += _route_records(runs, load=load, variant=variant, **labels)
    for load in dict.fromkeys(load for load, _variant in results):
        with_runs, without_runs = results.get((load, "searches")), results.get((load, "no_searches"))
        if not with_runs or not without_runs:
            continue
        for name, share in (("median", 0.5), ("p90", 0.9)):
            with_s = [percentile(r["prompt_s"], share) for r in with_runs]
            without = [percentile(r["prompt_s"], share) for r in without_runs]
            record = common.ratio_record(CASE, f"prompt_{name}_ratio", with_s, without, load=load,
                                         busy_s=labels.get("busy_s") if load == "cpu_node" else 0.0)
            if load == "cpu_node":   # without the node a prompt is a few ms: its ratio is information only
                record["target_max"] = PROMPT_RATIO_TARGET
            records.append(common.judge(record))
    return records


def _route_records(runs, **labels):
    """One load and variant: p50/p99 of ``/memx/models`` and ``/queue``, their p99 ratio (judged), prompts."""
    records = []
    samples = min(min(len(r["models_s"]), len(r["queue_s"])) for r in runs)
    for route, key in (("models", "models_s"), ("comfyui_queue", "queue_s")):
        for name, share in (("p50", 0.50), ("p99", 0.99)):
            records.append(common.seconds_record(CASE, f"{route}_{name}_s", [percentile(r[key], share) for r in runs],
                                                 **labels))
    ratio = common.ratio_record(CASE, "models_p99_over_queue_p99", [percentile(r["models_s"], 0.99) for r in runs],
                                [percentile(r["queue_s"], 0.99) for r in runs], p99_samples=samples, **labels)
    ratio["target_max"] = RATIO_TARGET
    common.judge(ratio)
    if samples < MIN_P99_SAMPLES:
        ratio["met"] = None
        ratio["why"] = f"fewer than {MIN_P99_SAMPLES} samples per p99 in a round: raise --requests"
    records.append(ratio)
    records.append(common.seconds_record(CASE, "prompt_median_s", [statistics.median(r["prompt_s"]) for r in runs],
                                         **labels))
    records.append(common.record(CASE, "answers", None, "count", **labels,
                                 per_round={"statuses": [r["statuses"] for r in runs],
                                            "prompts": [len(r["prompt_s"]) for r in runs]}))
    return records


def main(argv=None):
    """Entry point: run, print the table, write the JSON records."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy-s", type=float, default=0.3, help="CPU seconds of the CPU-bound node per prompt")
    parser.add_argument("--cpu-node", choices=sorted(CPU_NODE_CHOICES), default="both",
                        help="run the load with the CPU-bound node (on), without it (off) or both (default)")
    parser.add_argument("--json", metavar="OUT")
    args = parser.parse_args(argv)
    records = run(args.requests, args.clients, args.rounds, args.busy_s, args.cpu_node)
    print(common.format_table(records))
    path = args.json or os.path.join(common.RESULTS_DIR, time.strftime("exposed-%Y%m%d-%H%M%S.json"))
    common.write_json(records, path)
    print(f"records written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
