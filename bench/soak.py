"""Soak comfy_memx inside a real ComfyUI server next to the same ComfyUI without it.

::

    python -m bench.soak --comfyui PATH [--python PY] [--prompts N] [--leak-mode strict|report|off] [--check]
                         [--json OUT] [--checkpoint FILE] [--port-base P] [--timeout S] [--no-plain]
                         [--work-dir DIR] [--keep]

Standard library only (it imports ``tests/real_comfy/drive.py`` for starting, driving and stopping servers); the
servers run under ``--python``, an interpreter with the tree's requirements that can import comfy_memx (CI
installs the wheel there; for a checkout, ``pip install --no-deps -e .`` into it or put it on ``PYTHONPATH``).

What one run does:

1. makes two ComfyUI base folders (``--base-directory``) in a work folder: each with ``custom_nodes/`` holding a
   copy of the leaking pack ``tests/real_comfy/memx_soak_nodes``, and ``models/checkpoints/`` holding a link to the
   random-weight SD1.5 checkpoint (``--checkpoint``, or built once by ``tests/real_comfy/make_checkpoint.py``
   with the tree's own classes into a cache folder: ``$COMFY_MEMX_SOAK_CACHE``, else ``~/.cache/comfy_memx-soak``);
2. starts the tree twice on 127.0.0.1, ``--cpu``, at the same time: ``memx`` (``python -m comfy_memx main.py``,
   leak mode ``--leak-mode``, an event log) and ``plain`` (``python main.py``, no comfy_memx);
3. runs the same workload on both, prompt by prompt, one server at a time, alternating which goes first
   (memx then plain for even prompts, plain then memx for odd ones, so that order effects cancel): prompt ``i``
   is ComfyUI's default text-to-image workflow (``tests/real_comfy/workflows/default_t2i.json``, 64x64, 1 step)
   with seed ``i``; every odd prompt also runs one of the pack's leaking loaders into its sampler (six slots:
   three class-level cache, three hook registry; the slot's model is rebuilt ``--generations`` times over the run,
   which releases the previous one). The pack's nodes are absent from the next prompt, so ComfyUI's cache drops
   their patcher and ComfyUI's own ``cleanup_models_gc`` reports the module as a leak (about six leaked models);
4. meanwhile a poller per server GETs ``/memx/models`` and ``/metrics`` every ``--poll-interval`` seconds, and
   every ``--free-every`` prompts ``POST /memx/free`` (memx; ComfyUI's ``POST /free`` with the same body on plain)
   is sent while that server's prompt runs; the server's VmRSS/RssAnon (``/proc/<pid>/status``) are sampled
   every second and after every prompt;
5. at the end: ``POST /memx/free`` (plain: ``/free``), then the pack's census prompt on both servers (from inside
   the server: which pack models are alive, ComfyUI ModelPatcher/BaseModel counts), then GET ``/memx/models``;
   then both servers are stopped (SIGINT, then SIGTERM, then SIGKILL; always, whatever happened).

Figures: prompt failures; tracebacks in the server log whose frames mention comfy_memx, and
``comfy_memx: internal error`` lines; median prompt latency of memx over plain (end to end as the client sees it:
``POST /prompt`` until ``/history`` shows the result, polled every 50 ms; also ComfyUI's own execution time from
the ``execution_start``/``execution_success`` timestamps of its history); RSS over time and RSS growth per 100
prompts (Theil-Sen slope of the after-prompt samples, the first ``--warmup`` fraction of the prompts left out;
growth caused by comfy_memx = memx slope - plain slope); the event log's size and validity (every line a JSON
object with ``event``, ``time``, ``pid``) and its events by type (``leak``, ``leak_seen``, ...); and "nothing kept
alive that ComfyUI freed": the final receipt's survivors are exactly the pack's six currently held models (mapped
through their owner prompt to the slot and generation that loaded them), no mid-run receipt lists anything else,
and the census of the memx server equals the plain server's.

Targets (issue 10, at 500 prompts with ``--leak-mode strict``): 0 failed prompts, 0 comfy_memx tracebacks (and
internal errors), a valid event log, nothing kept alive (hard targets); median latency <= 1.10x plain and RSS
growth caused by comfy_memx <= 1 MiB per 100 prompts (performance targets). ``--check`` makes the exit status 1
when a hard target is missed, or when a performance target is missed and ``--prompts`` >= 200 (shorter runs are too
noisy for 10 % and 1 MiB/100 prompts: their latency and RSS figures are reported, not checked). Exit status 2:
bad arguments, a tree without main.py, or an interpreter that cannot import comfy_memx.

``--no-plain`` runs the memx server alone (half the time, for CI smoke soaks): no latency or RSS comparison, and the
census must show no ComfyUI ModelPatcher or BaseModel alive after the final free. The summary table goes to stdout, the full report to ``--json`` (default ``bench/results/soak-<time>.json``). The
work folder (server logs, event log, outputs) is removed at the end unless ``--keep`` or the run missed a hard
target; its path is in the report.
"""

import argparse
import copy
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REAL_COMFY = os.path.join(ROOT, "tests", "real_comfy")
PACK_NAME = "memx_soak_nodes"
PACK_SOURCE = os.path.join(REAL_COMFY, PACK_NAME)
WORKFLOW_PATH = os.path.join(REAL_COMFY, "workflows", "default_t2i.json")
CHECKPOINT_NAME = "memx_sd15_random.safetensors"
NET_CLASS_NAME = "MemxSoakNet"
MIB = 1024 ** 2

LEAK_MODES = ("strict", "report", "off")
WORKLOAD_REUSE, WORKLOAD_NEW_LEAKS = "reuse", "new-leaks"
WORKLOADS = (WORKLOAD_REUSE, WORKLOAD_NEW_LEAKS)
SERVERS = ("memx", "plain")
FREE_ALL = {"unload_models": True, "free_memory": True}
SLOTS = (("s0", "MemxSoakCachedLoader"), ("s1", "MemxSoakCachedLoader"), ("s2", "MemxSoakCachedLoader"),
         ("s3", "MemxSoakHookedLoader"), ("s4", "MemxSoakHookedLoader"), ("s5", "MemxSoakHookedLoader"))
PACK_LOADER_ID, PACK_SAMPLER_ID, CENSUS_ID = "101", "102", "901"
SAMPLER_NODE_ID = "3"
LATENCY_TARGET = 1.10
RSS_TARGET_MIB_PER_100 = 1.0
PERF_CHECK_MIN_PROMPTS = 200
HISTORY_POLL_S = 0.05
METRICS_UNAVAILABLE = 501
FINAL_RESERVE_S = 180.0   # of --timeout, kept for the final free, the census and stopping the servers

_drive = None


