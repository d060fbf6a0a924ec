"""Every GPU-only check of comfy_memx in one command, with one JSON verdict.

    python -m bench.gpu_check --comfyui path/to/ComfyUI [--python path/to/its/python] [--json OUT]

Meant for the first machine with an NVIDIA GPU and one of the ComfyUI trees (0.27.0 or newer, with its
requirements installed in ``--python``, default this interpreter).  Runs in under 8 minutes (each check has its
own time limit, and the whole run a deadline) and prints ONE JSON object: ``verdict`` "pass", "fail" or "skipped"
(with ``reason``), and ``checks``:

* ``pins_in_comfyui``: ``bench/pin_invariant.py --register real`` inside that ComfyUI: comfy_memx's cap in force in
  ``MAX_PINNED_MEMORY``, comfy_memx's books equal to ``TOTAL_PINNED_MEMORY`` and to the addresses really
  registered after every step, the cap never exceeded, most-recently-used victims, and no address unregistered
  and registered again within one ``load_models_gpu`` (T10), all under real ``cudaHostRegister``;
* ``transfers``: host<->device GB/s of a 1 GiB buffer from pinned and from pageable memory, and of a 1250-tensor
  pinned loop, against the best flat pinned copy of the same run (T9: pinned H2D >= 0.85 x best, loop >= 0.8 x
  best, D2H to pinned >= 3 x D2H to pageable);
* ``registration``: seconds per GiB of ``cudaHostRegister`` on touched memory (T9: <= 0.1 s/GiB).

A check that fails, crashes or times out is reported as such; the others still run.  Exit status: 0 for pass or
skipped (no CUDA: ``torch.cuda.is_available()`` is False in ``--python``), 1 for fail, 2 when it cannot run (a
bad argument, a tree that does not pin, an interpreter without torch).
Targets are those of ../shared/reference/performance-anchors.md (T9, T10).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEADLINE_SECONDS = 450           # the whole run, under the 8 minutes promised
LIMITS = {"probe": 120, "pins_in_comfyui": 240, "transfers": 150, "registration": 90}
GIB = 1024 ** 3
TARGETS = {"h2d_pinned_over_best": 0.85, "loop_pinned_over_best": 0.8, "d2h_pinned_over_pageable": 3.0,
           "register_seconds_per_gib": 0.1}
LOOP_TENSORS = 1250


# -- the command --------------------------------------------------------------------------------------------------

def parse_args(argv):
    """The command line (see the module docstring); ``--measure`` is internal (a child process)."""
    parser = argparse.ArgumentParser(description="comfy_memx's GPU checks, one JSON verdict")
    parser.add_argument("--comfyui", help="a ComfyUI tree (folder with main.py and comfy/), 0.27.0 or newer")
    parser.add_argument("--python", default=sys.executable, help="the interpreter with that tree's requirements")
    parser.add_argument("--json", help="also write the verdict to this file")
    parser.add_argument("--measure", choices=("probe", "transfers", "registration"), help=argparse.SUPPRESS)
    parser.add_argument("--bytes", type=int, default=GIB, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.measure is None and not options.comfyui:
        parser.error("--comfyui is required")
    return options


def main(argv=None):
    """Run the checks (or, with the internal ``--measure``, one measurement) and print the JSON verdict."""
    options = parse_args(argv)
    if options.measure is not None:
        return _measure_main(options)
    started = time.monotonic()
    verdict = {"tool": "bench/gpu_check.py", "comfyui": os.path.abspath(options.comfyui), "python": options.python,
               "targets": TARGETS, "checks": {}}
    problem = _tree_problem(verdict["comfyui"])
    if problem is None and not os.path.exists(options.python):
        problem = "--python %s does not exist" % options.python
    if problem is not None:
        verdict.update(verdict="error", reason=problem)
        return _finish(verdict, options, 2, started)
    probe = _child(options.python, ["--measure", "probe"], LIMITS["probe"])
    verdict["device"] = probe.get("result")
    if probe["status"] != "pass":
        verdict.update(verdict="error", reason="could not ask torch in %s about CUDA (%s)" %
                       (options.python, probe.get("error", probe["status"])))
        return _finish(verdict, options, 2, started)
    if not probe["result"].get("cuda"):
        verdict.update(verdict="skipped", reason="skipped: no CUDA (torch.cuda.is_available() is False in %s; "
                       "torch %s)" % (options.python, probe["result"].get("torch")))
        return _finish(verdict, options, 0, started)

    def remaining(limit):
        return max(1, min(limit, DEADLINE_SECONDS - (time.monotonic() - started)))

    verdict["checks"]["pins_in_comfyui"] = _pins_check(options, remaining(LIMITS["pins_in_comfyui"]))
    for name in ("transfers", "registration"):
        verdict["checks"][name] = _child(options.python, ["--measure", name], remaining(LIMITS[name]))
    failed = [name for name, check in verdict["checks"].items() if check["status"] != "pass"]
    verdict["verdict"] = "fail" if failed else "pass"
    if failed:
        verdict["reason"] = "failed: " + ", ".join(failed)
    return _finish(verdict, options, 1 if failed else 0, started)


def _tree_problem(tree):
    if not os.path.isdir(tree):
        return "--comfyui %s is not a folder" % tree
    if not os.path.exists(os.path.join(tree, "main.py")) or not os.path.isdir(os.path.join(tree, "comfy")):
        return "--comfyui %s is not a ComfyUI tree (no main.py and comfy/)" % tree
    if not os.path.exists(os.path.join(tree, "comfy", "pinned_memory.py")):
        return "--comfyui %s has no comfy/pinned_memory.py: it does not pin (ComfyUI before 0.27.0)" % tree
    return None


def _finish(verdict, options, status, started):
    verdict["seconds"] = round(time.monotonic() - started, 3)
    text = json.dumps(verdict, default=str)
    if options.json:
        with open(options.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return status


def _pins_check(options, limit):
    """bench/pin_invariant.py with real registration, in the tree's interpreter."""
    with tempfile.TemporaryDirectory(prefix="memx-gpu-check-") as folder:
        out = os.path.join(folder, "pins.json")
        command = [options.python, "-m", "bench.pin_invariant", "--comfyui", os.path.abspath(options.comfyui),
                   "--register", "real", "--json", out]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("COMFY_MEMX", None)
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=limit, env=env, cwd=folder)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "limit_seconds": limit}
        try:
            with open(out, encoding="utf-8") as f:
                result = json.load(f)
        except (OSError, ValueError) as exc:
            return {"status": "error", "error": "no verdict from pin_invariant.py (%s)" % exc,
                    "returncode": proc.returncode, "stderr": proc.stderr[-3000:]}
    summary = {key: result.get(key) for key in ("comfyui_version", "cap_bytes", "cap_applied", "subsets",
                                                 "register_seconds_per_gib", "register_failures", "error")}
    summary["checks"] = {name: check["ok"] for name, check in result.get("checks", {}).items()}
    summary["failures"] = {name: check["failures"] for name, check in result.get("checks", {}).items()
                           if not check["ok"]}
    summary["steps"] = [{key: step[key] for key in ("step", "total_pinned_memory", "memx", "registered",
                                                    "unregistered")} for step in result.get("steps", [])]
    ok = proc.returncode == 0 and result.get("ok") is True
    return dict(summary, status="pass" if ok else ("fail" if proc.returncode == 1 else "error"),
                returncode=proc.returncode, stderr=None if ok else proc.stderr[-3000:])


