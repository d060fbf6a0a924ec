"""Case ``overhead``: the cost of comfy_memx's patches on a ComfyUI-shaped load/unload cycle.

A model of 1250 tensors (about 34 MB, float32) is loaded with ``load_models_gpu`` and fully unloaded with
``free_memory`` on the ComfyUI 0.27.0-shaped stand-in (its simulated GPU copies every tensor, so a cycle is real
per-tensor work).  Patched and unpatched runs alternate inside one process (A B A B ...); each figure is the median
of the per-pair ratios, with min and max.  ``added_us_per_wrapped_call`` divides the median extra time of a cycle by
the number of wrapper calls in it.  The instrumented loader's ratios come from ``bench/loader_overhead.py`` and each
wrapper's pass-through cost per call from ``bench/wrappers.py``.
"""

import gc
import statistics
import sys
import time

TENSORS = 1250
NUMEL = 6800            # 1250 x 6800 x 4 bytes = 34 MB
CYCLES_PER_SAMPLE = 5


def _import_shape():
    from common import STAND_INS
    import os
    sys.path.insert(0, os.path.join(STAND_INS, "v0_27_0"))
    import comfy.model_management as mm
    import comfy.model_patcher
    import comfy.model_base
    return mm, comfy.model_patcher, comfy.model_base


def _count_wrapped_calls(mm, cycle):
    """How many calls of the wrapped sites one ``cycle()`` makes (counted by temporary counting shims)."""
    from comfy_memx.core import wrapping
    calls = []
    saved = []
    for name in ("load_models_gpu", "free_memory", "cleanup_models_gc", "unload_all_models",
                 "LoadedModel.model_load", "LoadedModel.model_unload"):
        owner, attr = wrapping.resolve(mm, name)
        current = getattr(owner, attr)

        def counter(*a, _f=current, _n=name, **k):
            calls.append(_n)
            return _f(*a, **k)
        saved.append((owner, attr, current))
        setattr(owner, attr, counter)
    try:
        cycle()
    finally:
        for owner, attr, current in saved:
            setattr(owner, attr, current)
    return len(calls)


def _interleaved(patches, mm, cycle, cycles_per_sample, pairs):
    """Median, min and max of patched/unpatched ratios, and the median extra seconds per cycle."""
    def sample():
        start = time.perf_counter()
        for _ in range(cycles_per_sample):
            cycle()
        return (time.perf_counter() - start) / cycles_per_sample

    ratios, extra = [], []
    gc.disable()
    try:
        for i in range(pairs):
            times = {}
            for patched in ((False, True) if i % 2 == 0 else (True, False)):
                (patches.patch if patched else patches.unpatch)(mm)
                times[patched] = sample()
            ratios.append(times[True] / times[False])
            extra.append(times[True] - times[False])
    finally:
        gc.enable()
    return statistics.median(ratios), min(ratios), max(ratios), statistics.median(extra)


def _sizes(quick, tiny):
    """(tensors, numel, cycles per sample, pairs) of each measured configuration."""
    if tiny:
        return (50, NUMEL, 1, 3), (1, 16, 10, 3)
    return ((250 if quick else TENSORS, NUMEL, CYCLES_PER_SAMPLE, 15 if quick else 31),
            (1, 16, 100 if quick else 400, 15 if quick else 31))


def run(quick=False, tiny=False, workspace=None):
    """Measure patched/unpatched cycle time and the loader's ratios; returns JSON records (case ``overhead``).

    ``tiny`` shrinks everything for smoke tests; ``workspace`` (a ``bench/common.py`` Workspace) shares the
    generated checkpoints with the other cases.
    """
    from comfy_memx.core import registry
    from comfy_memx.core.state import STATE
    from comfy_memx.core.bootstrap import bootstrap
    STATE.reset()
    bootstrap("bench", {"COMFY_MEMX_LEAK_MODE": "report"})
    mm, patcher_mod, model_base = _import_shape()
    import execution  # noqa: F401  (applies the execution patch too, as in ComfyUI)
    patches = registry.patch_of("model_management")
    device = mm.get_torch_device()
    records = []
    try:
        for tensors, numel, per_sample, pairs in _sizes(quick, tiny):
            patcher = patcher_mod.ModelPatcher(model_base.BaseModel(tensors, numel), load_device=device,
                                               offload_device=mm.unet_offload_device())

            def cycle():
                mm.load_models_gpu([patcher])
                mm.free_memory(1e30, device)
            for _ in range(3):
                cycle()
            calls = _count_wrapped_calls(mm, cycle)
            ratio, low, high, extra = _interleaved(patches, mm, cycle, per_sample, pairs)
            label = f"{tensors} tensors, {tensors * numel * 4 / 1e6:.3g} MB, load + full unload"
            records += [
                {"case": "overhead", "metric": "patched_over_unpatched_cycle", "value": round(ratio, 4),
                 "min": round(low, 4), "max": round(high, 4), "unit": "ratio", "pairs": pairs, "config": label},
                {"case": "overhead", "metric": "added_us_per_wrapped_call", "value": round(extra / calls * 1e6, 3),
                 "unit": "us", "wrapped_calls_per_cycle": calls, "config": label},
            ]
    finally:
        patches.unpatch(mm)
        STATE.reset()
    return (records + _sibling("loader_overhead").run(quick=quick, tiny=tiny, workspace=workspace)
            + _sibling("wrappers").run(quick=quick or tiny))


def _sibling(name):
    import importlib
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


if __name__ == "__main__":
    import json
    import logging
    logging.disable(logging.INFO)
    for record in run(quick="--quick" in sys.argv, tiny="--tiny" in sys.argv):
        print(json.dumps(record))
