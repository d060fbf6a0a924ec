"""The soak's command line: its options (with the errors they give) and ``main``, which runs a soak and writes its
report."""

import argparse
import json
import math
import os
import shutil
import signal
import sys
import time

from bench.soak.config import (HERE, LATENCY_TARGET, LEAK_MODES, PERF_CHECK_MIN_PROMPTS, ROOT, WORKLOADS,
                               WORKLOAD_PACK_KEEPS, WORKLOAD_RELEASE, WORKLOAD_REUSE)
from bench.soak.keeps import run_keeps_soak
from bench.soak.keeps_verdict import analyse as analyse_keeps, evaluate_keeps, format_keeps_summary
from bench.soak.release import run_release_soak
from bench.soak.release_verdict import analyse, evaluate_release, format_release_summary
from bench.soak.verdict import compare_rss, evaluate, exit_status, format_summary
from bench.soak.servers import check_importable, run_soak

DEFAULT_PROMPTS = {WORKLOAD_RELEASE: 300, WORKLOAD_PACK_KEEPS: 100}


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


def _memx_setting(text):
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("COMFY_MEMX_") or name in ("COMFY_MEMX_RELEASE", "COMFY_MEMX_EVENTS"):
        raise argparse.ArgumentTypeError(f"expected COMFY_MEMX_<NAME>=VALUE (not COMFY_MEMX_RELEASE or "
                                         f"COMFY_MEMX_EVENTS, which the soak sets per server), got {text!r}")
    return name, value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak",
        description="Soak comfy_memx in a real ComfyUI server against the same ComfyUI without it.")
    parser.add_argument("--comfyui", required=True, metavar="PATH", help="ComfyUI tree (the folder with main.py)")
    parser.add_argument("--python", default=sys.executable, metavar="PY",
                        help="interpreter that runs ComfyUI and can import comfy_memx (default: this one)")
    parser.add_argument("--prompts", type=_positive_int, metavar="N",
                        help="prompts per server (500; 300 with --workload release, 100 with pack-keeps)")
    parser.add_argument("--leak-mode", choices=LEAK_MODES, default="strict", help="comfy_memx leak mode (strict)")
    parser.add_argument("--workload", choices=WORKLOADS, default=WORKLOAD_REUSE,
                        help="reuse: six slots keep leaking the same few models (default); new-leaks: every prompt "
                             "leaks a model never seen before (the cost of strict mode per new leak); release: four "
                             "servers (plain, the fixed pack, comfy_memx with release off and auto) on the release "
                             "pack, every prompt leaking a new model through one of its caches; pack-keeps: three "
                             "servers (plain, comfy_memx with release off and auto) where every prompt makes a pack "
                             "keep a new checkpoint loaded by ComfyUI's own loader, a free after every "
                             "--free-every-th")
    parser.add_argument("--check", action="store_true",
                        help="exit status 1 when a hard target is missed (performance targets too at >= "
                             f"{PERF_CHECK_MIN_PROMPTS} prompts)")
    parser.add_argument("--json", metavar="OUT", help="report file (default bench/results/soak-<time>.json)")
    parser.add_argument("--checkpoint", metavar="FILE",
                        help="SD1.5 checkpoint (default: built once into a cache); pack-keeps: the checkpoint the "
                             "packs load every prompt (default: the small one without CLIP, built once)")
    parser.add_argument("--port-base", type=_port, metavar="P", help="memx on P, plain on P+1 (default: free ports)")
    parser.add_argument("--timeout", type=_positive_float, metavar="S",
                        help="bound on the whole run in seconds, stopping the servers included (default 900 + 30 "
                             "per prompt); prompts stop 180 s before it to leave time for the final checks")
    parser.add_argument("--prompt-timeout", type=_positive_float, default=300.0, metavar="S")
    parser.add_argument("--boot-timeout", type=_positive_float, default=240.0, metavar="S")
    parser.add_argument("--poll-interval", type=_positive_float, default=2.0, metavar="S",
                        help="seconds between GET /memx/models + /metrics polls of each server (2)")
    parser.add_argument("--free-every", type=_positive_int, default=10, metavar="K",
                        help="POST /memx/free (plain: /free) while every K-th prompt runs (10); pack-keeps: after "
                             "every K-th prompt and the last")
    parser.add_argument("--latency-target", type=_positive_float, default=LATENCY_TARGET, metavar="X",
                        help=f"reuse and new-leaks: the median latency memx/plain must stay under ({LATENCY_TARGET})")
    parser.add_argument("--generations", type=_positive_int, default=3, metavar="G",
                        help="times each slot's leaked model is built over the run; each new one releases the "
                             "previous (3)")
    parser.add_argument("--warmup", type=_fraction, default=0.2, metavar="F",
                        help="fraction of the prompts left out of the RSS growth fit (0.2)")
    parser.add_argument("--no-plain", action="store_true",
                        help="run only the comfy_memx server (half the time; no latency or RSS comparison, the census "
                             "is checked against absolute expectations): for short CI smoke soaks")
    parser.add_argument("--reuse-every", type=_positive_int, default=10, metavar="K",
                        help="release workload: every K-th prompt repeats an earlier one, whose model the pack must "
                             "recompute where it was released (10)")
    parser.add_argument("--features", type=_positive_int, default=1024, metavar="F",
                        help="release workload: width of the pack's square Linear layers (1024)")
    parser.add_argument("--depth", type=_positive_int, default=2, metavar="D",
                        help="release workload: Linear layers per model (2: 8 MiB models with 1024 features)")
    parser.add_argument("--inspire", metavar="ARCHIVE",
                        help="pack-keeps: also run ComfyUI-Inspire-Pack (its .tar.xz archive or an unpacked folder): "
                             "every third prompt keeps its checkpoint through CheckpointLoaderSimpleShared //Inspire "
                             "(the server's interpreter needs the pack's requirements)")
    parser.add_argument("--memx-env", action="append", default=[], type=_memx_setting, metavar="NAME=VALUE",
                        help="pack-keeps: one more COMFY_MEMX_* setting for the comfy_memx servers (off and auto), "
                             "e.g. COMFY_MEMX_SEARCH_CPU=30; repeatable")
    parser.add_argument("--sequential", action="store_true",
                        help="pack-keeps: run the servers one after the other, each the whole workload alone (for a "
                             "checkpoint too large to keep on three servers at once)")
    parser.add_argument("--work-dir", metavar="DIR", help="work folder (default: a new temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, event log) at the end")
    return parser


