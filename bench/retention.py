"""RSS of a real ComfyUI after ``POST /memx/free``, with and without ``malloc_trim``: allocator retention measured.

::

    python -m bench.retention --comfyui PATH [--python PY] [--rounds N] [--prompts K] [--json OUT]

Each round starts the tree twice, one server after the other and alternating which goes first (``--cpu``, under
``python -m comfy_memx``): once with ``COMFY_MEMX_TRIM=1`` (the default) and once with ``COMFY_MEMX_TRIM=0``.  Each
server runs ComfyUI's default text-to-image workflow ``--prompts`` times on the random-weight SD1.5 checkpoint (the
one ``bench.soak`` builds and caches), then ``POST /memx/free`` unloads and frees everything, and the receipt's
``memory`` object gives RSS before the free, after the worker's collection, after ``malloc_trim(0)`` (trim on), the
bytes ``malloc_trim`` returned and how long it took, and the bytes live models still hold in RAM.  The server's RSS is
read again from ``/proc`` one second later.

The table and the JSON report give, per mode, the median over rounds; ``unheld_mib`` is RSS after the free minus
held bytes: the process's own baseline (interpreter, libraries, ComfyUI) plus what the allocator keeps, so the
difference between the two modes is the allocator's retention that ``malloc_trim`` hands back.  Standard library only; the servers run under
``--python`` (an interpreter with the tree's requirements and comfy_memx installed).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from bench.harness import drive
from bench.soak import cli, measurements, servers

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2 ** 20
MODES = {"trim": "1", "no_trim": "0"}


def parse_args(argv=None):
    """The command line; argparse exits with status 2 on an error."""
    parser = argparse.ArgumentParser(prog="python -m bench.retention", description=__doc__.split("\n\n")[0])
    parser.add_argument("--comfyui", required=True, metavar="PATH", help="ComfyUI tree (the folder with main.py)")
    parser.add_argument("--python", default=sys.executable, metavar="PY",
                        help="interpreter that runs ComfyUI and can import comfy_memx (default: this one)")
    parser.add_argument("--rounds", type=cli._positive_int, default=2, metavar="N", help="rounds (2)")
    parser.add_argument("--prompts", type=cli._positive_int, default=2, metavar="K",
                        help="default workflows run before the free (2)")
    parser.add_argument("--checkpoint", metavar="FILE", help="SD1.5 checkpoint (default: bench.soak's cache)")
    parser.add_argument("--json", metavar="OUT", help="report file (default: none)")
    options = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(options.comfyui, "main.py")):
        parser.error(f"--comfyui {options.comfyui}: no main.py there (not a ComfyUI tree)")
    if options.checkpoint is not None and not os.path.isfile(options.checkpoint):
        parser.error(f"--checkpoint {options.checkpoint}: no such file")
    return options


def one_server(options, checkpoint, mode, work):
    """Boot one server in ``mode``, run the prompts, free, and return the receipt's memory figures in MiB."""
    out = os.path.join(work, f"{mode}-{len(os.listdir(work))}")
    session = drive.Session(options.comfyui, options.python, out, launcher="module", packs=(),
                            checkpoint=checkpoint, env={"COMFY_MEMX_TRIM": MODES[mode]})
    with session:
        if not session.start(boot_timeout=240.0):
            raise RuntimeError(f"the {mode} server did not start; see {session.log_path}")
        for index in range(options.prompts):
            record = session.prompt(f"t2i_{index}", drive.default_workflow(seed=index))
            if not record.get("ok"):
                raise RuntimeError(f"prompt {index} failed on the {mode} server: {record}")
        answer = session.memx_free("free")
        if answer["http_status"] != 200:
            raise RuntimeError(f"/memx/free answered {answer['http_status']}: {answer['body']}")
        time.sleep(1.0)
        rss_later, _ = measurements.read_proc_memory(session.server.process.pid)
    memory = answer["body"]["memory"]
    trim = memory.get("trim") or {}

    def mib(value):
        return None if value is None else round(value / MIB, 1)
    return {"rss_before_mib": mib(memory["rss_before"]), "rss_after_mib": mib(memory["rss_after"]),
            "rss_after_trim_mib": mib(memory.get("rss_after_trim")), "rss_1s_later_mib": mib(rss_later),
            "held_mib": mib(memory["held_bytes"]),
            "unheld_mib": mib((memory.get("rss_after_trim") or memory["rss_after"]) - memory["held_bytes"]),
            "trim_returned_mib": mib(trim.get("returned_bytes")), "trim_s": trim.get("seconds"),
            "trim_skipped": trim.get("skipped"), "freed": len(answer["body"]["freed"])}


def summarize(rounds):
    """Per mode, the median of every numeric figure over the rounds."""
    summary = {}
    for mode in MODES:
        rows = [r[mode] for r in rounds]
        summary[mode] = {key: statistics.median(row[key] for row in rows)
                         for key in rows[0] if all(isinstance(row[key], (int, float)) for row in rows)}
    return summary


def main(argv=None):
    """Run the rounds and print the table; exit status 1 when a server or a request failed."""
    options = parse_args(argv)
    checkpoint = os.path.abspath(options.checkpoint) if options.checkpoint else \
        servers.ensure_checkpoint(argparse.Namespace(checkpoint=None, python=options.python, comfyui=options.comfyui),
                               print)[0]
    work = tempfile.mkdtemp(prefix="memx-retention-")
    rounds = []
    try:
        for index in range(options.rounds):
            order = list(MODES) if index % 2 == 0 else list(MODES)[::-1]
            rounds.append({mode: one_server(options, checkpoint, mode, work) for mode in order})
            print(f"round {index + 1}/{options.rounds}: " + json.dumps(rounds[-1]), flush=True)
    except Exception as exc:
        print(f"retention: {exc} (work folder kept: {work})", file=sys.stderr)
        return 1
    shutil.rmtree(work, ignore_errors=True)
    summary = summarize(rounds)
    keys = ("rss_before_mib", "rss_after_mib", "rss_after_trim_mib", "rss_1s_later_mib", "held_mib", "unheld_mib",
            "trim_returned_mib", "trim_s")
    print(f"{'median over ' + str(options.rounds) + ' rounds':<28}" + "".join(f"{m:>12}" for m in MODES))
    for key in keys:
        cells = [summary[mode].get(key) for mode in MODES]
        print(f"{key:<28}" + "".join(f"{'-' if c is None else c:>12}" for c in cells))
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump({"comfyui": os.path.abspath(options.comfyui), "prompts": options.prompts, "rounds": rounds,
                       "summary": summary}, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
