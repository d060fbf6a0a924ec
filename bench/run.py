"""comfy_memx benchmarks: ``python -m bench.run [CASE ...] [--quick] [--json PATH] [--comfyui PATH [--python PY]]``.

Cases (all by default, in this order):

``load``      checkpoint load GB/s, warm and cold, next to the same-run memcpy and raw-read floors (bench/load.py)
``offload``   RAM -> device -> RAM GB/s through load_models_gpu / free_memory, next to the best flat copy; pinned
              versus pageable when CUDA is available (bench/offload.py)
``overhead``  patched/unpatched ratios of the model-management wrappers and of the instrumented loader
              (bench/overhead.py, bench/loader_overhead.py)
``leak``      the strict-leak holder search against objgraph and one heap scan (bench/leak.py)
``pins``      bytes registered per workflow cycle under four pin-eviction policies (bench/pins.py)

Every figure comes from interleaved runs inside this one process run (median, with min and max over the rounds);
``floor`` is the same-run physical limit a GB/s figure is compared with and ``ratio`` the median per-round ratio
against it; the per-round timings are kept in each record's ``per_round``.  A figure with a target says whether it
met it: ``target_min`` / ``target_max`` and ``met`` in the record, the ``target`` column of the table (``MISSED``),
and a footer listing every missed target.  An added cost per call is reported only above the resolution measured
in the same rounds (the gap between two timings of the same code), else as ``< upper bound``; it is never negative.
A missed target does not change the exit status (figures move with the load of a shared machine).
Output: a table on stdout, the records as one JSON list (``--json PATH``, default
``bench/results/bench-<time>.json``) and, when matplotlib is installed, a PNG chart of the ratios next to it.
``--quick`` shrinks every case (256 MiB checkpoint, fewer rounds; under 2 minutes on 2 cores).

``--comfyui PATH``: the ``load`` and ``offload`` cases run against that ComfyUI tree, in a child process of the
interpreter given by ``--python`` (a venv with ComfyUI's requirements; default: this one) with the tree on
``sys.path``, ``--cpu`` unless CUDA is available, and comfy_memx active.  The other cases run here on the stand-in.
Generated checkpoints live in a temporary folder that is removed at the end.
"""

import argparse
import importlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

from bench import common

CASES = ("load", "offload", "overhead", "leak", "pins", "features")
COMFYUI_CASES = ("load", "offload")


def run_case(name, options, workspace, comfy=None):
    """Run one case in this process and return its records (``comfy``: a real ComfyUI from :func:`import_comfyui`)."""
    quick = options.quick or options.tiny
    labels = {"comfyui": comfy.version, "torch": comfy.torch} if comfy is not None else {}
    if name == "load":
        return importlib.import_module("bench.load").run(quick=quick, tiny=options.tiny, workspace=workspace,
                                                   comfy_utils=comfy.utils if comfy else None, labels=labels)
    if name == "offload":
        return importlib.import_module("bench.offload").run(quick=quick, tiny=options.tiny, comfy=comfy, labels=labels)
    if name == "overhead":
        return importlib.import_module("bench.overhead").run(quick=quick, tiny=options.tiny, workspace=workspace)
    if name == "features":
        return importlib.import_module("bench.features").run(quick=quick, tiny=options.tiny)
    return importlib.import_module(f"bench.{name}").run(quick=quick)


def guarded(name, call):
    """Run a case; a missing optional package gives a ``skipped`` record, any other failure an ``error`` record.

    Every record gets the 1-minute load average at the end of its case (the machine may be shared), and every
    record with ``target_min`` / ``target_max`` its ``met`` (bench/common.py :func:`common.judge`).
    """
    started = time.perf_counter()
    try:
        records = call()
    except ImportError as exc:
        records = [common.skipped_record(name, f"needs {exc.name or exc}: pip install -e '.[bench]'")]
    except Exception as exc:
        traceback.print_exc()
        records = [common.record(name, "error", None, None, error=f"{type(exc).__name__}: {exc}")]
    loadavg = common.load_average()
    seconds = round(time.perf_counter() - started, 1)
    for r in records:
        r.setdefault("loadavg_1m", loadavg)
        r.setdefault("case_seconds", seconds)
        common.judge(r)     # records a case built by hand get their ``met`` too
    return records


