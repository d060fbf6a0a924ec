"""Soak comfy_memx inside a real ComfyUI server next to the same ComfyUI without it.

::

    python -m bench.soak --comfyui PATH [--python PY] [--prompts N] [--leak-mode strict|report|off] [--check]
                         [--json OUT] [--checkpoint FILE] [--port-base P] [--timeout S] [--no-plain]
                         [--workload reuse|new-leaks|release|pack-keeps] [--reuse-every K] [--features F]
                         [--depth D] [--free-every K] [--latency-target X] [--inspire ARCHIVE] [--sequential]
                         [--work-dir DIR] [--keep]

Standard library only (``bench.harness.drive`` starts, drives and stops the servers); the
servers run under ``--python``, an interpreter with the tree's requirements that can import comfy_memx (CI
installs the wheel there; for a checkout, ``pip install --no-deps -e .`` into it or put it on ``PYTHONPATH``).

What one run does:

1. makes two ComfyUI base folders (``--base-directory``) in a work folder: each with ``custom_nodes/`` holding a
   copy of the leaking pack ``bench/harness/memx_soak_nodes``, and ``models/checkpoints/`` holding a link to the
   random-weight SD1.5 checkpoint (``--checkpoint``, or built once by ``bench/harness/make_checkpoint.py``
   with the tree's own classes into a cache folder: ``$COMFY_MEMX_SOAK_CACHE``, else ``~/.cache/comfy_memx-soak``);
2. starts the tree twice on 127.0.0.1, ``--cpu``, at the same time: ``memx`` (``python -m comfy_memx main.py``,
   leak mode ``--leak-mode``, an event log) and ``plain`` (``python main.py``, no comfy_memx);
3. runs the same workload on both, prompt by prompt, one server at a time, alternating which goes first
   (memx then plain for even prompts, plain then memx for odd ones, so that order effects cancel): prompt ``i``
   is ComfyUI's default text-to-image workflow (``bench/harness/workflows/default_t2i.json``, 64x64, 1 step)
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

Targets (at 500 prompts with ``--leak-mode strict``): 0 failed prompts, 0 comfy_memx tracebacks (and
internal errors), a valid event log, nothing kept alive (hard targets); median latency <= 1.10x plain and RSS
growth caused by comfy_memx <= 1 MiB per 100 prompts (performance targets). ``--check`` makes the exit status 1
when a hard target is missed, or when a performance target is missed and ``--prompts`` >= 200 (shorter runs are too
noisy for 10 % and 1 MiB/100 prompts: their latency and RSS figures are reported, not checked). Exit status 2:
bad arguments, a tree without main.py, or an interpreter that cannot import comfy_memx.

``--no-plain`` runs the memx server alone (half the time, for CI smoke soaks): no latency or RSS comparison, and the
census must show no ComfyUI ModelPatcher or BaseModel alive after the final free. The summary table goes to stdout, the full report to ``--json`` (default ``bench/results/soak-<time>.json``). The
work folder (server logs, event log, outputs) is removed at the end unless ``--keep`` or the run missed a hard
target; its path is in the report.

``--workload release`` (default 300 prompts) is a soak of its own (:mod:`bench.soak.release`): four servers side by
side (plain ComfyUI with the release pack ``bench/harness/memx_release_nodes`` as written, plain ComfyUI with the
pack's caches off, comfy_memx with ``COMFY_MEMX_RELEASE=off`` and with ``auto`` for that pack), every prompt leaking a
new model through one of the pack's caches (class dict by resolution, unbounded and bounded ``lru_cache``, module
list) and every ``--reuse-every``-th prompt repeating an old one. It reports survivors by the pack's census, RSS growth
against the leaked bytes, the SHA-256 of every saved image, the paired latency ratio and the ``release`` receipts;
its rules are in :mod:`bench.soak.release_verdict`.

``--workload pack-keeps`` (default 100 prompts, a free after every ``--free-every``-th and the last) is another
(:mod:`bench.soak.keeps`): three servers (plain ComfyUI with the packs' caches off, comfy_memx with
``COMFY_MEMX_RELEASE=off`` and with ``auto`` for the packs), every prompt making a pack keep a new ``(model, clip,
vae)`` built by ComfyUI's own checkpoint loader (``bench/harness/memx_keeps_nodes``, and ComfyUI-Inspire-Pack with
``--inspire``) on the small checkpoint of ``make_checkpoint.py --arch small`` (or ``--checkpoint``). It reports
survivors older than the last free by the pack's census and by ``/memx/models``, RSS growth at the troughs of the
free cycles against plain's and against what the packs kept, the SHA-256 of every saved image and the ``release``
receipts; its rules are in :mod:`bench.soak.keeps_verdict`.

``--latency-target`` sets the median latency memx/plain that the default workloads judge (1.10; the strict-mode
figure of release notes is judged against 1.05: ``--latency-target 1.05``).

The package, one module a job: ``config`` (what a run is made of, the targets), ``workload`` (the prompts),
``servers`` (base folders, starting and stopping both servers, running prompts, pollers, frees, final checks),
``measurements`` (statistics, log and event-log scanning, /proc memory), ``verdict`` (survivors, census, targets,
exit status, summary), ``release_workload``, ``release`` and ``release_verdict`` (the release soak's prompts,
servers and verdict), ``keeps_workload``, ``keeps`` and ``keeps_verdict`` (the pack-keeps soak's), ``cli`` (options
and ``main``); ``python -m bench.soak`` runs :func:`bench.soak.cli.main`.
"""

from bench.soak.cli import main, parse_args  # noqa: F401
from bench.soak.config import NET_CLASS_NAME, SAMPLER_NODE_ID  # noqa: F401
from bench.soak.measurements import (describe, find_tracebacks, median_ratio, mentions_comfy_memx,  # noqa: F401
                                     paired_median_ratio, read_proc_memory, rss_growth_per_100, scan_log,
                                     theil_sen_slope, thin, validate_event_file, validate_events)
from bench.soak.servers import check_importable, exec_seconds  # noqa: F401
from bench.soak.verdict import (census_from_history, check_final_survivors, compare_census, compare_rss,  # noqa: F401
                                evaluate, exit_status, format_summary, unexpected_survivors)
from bench.soak.workload import build_workload, census_prompt, expected_held  # noqa: F401