def drive():
    """``tests/real_comfy/drive.py``, imported once under a private name (it is not a package)."""
    global _drive
    if _drive is None:
        spec = importlib.util.spec_from_file_location("memx_soak_drive", os.path.join(REAL_COMFY, "drive.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _drive = module
    return _drive


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text):
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _port(text):
    value = int(text)
    if not 1024 <= value <= 65534:
        raise argparse.ArgumentTypeError(f"must be between 1024 and 65534 (two ports are used), got {value}")
    return value


def _fraction(text):
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 0 and < 1, got {text}")
    return value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="bench/soak.py",
        description="Soak comfy_memx in a real ComfyUI server against the same ComfyUI without it.")
    parser.add_argument("--comfyui", required=True, metavar="PATH", help="ComfyUI tree (the folder with main.py)")
    parser.add_argument("--python", default=sys.executable, metavar="PY",
                        help="interpreter that runs ComfyUI and can import comfy_memx (default: this one)")
    parser.add_argument("--prompts", type=_positive_int, default=500, metavar="N", help="prompts per server (500)")
    parser.add_argument("--leak-mode", choices=LEAK_MODES, default="strict", help="comfy_memx leak mode (strict)")
    parser.add_argument("--workload", choices=WORKLOADS, default=WORKLOAD_REUSE,
                        help="reuse: six slots keep leaking the same few models (default); new-leaks: every prompt "
                             "leaks a model never seen before (the cost of strict mode per new leak)")
    parser.add_argument("--check", action="store_true",
                        help="exit status 1 when a hard target is missed (performance targets too at >= "
                             f"{PERF_CHECK_MIN_PROMPTS} prompts)")
    parser.add_argument("--json", metavar="OUT", help="report file (default bench/results/soak-<time>.json)")
    parser.add_argument("--checkpoint", metavar="FILE", help="SD1.5 checkpoint (default: built once into a cache)")
    parser.add_argument("--port-base", type=_port, metavar="P", help="memx on P, plain on P+1 (default: free ports)")
    parser.add_argument("--timeout", type=_positive_float, metavar="S",
                        help="bound on the whole run in seconds, stopping the servers included (default 900 + 30 "
                             "per prompt); prompts stop 180 s before it to leave time for the final checks")
    parser.add_argument("--prompt-timeout", type=_positive_float, default=300.0, metavar="S")
    parser.add_argument("--boot-timeout", type=_positive_float, default=240.0, metavar="S")
    parser.add_argument("--poll-interval", type=_positive_float, default=2.0, metavar="S",
                        help="seconds between GET /memx/models + /metrics polls of each server (2)")
    parser.add_argument("--free-every", type=_positive_int, default=10, metavar="K",
                        help="POST /memx/free (plain: /free) while every K-th prompt runs (10)")
    parser.add_argument("--generations", type=_positive_int, default=3, metavar="G",
                        help="times each slot's leaked model is built over the run; each new one releases the "
                             "previous (3)")
    parser.add_argument("--warmup", type=_fraction, default=0.2, metavar="F",
                        help="fraction of the prompts left out of the RSS growth fit (0.2)")
    parser.add_argument("--no-plain", action="store_true",
                        help="run only the comfy_memx server (half the time; no latency or RSS comparison, the census "
                             "is checked against absolute expectations): for short CI smoke soaks")
    parser.add_argument("--work-dir", metavar="DIR", help="work folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, event log) at the end")
    return parser


def parse_args(argv=None):
    """Parse and cross-check the command line (argparse exits with status 2 on an error)."""
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.timeout is None:
        options.timeout = 900.0 + 30.0 * options.prompts
    if options.checkpoint is not None and not os.path.isfile(options.checkpoint):
        parser.error(f"--checkpoint {options.checkpoint}: no such file")
    if not os.path.isfile(os.path.join(options.comfyui, "main.py")):
        parser.error(f"--comfyui {options.comfyui}: no main.py there (not a ComfyUI tree)")
    return options


# ---------------------------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------------------------

def load_workflow(path=WORKFLOW_PATH):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def slot_name(slot, generation):
    return f"soak-{slot}-g{generation}"


def build_workload(prompts, workflow, generations=3, slots=SLOTS, workload=WORKLOAD_REUSE):
    """The prompts of a run, in order: dicts with ``index``, ``kind`` ("t2i" or "t2i+pack"), ``seed``, ``prompt``,
    and for pack prompts ``slot``, ``loader``, ``name``, ``generation``.

    Prompt ``i`` is ``workflow`` with the KSampler seed set to ``i``.  ``workload`` ``reuse``: odd prompts add a
    pack loader (cycling through ``slots``) and a sampler on its MODEL, under node ids the workflow does not use;
    the slot's model name changes ``generations`` times over the pack prompts (at even fractions of them), so a new
    model replaces the slot's old one: the same few models keep leaking.  ``new-leaks``: every prompt adds the
    class-cache loader with a slot of its own (the Qwen-Image resolution-keyed cache), so every prompt leaks a
    model never seen before and strict mode investigates a new leak in every prompt.  The same list is run on both
    servers.
    """
    if workload == WORKLOAD_NEW_LEAKS:
        return _new_leak_workload(prompts, workflow)
    pack_total = prompts // 2
    items = []
    for index in range(prompts):
        prompt = copy.deepcopy(workflow)
        prompt[SAMPLER_NODE_ID]["inputs"]["seed"] = index
        item = {"index": index, "kind": "t2i", "seed": index, "prompt": prompt}
        if index % 2 == 1:
            pack_index = index // 2
            slot, loader = slots[pack_index % len(slots)]
            generation = min(generations - 1, pack_index * generations // max(1, pack_total))
            name = slot_name(slot, generation)
            prompt[PACK_LOADER_ID] = {"class_type": loader,
                                      "inputs": {"slot": slot, "name": name, "width": 256, "depth": 4}}
            prompt[PACK_SAMPLER_ID] = {"class_type": "MemxSoakSampler",
                                       "inputs": {"model": [PACK_LOADER_ID, 0], "seed": index}}
            item.update(kind="t2i+pack", slot=slot, loader=loader, name=name, generation=generation)
        items.append(item)
    return items


def _new_leak_workload(prompts, workflow):
    items = []
    for index in range(prompts):
        prompt = copy.deepcopy(workflow)
        prompt[SAMPLER_NODE_ID]["inputs"]["seed"] = index
        slot, loader = f"n{index}", "MemxSoakCachedLoader"
        name = slot_name(slot, 0)
        prompt[PACK_LOADER_ID] = {"class_type": loader, "inputs": {"slot": slot, "name": name, "width": 256,
                                                                   "depth": 4}}
        prompt[PACK_SAMPLER_ID] = {"class_type": "MemxSoakSampler", "inputs": {"model": [PACK_LOADER_ID, 0],
                                                                              "seed": index}}
        items.append({"index": index, "kind": "t2i+pack", "seed": index, "prompt": prompt, "slot": slot,
                      "loader": loader, "name": name, "generation": 0})
    return items


def census_prompt(nonce):
    return {CENSUS_ID: {"class_type": "MemxSoakCensus", "inputs": {"nonce": nonce}}}


def expected_held(workload):
    """``{slot: name}`` of the models the pack holds after the whole workload ran (the last name per slot)."""
    held = {}
    for item in workload:
        if "slot" in item:
            held[item["slot"]] = item["name"]
    return held


# ---------------------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------------------

def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def median_ratio(numerator, denominator):
    """median(numerator) / median(denominator), or None when either is empty or the denominator's median is 0."""
    top, bottom = median_or_none(numerator), median_or_none(denominator)
    if top is None or not bottom:
        return None
    return top / bottom


def paired_median_ratio(numerator, denominator):
    """Median of the per-pair ratios ``numerator[i] / denominator[i]`` (pairs with a missing or zero value skipped)."""
    ratios = [a / b for a, b in zip(numerator, denominator) if a is not None and b]
    return statistics.median(ratios) if ratios else None


def theil_sen_slope(points):
    """Median of the slopes between every two points with different x (robust to outliers); None for < 2 xs."""
    points = sorted(points)
    slopes = []
    for i in range(len(points)):
        x1, y1 = points[i]
        for j in range(i + 1, len(points)):
            x2, y2 = points[j]
            if x2 != x1:
                slopes.append((y2 - y1) / (x2 - x1))
    return statistics.median(slopes) if slopes else None


def thin(points, limit=600):
    """Every k-th point so that at most ``limit`` remain (the last one always kept)."""
    if len(points) <= limit:
        return list(points)
    step = math.ceil(len(points) / limit)
    kept = list(points[::step])
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept


def rss_growth_per_100(samples, prompts, warmup=0.2):
    """RSS growth in MiB per 100 prompts from ``(prompt_index, bytes)`` after-prompt samples.

    The first ``warmup`` fraction of the prompts (at least 1 prompt) is left out: first loads and allocator warm-up
    are not growth. Returns None with fewer than 3 samples left. The slope is Theil-Sen over at most 600 evenly
    spread samples.
    """
    start = max(1, int(math.ceil(prompts * warmup)))
    kept = [(x, y) for x, y in samples if x >= start and y is not None]
    if len(kept) < 3:
        return None
    slope = theil_sen_slope(thin(kept))
    return None if slope is None else slope * 100 / MIB


def describe(values):
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "median": statistics.median(values), "min": ordered[0], "max": ordered[-1],
            "p90": ordered[min(len(ordered) - 1, int(math.ceil(0.9 * len(ordered))) - 1)],
            "mean": statistics.fmean(values)}