def _child(python, arguments, limit):
    """Run one measurement in ``python`` (this file with ``--measure``); its JSON becomes the check's record."""
    command = [python, "-m", "bench.gpu_check"] + arguments
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=limit, cwd=os.path.dirname(HERE))
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "limit_seconds": limit}
    except OSError as exc:
        return {"status": "error", "error": str(exc)}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"status": "error", "returncode": proc.returncode, "error": (proc.stderr or proc.stdout)[-3000:]}
    try:
        return json.loads(lines[-1])
    except ValueError as exc:
        return {"status": "error", "error": "unreadable output: %s" % exc}


# -- measurements (run in the ComfyUI interpreter) ----------------------------------------------------------------

def _measure_main(options):
    try:
        record = MEASUREMENTS[options.measure](options.bytes)
    except Exception as exc:  # reported, never raised: the parent goes on with the other checks
        import traceback
        record = {"status": "error", "error": "%s: %s" % (type(exc).__name__, exc),
                  "traceback": traceback.format_exc()[-3000:]}
    print(json.dumps(record, default=str))
    return 0


def measure_probe(_nbytes):
    """Whether torch sees a CUDA device, and which."""
    import torch
    result = {"torch": torch.__version__, "cuda": bool(torch.cuda.is_available())}
    if result["cuda"]:
        index = torch.cuda.current_device()
        free, total = torch.cuda.mem_get_info(index)
        result.update(name=torch.cuda.get_device_name(index), index=index, vram_free=free, vram_total=total,
                      cuda_version=torch.version.cuda)
    return {"status": "pass", "result": result}


