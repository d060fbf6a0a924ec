"""Case ``features``: what the capabilities beyond naming a leak cost where they run.

* ``pattern_s_per_chain``: :func:`comfy_memx.leaks.patterns.classify` on one holder chain of every pattern (the
  chains are what strict mode reports for the stand-ins' leaking pack; one classification per reported chain);
* ``idle_check_s``: one check of the ``COMFY_MEMX_IDLE_UNLOAD`` thread on its usual path (queue empty, idle time not
  reached yet), which runs once a second; ``idle_check_share`` is that cost as a fraction of the second;
* ``malloc_trim_s`` and ``malloc_trim_returned_mib``: ``malloc_trim(0)`` as ``/memx/free`` runs it, after the
  process allocated many small objects (``TRIM_MIB`` MiB of 1 KiB buffers) and freed all but one in
  ``KEEP_EVERY`` (the fragmentation that keeps RSS high after a free: live objects spread over the heap); skipped with the reason where glibc's ``malloc_trim`` is unavailable.

Every figure is the median over rounds, with min and max and the per-round timings.  The RSS of a real ComfyUI
after ``/memx/free`` with and without trimming is ``bench/retention.py`` (it needs a ComfyUI tree).
"""

import os
import sys
import time
import types

from bench import common

CHAINS = (
    {"path": "leaky_pack.LeakyLoader._cache['qwen_2512.safetensors']", "package": "leaky_pack",
     "root_kind": "class_attribute"},
    {"path": "memx_bench_pack.HOOKS['on_done'][0].__self__.model", "package": "memx_bench_pack", "root_kind": "module_global"},
    {"path": "memx_bench_pack.make_hook.<locals>.hook -> closure 'model'", "package": "memx_bench_pack",
     "root_kind": "module_global"},
    {"path": "memx_bench_pack.load_cached -> lru_cache[('a.safetensors',)]", "package": "memx_bench_pack",
     "root_kind": "module_global"},
    {"path": "memx_bench_pack.REGISTRY['m']", "package": "memx_bench_pack", "root_kind": "module_global"},
    {"path": "memx_bench_pack.LAST", "package": "memx_bench_pack", "root_kind": "module_global"},
    {"path": "server.PromptServer.instance.last_model", "package": "core", "root_kind": "class_attribute"},
    {"path": "thread 'worker' frame run local 'model'", "package": "memx_bench_pack", "root_kind": "thread_frame"},
    {"path": "(reference cycle)", "package": None, "root_kind": "cycle"},
)
TRIM_MIB = 256
KEEP_EVERY = 64


def _per_call(call, calls, rounds):
    """Per-round seconds of one call, from ``calls`` calls a round."""
    def batch():
        for _ in range(calls):
            call()
    return [s / calls for s in common.interleaved({"call": batch}, rounds)["call"]]


def _patterns(rounds):
    from comfy_memx.leaks import patterns
    # the pack is imported where its chains are reported: patterns reads sys.modules for where its name ends
    sys.modules.setdefault("memx_bench_pack", types.ModuleType("memx_bench_pack"))

    def classify_all():
        for chain in CHAINS:
            patterns.classify(chain)
    per_chain = [s / len(CHAINS) for s in _per_call(classify_all, 200, rounds)]
    found = sorted({patterns.classify(chain)[0] for chain in CHAINS})
    return common.seconds_record("features", "pattern_s_per_chain", per_chain, chains=len(CHAINS), patterns=found)


class _Queue:
    """The two attributes of ComfyUI's PromptQueue that the idle check reads, empty."""

    def __init__(self):
        import threading
        self.mutex = threading.RLock()
        self.queue = []
        self.currently_running = {}


def _idle_check(rounds):
    from comfy_memx.core.bootstrap import bootstrap
    from comfy_memx.core.state import STATE
    from comfy_memx.sharing import activity, idle
    STATE.reset()
    bootstrap("bench", {"COMFY_MEMX_IDLE_UNLOAD": "3600"})
    try:
        watch = idle.IdleWatch()          # not started: the bench calls its check itself
        watch.queue = _Queue()
        activity.prompt_ended()           # the last prompt just ended: idle, but not for an hour yet
        seconds = _per_call(watch.check, 2000, rounds)
        assert watch.unloaded_after is None, "the idle check unloaded during the bench"
    finally:
        STATE.reset()
    check = common.seconds_record("features", "idle_check_s", seconds)
    return [check, common.record("features", "idle_check_share", check["value"] / idle.CHECK_EVERY_S, "fraction",
                                 check_every_s=idle.CHECK_EVERY_S)]


def _malloc_trim(rounds, mib):
    from comfy_memx.core.bootstrap import bootstrap
    from comfy_memx.core.state import STATE
    from comfy_memx.surface import retention
    STATE.reset()
    bootstrap("bench", {})
    try:
        why = retention.trim_unavailable()
        if why is not None:
            return [common.skipped_record("features", why, path="malloc_trim")]
        seconds, returned = [], []
        for _ in range(rounds):
            buffers = [bytearray(1024) for _ in range(mib * 1024)]
            kept = buffers[::KEEP_EVERY]      # a few long-lived objects pin the heap: free() cannot shrink it
            del buffers
            result = retention.trim()
            del kept
            seconds.append(result["seconds"])
            returned.append((result["returned_bytes"] or 0) / 2 ** 20)
            time.sleep(0.05)
    finally:
        STATE.reset()
    returned_median, returned_low, returned_high = common.spread(returned)
    return [common.seconds_record("features", "malloc_trim_s", seconds, allocated_mib=mib),
            common.record("features", "malloc_trim_returned_mib", returned_median, "MiB", min=returned_low,
                          max=returned_high, rounds=len(returned), allocated_mib=mib, per_round={"values": returned})]


def run(quick=False, tiny=False):
    """Measure the per-use cost of holder patterns, the idle check and malloc_trim; returns JSON records."""
    rounds = common.rounds_for(quick, tiny, 31, 9)
    mib = 16 if tiny else (64 if quick else TRIM_MIB)
    return [_patterns(rounds)] + _idle_check(rounds) + _malloc_trim(min(rounds, 9), mib)


if __name__ == "__main__":
    import json
    for one in run(quick="--quick" in sys.argv, tiny="--tiny" in sys.argv):
        print(json.dumps(one))