# ---------------------------------------------------------------------------------------------------------------
# Server log and event log
# ---------------------------------------------------------------------------------------------------------------

TRACEBACK_START = "Traceback (most recent call last):"
INTERNAL_ERROR = "comfy_memx: internal error"
LEAK_WARNING_TEXT = "WARNING, memory leak with model"
MEMX_LEAK_TEXT = "comfy_memx: leaked model"
_LOG_PREFIX = re.compile(r"^(\[[^\]]*\]\s*)+")
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
_VERSION = re.compile(r"comfy_memx (\S+) active")


def clean_line(line):
    """A log line without ANSI colours and without ComfyUI's ``[LEVEL]``/timestamp prefixes."""
    return _LOG_PREFIX.sub("", drive().strip_ansi(line).rstrip("\r\n"))


def find_tracebacks(text):
    """The Python tracebacks in a log: a list of blocks (lists of clean lines), each from its
    ``Traceback (most recent call last):`` line through its frames to the exception line(s)."""
    blocks = []
    current = None
    for raw in text.splitlines():
        line = clean_line(raw)
        if TRACEBACK_START in line:
            if current:
                blocks.append(current)
            current = [line.strip()]
            continue
        if current is None:
            continue
        if line.startswith((" ", "\t")) or not line.strip():
            current.append(line)
            continue
        # the exception line ends the block; chained tracebacks start a new block with the next Traceback line
        current.append(line)
        blocks.append(current)
        current = None
    if current:
        blocks.append(current)
    return blocks


def mentions_comfy_memx(block):
    """Whether a traceback block has a frame in comfy_memx's code (or names comfy_memx in its exception)."""
    for line in block:
        frame = _FRAME.match(line)
        if frame and re.search(r"(^|[/\\])comfy_memx([/\\]|$)", frame.group(1)):
            return True
    return bool(block) and "comfy_memx" in block[-1]


def scan_log(text):
    """Counts and lines of interest in one server log."""
    tracebacks = find_tracebacks(text)
    memx_tracebacks = [block for block in tracebacks if mentions_comfy_memx(block)]
    lines = [clean_line(line) for line in text.splitlines()]
    version = next((m.group(1) for m in map(_VERSION.search, lines) if m), None)
    return {
        "bytes": len(text.encode("utf-8", "replace")),
        "tracebacks": len(tracebacks),
        "comfy_memx_tracebacks": len(memx_tracebacks),
        "comfy_memx_traceback_texts": ["\n".join(block)[-4000:] for block in memx_tracebacks[:5]],
        "other_traceback_texts": ["\n".join(block)[-2000:] for block in tracebacks if block not in memx_tracebacks][:3],
        "internal_errors": [line.strip() for line in lines if INTERNAL_ERROR in line][:20],
        "comfyui_leak_warnings": sum(LEAK_WARNING_TEXT in line for line in lines),
        "comfy_memx_leak_lines": sum(MEMX_LEAK_TEXT in line for line in lines),
        "comfy_memx_version": version,
    }


def validate_events(lines):
    """Check an event log given as an iterable of lines: every non-empty line must be a JSON object with a
    non-empty string ``event``, a number ``time`` and an int ``pid``. Returns counts, events by type and up to five
    invalid examples (``line``, ``error``)."""
    report = {"lines": 0, "bytes": 0, "valid": 0, "invalid": 0, "by_event": {}, "invalid_examples": [],
              "pids": []}
    pids = set()
    for number, line in enumerate(lines, 1):
        report["bytes"] += len(line.encode("utf-8", "replace")) if isinstance(line, str) else len(line)
        if isinstance(line, bytes):
            line = line.decode("utf-8", "replace")
        if not line.strip():
            continue
        report["lines"] += 1
        error = None
        try:
            event = json.loads(line)
        except ValueError as exc:
            event, error = None, f"not JSON: {exc}"
        if error is None and not isinstance(event, dict):
            error = "not a JSON object"
        elif error is None:
            if not isinstance(event.get("event"), str) or not event["event"]:
                error = "no event name"
            elif isinstance(event.get("time"), bool) or not isinstance(event.get("time"), (int, float)):
                error = "no numeric time"
            elif isinstance(event.get("pid"), bool) or not isinstance(event.get("pid"), int):
                error = "no int pid"
        if error is None:
            report["valid"] += 1
            report["by_event"][event["event"]] = report["by_event"].get(event["event"], 0) + 1
            pids.add(event["pid"])
        else:
            report["invalid"] += 1
            if len(report["invalid_examples"]) < 5:
                report["invalid_examples"].append({"line": number, "error": error, "text": line[:200]})
    report["pids"] = sorted(pids)
    return report


def validate_event_file(path):
    if not path or not os.path.exists(path):
        return {"path": path, "exists": False, "lines": 0, "bytes": 0, "valid": 0, "invalid": 0, "by_event": {},
                "invalid_examples": [], "pids": []}
    with open(path, "rb") as handle:
        report = validate_events(handle)
    report.update(path=path, exists=True)
    return report


# ---------------------------------------------------------------------------------------------------------------
# Receipts and census
# ---------------------------------------------------------------------------------------------------------------

def is_pack_model(survivor):
    owner = survivor.get("owner") or {}
    return survivor.get("model") == NET_CLASS_NAME and owner.get("package") == PACK_NAME


def unexpected_survivors(receipt):
    """Survivors of a /memx/free receipt that are not models of the leaking pack (ComfyUI freed them)."""
    survivors = receipt.get("survivors") if isinstance(receipt, dict) else None
    return [s for s in survivors or [] if not is_pack_model(s)]