def parse_args(argv=None):
    """Parse and cross-check the command line (argparse exits with status 2 on an error)."""
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.prompts is None:
        options.prompts = DEFAULT_PROMPTS.get(options.workload, 500)
    if options.workload == WORKLOAD_RELEASE and options.no_plain:
        parser.error("--no-plain: the release workload always runs its four servers side by side")
    if options.workload == WORKLOAD_PACK_KEEPS and options.no_plain:
        parser.error("--no-plain: the pack-keeps workload always runs its three servers")
    if options.workload != WORKLOAD_PACK_KEEPS and (options.inspire or options.sequential or options.memx_env):
        parser.error("--inspire, --sequential and --memx-env belong to --workload pack-keeps")
    if options.inspire is not None and not os.path.exists(options.inspire):
        parser.error(f"--inspire {options.inspire}: no such archive or folder")
    if options.workload == WORKLOAD_RELEASE and options.reuse_every < 2:
        parser.error(f"--reuse-every must be >= 2, got {options.reuse_every}")
    if not 8 <= options.features <= 8192 or options.depth > 64:
        parser.error("--features at most 8192 and --depth at most 64 (the pack's input limits)")
    if options.timeout is None:
        options.timeout = 900.0 + 30.0 * options.prompts
    if options.checkpoint is not None and not os.path.isfile(options.checkpoint):
        parser.error(f"--checkpoint {options.checkpoint}: no such file")
    if not os.path.isfile(os.path.join(options.comfyui, "main.py")):
        parser.error(f"--comfyui {options.comfyui}: no main.py there (not a ComfyUI tree)")
    return options


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

    if options.workload == WORKLOAD_RELEASE:
        report = run_release_soak(options, log)
        analyse(report)
        report["targets"] = evaluate_release(report, options.check)
        summary = format_release_summary
    elif options.workload == WORKLOAD_PACK_KEEPS:
        report = run_keeps_soak(options, log)
        analyse_keeps(report)
        report["targets"] = evaluate_keeps(report, options.check)
        summary = format_keeps_summary
    else:
        report = run_soak(options, log)
        compare_rss(report)
        report["targets"] = evaluate(report, options.check)
        summary = format_summary
    report["check"] = options.check
    report["exit_status"] = 130 if report.get("interrupted") else exit_status(report["targets"])
    hard_missed = any(t["hard"] and t["met"] is not True for t in report["targets"])
    keep = bool(options.keep or hard_missed or options.work_dir)
    report["work_dir_kept"] = keep
    path = options.json or default_json_path()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1, default=str)
    print(summary(report))
    print(f"report: {path}" + (f"; logs kept in {report['work_dir']}" if keep else ""))
    if not keep:
        shutil.rmtree(report["work_dir"], ignore_errors=True)
    return report["exit_status"]