def import_comfyui(tree):
    """Import a real ComfyUI tree in this process with comfy_memx active; returns its modules and version.

    ``--cpu`` is passed to ComfyUI's argument parser unless torch sees a CUDA device.
    """
    import torch
    from comfy_memx.core.bootstrap import bootstrap
    tree = os.path.abspath(tree)
    sys.argv[:] = [os.path.join(tree, "main.py")] + ([] if torch.cuda.is_available() else ["--cpu"])
    sys.path.insert(0, tree)
    bootstrap("bench", {"COMFY_MEMX_LEAK_MODE": "off"})
    import comfy.options
    comfy.options.enable_args_parsing()
    import comfy.utils
    import comfy.model_management
    import comfy.model_patcher
    try:
        version = importlib.import_module("comfyui_version").__version__
    except (ImportError, AttributeError):
        version = "unknown"
    return types.SimpleNamespace(utils=comfy.utils, model_management=comfy.model_management,
                                 model_patcher=comfy.model_patcher, version=version, tree=tree,
                                 torch=torch.__version__)


def run_in_comfyui(cases, options):
    """Run ``cases`` in a child process of ``--python`` against the ``--comfyui`` tree; returns its records."""
    python = options.python or sys.executable
    with tempfile.TemporaryDirectory(prefix="comfy_memx_bench_") as folder:
        out = os.path.join(folder, "records.json")
        command = [python, "-m", "bench.run", *cases, "--comfyui", options.comfyui, "--in-comfyui",
                   "--json", out, "--no-chart", "--no-table"]
        command += ["--quick"] if options.quick else []
        command += ["--tiny"] if options.tiny else []
        print(f"# running {', '.join(cases)} in {python} against {options.comfyui}", file=sys.stderr, flush=True)
        child = subprocess.run(command, stdout=sys.stderr, stderr=sys.stderr, check=False, cwd=ROOT)
        if os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                return json.load(f)
        return [common.record(case, "error", None, None, error=f"child exited with status {child.returncode}",
                              command=" ".join(command)) for case in cases]


def run_record(started, loadavg_start, argv):
    """The ``run`` record: wall time, load averages, host and versions (for reading the figures later)."""
    try:
        import torch
        versions = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    except ImportError:
        versions = {}
    return common.record("run", "wall_s", time.perf_counter() - started, "s", loadavg_start=loadavg_start,
                         loadavg_end=common.load_average(), cpus=os.cpu_count(), python=platform.python_version(),
                         command="python -m bench.run " + " ".join(argv), **versions)


def parse(argv):
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"cases to run: {', '.join(CASES)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller checkpoint and fewer rounds (< 2 min)")
    parser.add_argument("--json", metavar="PATH", help="write the records there (default: bench/results/)")
    parser.add_argument("--png", metavar="PATH", help="chart path (default: next to the JSON; needs matplotlib)")
    parser.add_argument("--comfyui", metavar="PATH", help="a ComfyUI tree for the load and offload cases")
    parser.add_argument("--python", metavar="PY", help="interpreter for the ComfyUI tree (default: this one)")
    parser.add_argument("--no-chart", action="store_true", help="do not write the PNG chart")
    parser.add_argument("--no-table", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)        # smoke tests: 2 MiB, 2-3 rounds
    parser.add_argument("--in-comfyui", action="store_true", help=argparse.SUPPRESS)  # the child of --comfyui
    options = parser.parse_args(argv)
    unknown = [c for c in options.cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case {', '.join(unknown)} (choose from {', '.join(CASES)})")
    if options.comfyui and not os.path.isfile(os.path.join(options.comfyui, "main.py")):
        parser.error(f"--comfyui {options.comfyui}: no main.py there")
    if options.python and not options.comfyui:
        parser.error("--python needs --comfyui")
    options.cases = [c for c in CASES if c in options.cases] if options.cases else list(CASES)
    return options


def main(argv=None):
    """Run the chosen cases, print the table, write JSON and the chart; exit status 1 if a case failed."""
    argv = sys.argv[1:] if argv is None else argv
    options = parse(argv)
    started, loadavg_start = time.perf_counter(), common.load_average()
    records = []
    with common.Workspace() as workspace:
        comfy = import_comfyui(options.comfyui) if options.in_comfyui else None
        in_child = [c for c in options.cases if c in COMFYUI_CASES] if options.comfyui and not comfy else []
        for case in options.cases:
            if case in in_child:
                if case == in_child[0]:
                    records += run_in_comfyui(in_child, options)
                continue
            print(f"# {case} ...", file=sys.stderr, flush=True)
            records += guarded(case, lambda: run_case(case, options, workspace, comfy))
    if not options.in_comfyui:
        records.append(run_record(started, loadavg_start, argv))
    if not options.no_table:
        print(common.format_table(records), flush=True)
    path = options.json or os.path.join(common.RESULTS_DIR, time.strftime("bench-%Y%m%d-%H%M%S.json"))
    common.write_json(records, path)
    print(f"# records: {path}", file=sys.stderr)
    if not options.no_chart:
        png = options.png or os.path.splitext(path)[0] + ".png"
        print(f"# chart: {png}" if common.write_chart(records, png) else "# no chart: matplotlib is not installed",
              file=sys.stderr)
    return 1 if any(r["metric"] == "error" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