def check_final_survivors(receipt, prompt_items, held):
    """Compare the final receipt's survivors with the pack's held models.

    ``prompt_items`` maps the memx server's prompt ids to workload items; ``held`` is ``{slot: name}``. Each survivor
    is mapped through its owner's prompt to the (slot, name) that loaded it. Returns ``ok`` (exactly the held models
    survive, nothing else), and the ``unexpected`` / ``missing`` ones.
    """
    survivors = receipt.get("survivors") if isinstance(receipt, dict) else None
    if survivors is None:
        return {"ok": False, "error": "no survivors list in the receipt", "unexpected": [], "missing": sorted(held)}
    found, unexpected = {}, []
    for survivor in survivors:
        owner = survivor.get("owner") or {}
        item = prompt_items.get(owner.get("prompt_id"))
        label = {"model_id": survivor.get("model_id"), "model": survivor.get("model"), "reason": survivor.get("reason"),
                 "package": owner.get("package"), "prompt_index": item["index"] if item else None}
        if not is_pack_model(survivor) or item is None or "slot" not in item:
            unexpected.append(label)
            continue
        label.update(slot=item["slot"], name=item["name"])
        if held.get(item["slot"]) != item["name"] or item["slot"] in found:
            unexpected.append(label)
        else:
            found[item["slot"]] = label
    missing = sorted(set(held) - set(found))
    return {"ok": not unexpected and not missing, "survivors": len(survivors), "matched": sorted(found),
            "unexpected": unexpected, "missing": missing}


def census_from_history(entry):
    """The census record from a census prompt's history entry, or None."""
    for output in (entry or {}).get("outputs", {}).values():
        records = output.get("memx_soak_census") if isinstance(output, dict) else None
        if records:
            return records[0]
    return None


def compare_census(memx, plain, held, plain_ran=True):
    """Nothing kept alive by comfy_memx: memx's census shows exactly the held pack models and the same ComfyUI model
    object counts as the plain server's (without a plain server: no ModelPatcher or BaseModel alive at all)."""
    want = sorted(held.values())
    problems = []
    if not plain_ran and isinstance(memx, dict):
        for key in ("model_patchers", "base_models"):
            if memx.get(key) != 0:
                problems.append(f"{key}: memx {memx.get(key)} != 0 after the final free")
    for label, census in (("memx", memx), ("plain", plain)) if plain_ran else (("memx", memx),):
        if not isinstance(census, dict):
            problems.append(f"{label}: no census")
            continue
        if census.get("alive") != want:
            problems.append(f"{label}: pack models alive {census.get('alive')} != held {want}")
    if isinstance(memx, dict) and isinstance(plain, dict):
        for key in ("model_patchers", "base_models"):
            if memx.get(key) != plain.get(key):
                problems.append(f"{key}: memx {memx.get(key)} != plain {plain.get(key)}")
    return {"ok": not problems, "problems": problems, "memx": memx, "plain": plain, "held": want}


# ---------------------------------------------------------------------------------------------------------------
# Targets and the summary
# ---------------------------------------------------------------------------------------------------------------

def evaluate(report, check):
    """The targets of a report: list of dicts ``name``, ``value``, ``limit``, ``met`` (True/False/None),
    ``hard`` and ``checked`` (whether it decides the exit status under ``--check``)."""
    memx, plain = report["servers"]["memx"], report["servers"]["plain"]
    plain_ran = not report.get("no_plain")
    comparison = report["comparison"]
    perf_checked = check and report["prompts"] >= PERF_CHECK_MIN_PROMPTS and plain_ran
    targets = []

    def add(name, value, limit, met, hard, note=None):
        targets.append({"name": name, "value": value, "limit": limit, "met": met, "hard": hard,
                        "checked": check and (hard or perf_checked), "note": note})

    ran = memx.get("prompts_run", 0)
    add("all prompts ran", f"{ran}/{report['prompts']}", report["prompts"],
        ran == report["prompts"] and (not plain_ran or plain.get("prompts_run", 0) == report["prompts"])
        and not report.get("error"), True, report.get("error"))
    add("failed prompts (comfy_memx)", memx.get("failed", 0), 0, memx.get("failed", 0) == 0, True)
    if plain_ran:
        add("failed prompts (plain, workload sanity)", plain.get("failed", 0), 0, plain.get("failed", 0) == 0, True)
    log = memx.get("log", {})
    bad_log = log.get("comfy_memx_tracebacks", 0) + len(log.get("internal_errors", []))
    add("comfy_memx tracebacks + internal errors", bad_log, 0, bad_log == 0, True)
    events = memx.get("events", {})
    add("event log valid", f"{events.get('valid', 0)}/{events.get('lines', 0)} lines",
        "all", events.get("lines", 0) > 0 and events.get("invalid", 0) == 0, True)
    errors = memx.get("polls", {}).get("server_errors", 0)
    add("comfy_memx route errors (5xx)", errors, 0, errors == 0, True)
    alive = report.get("kept_alive", {})
    add("nothing kept alive that ComfyUI freed", alive.get("summary"), "survivors == held pack models",
        alive.get("ok"), True)
    note = None if perf_checked else (
        "not measured (--no-plain)" if not plain_ran else f"reported only (checked at >= {PERF_CHECK_MIN_PROMPTS} prompts)")
    ratio = comparison.get("latency_ratio")
    add("median latency memx / plain", None if ratio is None else round(ratio, 3), LATENCY_TARGET,
        None if ratio is None else ratio <= LATENCY_TARGET, False, note)
    growth = comparison.get("rss_growth_caused_mib_per_100")
    add("RSS growth caused by comfy_memx, MiB/100 prompts", None if growth is None else round(growth, 3),
        RSS_TARGET_MIB_PER_100, None if growth is None else growth <= RSS_TARGET_MIB_PER_100, False, note)
    return targets


def exit_status(targets):
    return 1 if any(t["checked"] and t["met"] is not True for t in targets) else 0