def _timer(torch):
    def timed(action):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        action()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    return timed


def measure_transfers(nbytes, rounds=7):
    """GB/s of H2D and D2H copies of one buffer, pinned and pageable, and of a pinned per-tensor loop, in
    interleaved rounds; ratios against the best flat pinned H2D copy of the same run."""
    import torch
    free, _total = torch.cuda.mem_get_info()
    nbytes = int(min(nbytes, free // 4))
    nbytes -= nbytes % (LOOP_TENSORS * 1024)
    device = torch.device("cuda", torch.cuda.current_device())
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pinned.fill_(1)
    pageable.fill_(1)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    piece = nbytes // LOOP_TENSORS
    sources = [pinned[i * piece:(i + 1) * piece] for i in range(LOOP_TENSORS)]
    targets = [target[i * piece:(i + 1) * piece] for i in range(LOOP_TENSORS)]
    timed = _timer(torch)

    def loop():
        for source, destination in zip(sources, targets):
            destination.copy_(source, non_blocking=True)
    cases = {
        "h2d_pinned": lambda: target.copy_(pinned, non_blocking=True),
        "h2d_pageable": lambda: target.copy_(pageable),
        "h2d_pinned_loop": loop,
        "d2h_pinned": lambda: pinned.copy_(target, non_blocking=True),
        "d2h_pageable": lambda: pageable.copy_(target),
    }
    for action in cases.values():   # warm-up: first-touch and allocator effects out of the figures
        timed(action)
    seconds = {name: [] for name in cases}
    for _ in range(rounds):
        for name, action in cases.items():
            seconds[name].append(timed(action))
    rate = {name: [nbytes / t / 1e9 for t in values] for name, values in seconds.items()}
    median = {name: statistics.median(values) for name, values in rate.items()}
    best = max(rate["h2d_pinned"])
    ratios = {"h2d_pinned_over_best": median["h2d_pinned"] / best,
              "h2d_pageable_over_best": median["h2d_pageable"] / best,
              "loop_pinned_over_best": median["h2d_pinned_loop"] / best,
              "d2h_pinned_over_pageable": median["d2h_pinned"] / median["d2h_pageable"]}
    passed = (ratios["h2d_pinned_over_best"] >= TARGETS["h2d_pinned_over_best"]
              and ratios["loop_pinned_over_best"] >= TARGETS["loop_pinned_over_best"]
              and ratios["d2h_pinned_over_pageable"] >= TARGETS["d2h_pinned_over_pageable"])
    return {"status": "pass" if passed else "fail", "bytes": nbytes, "rounds": rounds,
            "gb_per_s_median": {k: round(v, 3) for k, v in median.items()},
            "gb_per_s_min": {k: round(min(v), 3) for k, v in rate.items()},
            "gb_per_s_max": {k: round(max(v), 3) for k, v in rate.items()},
            "best_flat_pinned_gb_per_s": round(best, 3), "ratios": {k: round(v, 4) for k, v in ratios.items()}}


def measure_registration(nbytes, rounds=3):
    """Seconds per GiB of ``cudaHostRegister`` (flags 0) on touched pageable memory, and of its unregister."""
    import torch
    cudart = torch.cuda.cudart()
    buffer = torch.empty(nbytes, dtype=torch.uint8)
    buffer.fill_(1)   # touched: registering untouched pages would also pay for faulting them in
    ptr = buffer.data_ptr()
    register, unregister, codes = [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        code = _as_int(cudart.cudaHostRegister(ptr, nbytes, 0))
        register.append(time.perf_counter() - started)
        codes.append(code)
        if code != 0:
            break
        started = time.perf_counter()
        codes.append(_as_int(cudart.cudaHostUnregister(ptr)))
        unregister.append(time.perf_counter() - started)
    if any(codes):
        return {"status": "error", "error": "cudaHostRegister/Unregister returned %s" % codes, "bytes": nbytes}
    per_gib = statistics.median(register) / (nbytes / GIB)
    return {"status": "pass" if per_gib <= TARGETS["register_seconds_per_gib"] else "fail", "bytes": nbytes,
            "register_seconds_per_gib": round(per_gib, 6),
            "unregister_seconds_per_gib": round(statistics.median(unregister) / (nbytes / GIB), 6),
            "register_seconds": [round(s, 6) for s in register]}


def _as_int(code):
    try:
        return int(code)
    except (TypeError, ValueError):
        return int(getattr(code, "value", 1))


MEASUREMENTS = {"probe": measure_probe, "transfers": measure_transfers, "registration": measure_registration}


if __name__ == "__main__":
    sys.exit(main())