def _fmt(value, digits=3):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_summary(report):
    """The readable summary: one table of per-server figures, then the targets."""
    memx, plain = report["servers"]["memx"], report["servers"]["plain"]
    comparison = report["comparison"]
    rows = [("figure", "memx", "plain (not run)" if report.get("no_plain") else "plain", "memx/plain")]

    def lat(server, key):
        return server.get("latency", {}).get(key, {}).get("median")

    def rss(server, key):
        value = server.get("rss", {}).get(key)
        return None if value is None else value / MIB

    rows += [
        ("prompts run / failed", f"{memx.get('prompts_run', 0)} / {memx.get('failed', 0)}",
         f"{plain.get('prompts_run', 0)} / {plain.get('failed', 0)}", ""),
        ("median latency, end to end (s)", _fmt(lat(memx, "e2e")), _fmt(lat(plain, "e2e")),
         _fmt(comparison.get("latency_ratio"))),
        ("median ComfyUI execution time (s)", _fmt(lat(memx, "exec")), _fmt(lat(plain, "exec")),
         _fmt(comparison.get("exec_ratio"))),
        ("median latency t2i / t2i+pack (s)",
         f"{_fmt(lat(memx, 'e2e_t2i'))} / {_fmt(lat(memx, 'e2e_t2i+pack'))}",
         f"{_fmt(lat(plain, 'e2e_t2i'))} / {_fmt(lat(plain, 'e2e_t2i+pack'))}",
         f"{_fmt(comparison.get('latency_ratio_t2i'))} / {_fmt(comparison.get('latency_ratio_t2i+pack'))}"),
        ("p90 latency, end to end (s)", _fmt(memx.get("latency", {}).get("e2e", {}).get("p90")),
         _fmt(plain.get("latency", {}).get("e2e", {}).get("p90")), ""),
        ("VmRSS first / last / max (MiB)",
         f"{_fmt(rss(memx, 'first'), 0)} / {_fmt(rss(memx, 'last'), 0)} / {_fmt(rss(memx, 'max'), 0)}",
         f"{_fmt(rss(plain, 'first'), 0)} / {_fmt(rss(plain, 'last'), 0)} / {_fmt(rss(plain, 'max'), 0)}", ""),
        ("VmRSS growth (MiB/100 prompts)", _fmt(memx.get("rss", {}).get("growth_mib_per_100")),
         _fmt(plain.get("rss", {}).get("growth_mib_per_100")),
         "caused " + _fmt(comparison.get("rss_growth_caused_mib_per_100"))),
        ("RssAnon growth (MiB/100 prompts)", _fmt(memx.get("rss", {}).get("anon_growth_mib_per_100")),
         _fmt(plain.get("rss", {}).get("anon_growth_mib_per_100")),
         "caused " + _fmt(comparison.get("anon_growth_caused_mib_per_100"))),
        ("tracebacks (comfy_memx) / internal errors",
         f"{memx.get('log', {}).get('tracebacks', 0)} ({memx.get('log', {}).get('comfy_memx_tracebacks', 0)})"
         f" / {len(memx.get('log', {}).get('internal_errors', []))}",
         f"{plain.get('log', {}).get('tracebacks', 0)}", ""),
        ("ComfyUI leak warnings / comfy_memx leak lines",
         f"{memx.get('log', {}).get('comfyui_leak_warnings', 0)} / {memx.get('log', {}).get('comfy_memx_leak_lines', 0)}",
         f"{plain.get('log', {}).get('comfyui_leak_warnings', 0)} / -", ""),
    ]
    events = memx.get("events", {})
    by_event = events.get("by_event", {})
    rows.append(("event log lines / KiB / invalid",
                 f"{events.get('lines', 0)} / {events.get('bytes', 0) / 1024:.0f} / {events.get('invalid', 0)}", "-", ""))
    rows.append(("events leak / leak_seen / load / unload",
                 f"{by_event.get('leak', 0)} / {by_event.get('leak_seen', 0)} / {by_event.get('load', 0)} / "
                 f"{by_event.get('unload', 0)}", "-", ""))
    polls = memx.get("polls", {})
    rows.append(("polls /memx/models, /metrics (max s)",
                 f"{polls.get('models', {}).get('count', 0)} ({_fmt(polls.get('models', {}).get('max_s'))}), "
                 f"{polls.get('metrics', {}).get('count', 0)} ({_fmt(polls.get('metrics', {}).get('max_s'))})",
                 f"{plain.get('polls', {}).get('models', {}).get('count', 0)}, "
                 f"{plain.get('polls', {}).get('metrics', {}).get('count', 0)}", ""))
    frees = memx.get("frees", {})
    rows.append(("/memx/free during prompts: 200 / 202 / other",
                 f"{frees.get('status', {}).get('200', 0)} / {frees.get('status', {}).get('202', 0)} / "
                 f"{sum(v for k, v in frees.get('status', {}).items() if k not in ('200', '202'))}",
                 f"/free: {plain.get('frees', {}).get('count', 0)}", ""))
    widths = [max(len(str(row[i])) for row in rows) for i in range(4)]
    lines = [f"soak: ComfyUI {report.get('comfyui_version')} ({report['comfyui']}), comfy_memx "
             f"{memx.get('log', {}).get('comfy_memx_version')}, leak mode {report['leak_mode']}, "
             f"{report['prompts']} prompts per server, {_fmt(report.get('wall_s'), 0)} s, load average "
             f"{_fmt(report.get('loadavg_1m_during', {}).get('median'), 1)} (median of 1-min samples)"]
    for number, row in enumerate(rows):
        lines.append("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.append("targets:")
    for target in report["targets"]:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[target["met"]]
        note = f"  ({target['note']})" if target.get("note") else ""
        lines.append(f"  [{verdict:6}] {target['name']}: {_fmt(target['value'])} (target {target['limit']}){note}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Running servers
# ---------------------------------------------------------------------------------------------------------------

def read_proc_memory(pid):
    """``(VmRSS, RssAnon)`` of a process in bytes from /proc, or ``(None, None)``."""
    values = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "RssAnon"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None, None
    return values.get("VmRSS"), values.get("RssAnon")


def default_cache_dir():
    explicit = os.environ.get("COMFY_MEMX_SOAK_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "comfy_memx-soak")


def ensure_checkpoint(options, log, timeout=900.0):
    """The checkpoint to use: ``--checkpoint``, or the cached one, built with make_checkpoint.py when absent."""
    if options.checkpoint:
        return os.path.abspath(options.checkpoint), 0.0
    path = os.path.join(default_cache_dir(), CHECKPOINT_NAME)
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return path, 0.0
    log(f"building the random-weight checkpoint {path} with {options.python} (about 25 s) ...")
    started = time.monotonic()
    drive().ensure_checkpoint(options.python, os.path.abspath(options.comfyui), path, timeout=max(1.0, timeout))
    return path, time.monotonic() - started


def prepare_base(base, checkpoint):
    """A ComfyUI base folder: the pack in custom_nodes, the checkpoint linked into models/checkpoints."""
    for name in ("custom_nodes", "input", "output", "temp", "user", os.path.join("models", "checkpoints")):
        os.makedirs(os.path.join(base, name), exist_ok=True)
    shutil.copytree(PACK_SOURCE, os.path.join(base, "custom_nodes", PACK_NAME), dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    link = os.path.join(base, "models", "checkpoints", CHECKPOINT_NAME)
    if not os.path.lexists(link):
        try:
            os.symlink(checkpoint, link)
        except OSError:
            os.link(checkpoint, link)
    return ["--base-directory", base, "--database-url", "sqlite:///" + os.path.join(base, "user", "comfyui.db")]


def check_importable(python, module="comfy_memx"):
    """None when ``python`` can import ``module`` (with this environment's PYTHONPATH), else the error text."""
    env = drive().inherited_env()
    try:
        result = subprocess.run([python, "-c", f"import {module}"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=120, env=env, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    if result.returncode == 0:
        return None
    return result.stdout.strip()[-1000:] or f"exit status {result.returncode}"


class Server:
    """One soak server: its ComfyUI process, its prompt records, RSS samples, poll and free results."""

    def __init__(self, label, options, base, port, events_path=None):
        self.label = label
        self.base = base
        self.port = port
        self.events_path = events_path
        self.records = []
        self.rss_after = []        # (prompt_index, VmRSS, RssAnon) after each prompt
        self.rss_timeline = []     # (seconds since start, prompts done, VmRSS, RssAnon)
        self.prompt_ids = {}       # ComfyUI prompt id -> workload index
        self.polls = {"models": [], "metrics": []}
        self.frees = []
        self.free_thread = None
        self.free_skipped = 0
        self.lock = threading.Lock()
        d = drive()
        comfy_args = prepare_base(base, options.checkpoint_path)
        launcher = "module" if label == "memx" else "plain"
        argv, extra = d.server_command(options.python, os.path.abspath(options.comfyui), launcher, port, comfy_args)
        env = d.inherited_env()
        env.update(extra)
        env["PYTHONUNBUFFERED"] = "1"
        if label == "memx":
            env["COMFY_MEMX_LEAK_MODE"] = options.leak_mode
            env["COMFY_MEMX_EVENTS"] = events_path
        self.argv = argv
        self.log_path = os.path.join(base, "server.log")
        self.comfy = d.ComfyServer(argv, os.path.abspath(options.comfyui), env, self.log_path, port)
        self.url = self.comfy.base_url
        if events_path and os.path.exists(events_path):
            os.unlink(events_path)  # a reused --work-dir: validate this run's events only
        self.boot_s = None
        self.stats = None

    @property
    def pid(self):
        return self.comfy.process.pid if self.comfy.process is not None else None

    def start(self):
        self.started = time.monotonic()
        self.comfy.start()

    def wait_ready(self, timeout):
        self.stats = self.comfy.wait_ready(timeout)
        self.boot_s = time.monotonic() - self.started
        return self.stats is not None

    def sample(self, clock_start, prompts_done):
        vmrss, anon = read_proc_memory(self.pid)
        if vmrss is not None:
            with self.lock:
                self.rss_timeline.append((round(time.monotonic() - clock_start, 2), prompts_done, vmrss, anon))
        return vmrss, anon


def wait_history(server, prompt_id, deadline):
    """Poll /history/<id> every HISTORY_POLL_S until the prompt completed; return its entry or None."""
    d = drive()
    while time.monotonic() < deadline and server.comfy.alive():
        status, body = d.http_call("GET", f"{server.url}/history/{prompt_id}", timeout=10.0)
        if status == 200 and isinstance(body, dict) and prompt_id in body:
            entry = body[prompt_id]
            if entry.get("status", {}).get("completed") is not None or entry.get("outputs"):
                return entry
        time.sleep(HISTORY_POLL_S)
    return None


def exec_seconds(entry):
    """ComfyUI's own execution time of a prompt from its history messages' timestamps (ms), or None."""
    stamps = {}
    for message in (entry or {}).get("status", {}).get("messages", []):
        if isinstance(message, list) and len(message) == 2 and isinstance(message[1], dict):
            stamps[message[0]] = message[1].get("timestamp")
    start, end = stamps.get("execution_start"), stamps.get("execution_success")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return (end - start) / 1000.0
    return None


def run_prompt(server, item, deadline, on_submitted=None):
    """Submit one workload prompt and wait for it; returns its record (``ok``, ``e2e_s``, ``exec_s``, ...)."""
    d = drive()
    started = time.monotonic()
    status, body = d.submit_prompt(server.comfy, item["prompt"], client_id=f"memx-soak-{server.label}")
    prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
    record = {"index": item["index"], "kind": item["kind"], "prompt_id": prompt_id, "ok": False}
    if status != 200 or not prompt_id:
        record["error"] = f"POST /prompt answered {status}: {str(body)[:500]}"
        return record, None
    server.prompt_ids[prompt_id] = item["index"]
    if on_submitted is not None:
        on_submitted()
    entry = wait_history(server, prompt_id, deadline)
    record["e2e_s"] = time.monotonic() - started
    if entry is None:
        record["error"] = "no history entry before the deadline" + ("" if server.comfy.alive() else " (server exited)")
        return record, None
    run_status = entry.get("status", {})
    record["ok"] = run_status.get("status_str") == "success"
    record["exec_s"] = exec_seconds(entry)
    if not record["ok"]:
        errors = [m for m in run_status.get("messages", []) if m and m[0] == "execution_error"]
        record["error"] = json.dumps(errors, default=str)[:2000] or run_status.get("status_str")
    return record, entry


def poll_loop(server, stop, interval, metrics_path):
    """GET /memx/models and the metrics path every ``interval`` seconds until ``stop`` is set."""
    d = drive()
    while not stop.wait(interval):
        if not server.comfy.alive():
            return
        for key, path in (("models", "/memx/models"), ("metrics", metrics_path)):
            started = time.monotonic()
            status, body = d.http_call("GET", server.url + path, timeout=30.0)
            entry = {"status": status, "s": round(time.monotonic() - started, 4)}
            if key == "models" and status == 200 and isinstance(body, list):
                entry["rows"] = len(body)
                entry["leaked"] = sum(1 for row in body if isinstance(row, dict) and row.get("state") == "leaked")
            elif key == "metrics" and status == 200 and isinstance(body, str):
                entry["bytes"] = len(body)
            elif status == 0 or status >= 500:
                entry["error"] = str(body)[:300]
            with server.lock:
                server.polls[key].append(entry)


def post_free(server, index, memx):
    """POST /memx/free (memx) or ComfyUI's /free (plain) with both flags; records the answer."""
    d = drive()
    started = time.monotonic()
    if memx:
        status, body = d.http_call("POST", f"{server.url}/memx/free?timeout=60", dict(FREE_ALL), timeout=120.0)
    else:
        status, body = d.http_call("POST", f"{server.url}/free", dict(FREE_ALL), timeout=30.0)
    record = {"index": index, "status": status, "s": round(time.monotonic() - started, 3)}
    if memx and isinstance(body, dict):
        record.update(receipt_status=body.get("status"), waited_s=body.get("waited_s"),
                      survivors=[s.get("model_id") for s in body.get("survivors") or []],
                      unexpected=[{"model_id": s.get("model_id"), "model": s.get("model"), "reason": s.get("reason"),
                                   "owner": s.get("owner")} for s in unexpected_survivors(body)])
    elif status == 0 or status >= 400:
        record["error"] = str(body)[:300]
    with server.lock:
        server.frees.append(record)
    return body


def start_free(server, index, memx):
    """Send a free request in the background (at most one in flight per server; otherwise it is skipped)."""
    if server.free_thread is not None and server.free_thread.is_alive():
        server.free_skipped += 1
        return
    thread = threading.Thread(target=post_free, args=(server, index, memx), daemon=True,
                              name=f"soak-free-{server.label}")
    server.free_thread = thread
    thread.start()


def rss_loop(servers, stop, clock_start, progress, loadavg):
    while not stop.wait(1.0):
        loadavg.append(os.getloadavg()[0])
        for server in servers:
            if server.comfy.alive():
                server.sample(clock_start, progress[server.label])


def pick_metrics_path(server):
    """/metrics when it is comfy_memx's (or answers 501 for a missing prometheus_client), else /memx/metrics."""
    status, body = drive().http_call("GET", server.url + "/metrics", timeout=30.0)
    if status == 200 and isinstance(body, str) and "comfy_memx_" in body:
        return "/metrics"
    if status == METRICS_UNAVAILABLE:
        return "/metrics"
    return "/memx/metrics"


def summarize_server(server, prompts, warmup, memx):
    records = server.records
    ok = [r for r in records if r["ok"]]
    summary = {
        "command": server.argv, "port": server.port, "pid": server.pid,
        "boot_s": None if server.boot_s is None else round(server.boot_s, 2),
        "prompts_run": len(records), "failed": len(records) - len(ok),
        "failures": [{"index": r["index"], "error": r.get("error")} for r in records if not r["ok"]][:10],
        "latency": {"e2e": describe([r.get("e2e_s") for r in ok]), "exec": describe([r.get("exec_s") for r in ok])},
        "log_path": server.log_path,
    }
    for kind in ("t2i", "t2i+pack"):
        summary["latency"][f"e2e_{kind}"] = describe([r.get("e2e_s") for r in ok if r["kind"] == kind])
    after = server.rss_after
    timeline = server.rss_timeline
    rss_values = [v for _, v, _ in after if v is not None]
    summary["rss"] = {
        "first": rss_values[0] if rss_values else None, "last": rss_values[-1] if rss_values else None,
        "max": max((t[2] for t in timeline), default=None),
        "growth_mib_per_100": rss_growth_per_100([(i, v) for i, v, _ in after], prompts, warmup),
        "anon_growth_mib_per_100": rss_growth_per_100([(i, a) for i, _, a in after], prompts, warmup),
        "after_prompt": thin([list(t) for t in after], 600),
        "timeline": thin([list(t) for t in timeline], 600),
    }
    polls = {}
    server_errors = 0
    for key, entries in server.polls.items():
        statuses = {}
        for entry in entries:
            statuses[str(entry["status"])] = statuses.get(str(entry["status"]), 0) + 1
            if memx and entry["status"] >= 500 and entry["status"] != METRICS_UNAVAILABLE:
                server_errors += 1
        polls[key] = {"count": len(entries), "status": statuses,
                      "max_s": max((e["s"] for e in entries), default=None),
                      "median_s": median_or_none([e["s"] for e in entries])}
        if key == "models":
            rows = [e["rows"] for e in entries if "rows" in e]
            polls[key].update(rows_first=rows[0] if rows else None, rows_last=rows[-1] if rows else None,
                              rows_max=max(rows, default=None))
        if key == "metrics":
            sizes = [e["bytes"] for e in entries if "bytes" in e]
            polls[key].update(bytes_first=sizes[0] if sizes else None, bytes_last=sizes[-1] if sizes else None)
    free_statuses = {}
    for record in server.frees:
        free_statuses[str(record["status"])] = free_statuses.get(str(record["status"]), 0) + 1
        if memx and record["status"] >= 500:
            server_errors += 1
    polls["server_errors"] = server_errors
    summary["polls"] = polls
    summary["frees"] = {"count": len(server.frees), "skipped_in_flight": server.free_skipped,
                        "status": free_statuses, "records": server.frees[-60:]}
    if memx:
        summary["frees"]["unexpected_survivors"] = sum(len(r.get("unexpected", [])) for r in server.frees)
        waited = [r["waited_s"] for r in server.frees if isinstance(r.get("waited_s"), (int, float))]
        summary["frees"]["waited_s"] = describe(waited)
    return summary


def run_soak(options, log=print):
    """Run the whole soak; returns the report (the servers are always stopped)."""
    d = drive()
    wall_start = time.monotonic()
    deadline = wall_start + options.timeout
    report = {"tool": "bench/soak.py", "comfyui": os.path.abspath(options.comfyui), "python": options.python,
              "prompts": options.prompts, "leak_mode": options.leak_mode, "error": None,
              "no_plain": bool(options.no_plain),
              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": os.getloadavg(),
              "workload": {"workflow": os.path.relpath(WORKFLOW_PATH, ROOT), "pack": PACK_NAME,
                           "slots": [s for s, _ in SLOTS], "generations": options.generations,
                           "workload": getattr(options, "workload", WORKLOAD_REUSE),
                           "free_every": options.free_every, "poll_interval_s": options.poll_interval,
                           "order": "prompt i runs on both servers, one at a time: memx first for even i, plain "
                                    "first for odd i; pack nodes in odd prompts" if not options.no_plain
                                    else "memx server only (--no-plain); pack nodes in odd prompts"},
              "servers": {}, "comparison": {}}
    workload = build_workload(options.prompts, load_workflow(), options.generations,
                              workload=getattr(options, "workload", WORKLOAD_REUSE))
    held = expected_held(workload)
    work = options.work_dir or tempfile.mkdtemp(prefix="memx-soak-")
    os.makedirs(work, exist_ok=True)
    report["work_dir"] = work
    servers = []
    stop = threading.Event()
    threads = []
    labels = SERVERS[:1] if options.no_plain else SERVERS
    progress = {label: 0 for label in labels}
    loadavg = []
    finals = {}
    try:
        options.checkpoint_path, built_s = ensure_checkpoint(options, log, min(900.0, deadline - time.monotonic()))
        report["checkpoint"] = options.checkpoint_path
        report["checkpoint_build_s"] = round(built_s, 1)
        if options.port_base:
            ports = [options.port_base, options.port_base + 1]
        else:
            ports = [d.free_port(), d.free_port()]
            while ports[1] == ports[0]:
                ports[1] = d.free_port()
        for label, port in zip(labels, ports):
            base = os.path.join(work, label)
            events = os.path.join(base, "events.jsonl") if label == "memx" else None
            servers.append(Server(label, options, base, port, events))
        memx, plain = servers[0], (servers[1] if len(servers) > 1 else None)
        for server in servers:
            server.start()
        for server in servers:
            if not server.wait_ready(min(options.boot_timeout, max(1.0, deadline - time.monotonic()))):
                raise RuntimeError(f"{server.label} server did not answer /system_stats"
                                   + ("" if server.comfy.alive() else " (it exited)") + f"; log: {server.log_path}")
        report["comfyui_version"] = (memx.stats or {}).get("system", {}).get("comfyui_version")
        log("servers up: " + ", ".join(f"{s.label} {s.url} ({s.boot_s:.1f} s)" for s in servers)
            + f"; {options.prompts} prompts each")
        clock = time.monotonic()
        metrics_path = pick_metrics_path(memx)
        report["workload"]["metrics_path"] = metrics_path
        threads.append(threading.Thread(target=rss_loop, args=(servers, stop, clock, progress, loadavg), daemon=True))
        for server in servers:
            threads.append(threading.Thread(target=poll_loop, args=(server, stop, options.poll_interval, metrics_path),
                                            daemon=True))
        for thread in threads:
            thread.start()
        last_report = time.monotonic()
        for item in workload:
            if time.monotonic() >= deadline - FINAL_RESERVE_S:
                report["error"] = (f"--timeout {options.timeout:g} s reached after {item['index']} prompts "
                                   f"({FINAL_RESERVE_S:g} s of it are kept for the final checks)")
                break
            order = servers if item["index"] % 2 == 0 else servers[::-1]
            for server in order:
                free_now = (item["index"] + 1) % options.free_every == 0
                is_memx = server is memx
                hook = (lambda s=server, m=is_memx: start_free(s, item["index"], m)) if free_now else None
                record, _ = run_prompt(server, item, min(deadline - FINAL_RESERVE_S,
                                                         time.monotonic() + options.prompt_timeout), hook)
                server.records.append(record)
                progress[server.label] = item["index"] + 1
                vmrss, anon = server.sample(clock, item["index"] + 1)
                server.rss_after.append((item["index"], vmrss, anon))
                if not server.comfy.alive():
                    raise RuntimeError(f"{server.label} server exited during prompt {item['index']}; "
                                       f"log: {server.log_path}")
            if time.monotonic() - last_report > 60:
                last_report = time.monotonic()
                log(f"  {item['index'] + 1}/{options.prompts} prompts, {time.monotonic() - clock:.0f} s; "
                    + ", ".join(f"{s.label} {s.records[-1].get('e2e_s') or 0:.2f} s" for s in servers))
        stop.set()
        for server in servers:
            if server.free_thread is not None:
                server.free_thread.join(timeout=max(1.0, min(120.0, deadline - 150.0 - time.monotonic())))
        finals = final_checks(memx, plain, options, deadline)
    except (Exception, KeyboardInterrupt, SystemExit) as error:  # record it; the servers are still stopped below
        report["error"] = f"{type(error).__name__}: {error}"
        report["interrupted"] = not isinstance(error, Exception)
    finally:
        stop.set()
        for server in servers:
            try:
                report.setdefault("stops", {})[server.label] = {"exit_code": server.comfy.stop(),
                                                               "method": server.comfy.stop_method}
            except Exception as error:  # keep stopping the others
                report.setdefault("stops", {})[server.label] = {"error": repr(error)}
        for thread in threads:
            thread.join(timeout=5.0)
    report["wall_s"] = round(time.monotonic() - wall_start, 1)
    report["loadavg_end"] = os.getloadavg()
    report["loadavg_1m_during"] = describe(loadavg)
    for server in servers:
        summary = summarize_server(server, options.prompts, options.warmup, server.label == "memx")
        summary["log"] = scan_log(d.read_text(server.log_path))
        if server.label == "memx":
            summary["events"] = validate_event_file(server.events_path)
        summary["stop"] = report.get("stops", {}).get(server.label)
        report["servers"][server.label] = summary
    for label in SERVERS:
        report["servers"].setdefault(label, {})
    report["comparison"] = compare(servers)
    report["final"] = {key: value for key, value in finals.items() if key != "receipt"}
    report["final_receipt"] = finals.get("receipt")
    report["kept_alive"] = kept_alive_verdict(report, finals, workload, servers, held)
    return report


def final_checks(memx, plain, options, deadline):
    """End of the run: free everything, then census both servers and read /memx/models once more."""
    d = drive()
    finals = {}

    def left(reserve):
        return max(5.0, deadline - reserve - time.monotonic())

    wait = min(120.0, left(120.0))
    status, receipt = d.http_call("POST", f"{memx.url}/memx/free?timeout={wait:.0f}", dict(FREE_ALL),
                                  timeout=wait + 30.0)
    finals["free_status"] = status
    finals["receipt"] = receipt if isinstance(receipt, dict) else {"raw": str(receipt)[:2000]}
    if plain is not None:
        plain_status, _ = d.http_call("POST", f"{plain.url}/free", dict(FREE_ALL), timeout=30.0)
        finals["plain_free_status"] = plain_status
        time.sleep(3.0)  # plain's /free answers before its worker acts; memx's answered after
    nonce = options.prompts + 1
    for server in (memx, plain) if plain is not None else (memx,):
        item = {"index": nonce, "kind": "census", "prompt": census_prompt(nonce)}
        record, entry = run_prompt(server, item, time.monotonic() + min(120.0, left(60.0)))
        finals[f"census_{server.label}"] = census_from_history(entry) if record["ok"] else None
        if not record["ok"]:
            finals[f"census_{server.label}_error"] = record.get("error")
    status, rows = d.http_call("GET", f"{memx.url}/memx/models", timeout=30.0)
    if status == 200 and isinstance(rows, list):
        finals["models_after"] = [{"model_id": r.get("model_id"), "model": r.get("model"), "state": r.get("state"),
                                   "package": (r.get("owner") or {}).get("package")} for r in rows]
    else:
        finals["models_after_status"] = status
    return finals


def compare(servers):
    comparison = {}
    if len(servers) != 2:
        return comparison
    memx, plain = servers
    ok_pairs = [(a, b) for a, b in zip(memx.records, plain.records) if a["ok"] and b["ok"]]
    comparison["pairs"] = len(ok_pairs)
    comparison["latency_ratio"] = median_ratio([a.get("e2e_s") for a, _ in ok_pairs],
                                               [b.get("e2e_s") for _, b in ok_pairs])
    comparison["latency_ratio_paired"] = paired_median_ratio([a.get("e2e_s") for a, _ in ok_pairs],
                                                             [b.get("e2e_s") for _, b in ok_pairs])
    comparison["exec_ratio"] = median_ratio([a.get("exec_s") for a, _ in ok_pairs], [b.get("exec_s") for _, b in ok_pairs])
    for kind in ("t2i", "t2i+pack"):
        comparison[f"latency_ratio_{kind}"] = median_ratio(
            [a.get("e2e_s") for a, _ in ok_pairs if a["kind"] == kind],
            [b.get("e2e_s") for _, b in ok_pairs if b["kind"] == kind])
    return comparison


def kept_alive_verdict(report, finals, workload, servers, held):
    if not finals or not servers:
        return {"ok": False, "summary": "no final check (the run stopped early)"}
    memx = servers[0]
    items = {pid: workload[index] for pid, index in memx.prompt_ids.items() if index < len(workload)}
    survivors = check_final_survivors(finals.get("receipt"), items, held)
    census = compare_census(finals.get("census_memx"), finals.get("census_plain"), held, plain_ran=len(servers) > 1)
    midrun = report["servers"]["memx"].get("frees", {}).get("unexpected_survivors", 0)
    receipt_done = finals.get("free_status") == 200 and (finals.get("receipt") or {}).get("status") == "done"
    ok = survivors["ok"] and census["ok"] and midrun == 0 and receipt_done
    parts = [f"final survivors {survivors.get('survivors')} (held {len(held)}, unexpected "
             f"{len(survivors.get('unexpected', []))}, missing {len(survivors.get('missing', []))})",
             f"census {'equal' if census['ok'] else 'DIFFERS'}", f"mid-run unexpected {midrun}"]
    if not receipt_done:
        parts.append(f"final /memx/free {finals.get('free_status')} {(finals.get('receipt') or {}).get('status')}")
    return {"ok": ok, "summary": "; ".join(parts), "final_survivors": survivors, "census": census,
            "midrun_unexpected_survivors": midrun, "final_receipt_done": receipt_done}


def compare_rss(report):
    comparison = report["comparison"]
    memx, plain = report["servers"]["memx"], report["servers"]["plain"]
    for key, out in (("growth_mib_per_100", "rss_growth_caused_mib_per_100"),
                     ("anon_growth_mib_per_100", "anon_growth_caused_mib_per_100")):
        a, b = memx.get("rss", {}).get(key), plain.get("rss", {}).get(key)
        comparison[out] = None if a is None or b is None else a - b


def default_json_path():
    return os.path.join(HERE, "results", time.strftime("soak-%Y%m%d-%H%M%S.json"))


def main(argv=None):
    options = parse_args(argv)
    options.python = os.path.abspath(options.python) if os.sep in options.python else options.python
    problem = check_importable(options.python)
    if problem:
        print(f"soak: {options.python} cannot import comfy_memx (install it there: pip install --no-deps "
              f"{ROOT}, or set PYTHONPATH):\n{problem}", file=sys.stderr)
        return 2

    def on_term(signum, frame):
        raise SystemExit(f"soak: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, on_term)

    def log(message):
        print(message, flush=True)

    report = run_soak(options, log)
    compare_rss(report)
    report["targets"] = evaluate(report, options.check)
    report["check"] = options.check
    report["exit_status"] = 130 if report.get("interrupted") else exit_status(report["targets"])
    hard_missed = any(t["hard"] and t["met"] is not True for t in report["targets"])
    keep = bool(options.keep or hard_missed or options.work_dir)
    report["work_dir_kept"] = keep
    path = options.json or default_json_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1, default=str)
    print(format_summary(report))
    print(f"report: {path}" + (f"; logs kept in {report['work_dir']}" if keep else ""))
    if not keep:
        shutil.rmtree(report["work_dir"], ignore_errors=True)
    return report["exit_status"]


if __name__ == "__main__":
    sys.exit(main())
