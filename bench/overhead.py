"""Case ``overhead``: the cost of comfy_memx's patches on a ComfyUI-shaped load/unload cycle.

A model of 1250 tensors (about 34 MB, float32) is loaded with ``load_models_gpu`` and fully unloaded with
``free_memory`` on the ComfyUI 0.27.0-shaped stand-in (its simulated GPU copies every tensor, so a cycle is real
per-tensor work).  Each round times an unpatched sample, a patched one and a second unpatched one inside one
process, the order rotated every round; ``patched_over_unpatched_cycle`` is the median of the per-round ratios
patched / unpatched, with min and max.  ``added_us_per_wrapped_call`` is the median per-round extra time of a
patched cycle divided by the number of wrapper calls in it, reported only when it is above the resolution that the
two unpatched samples of the same rounds give (bench/common.py :func:`common.difference_record`; on a busy machine
a cycle of milliseconds hides a few microseconds per call, and the record then says ``< upper bound`` instead of
printing noise, which could be negative).  The instrumented loader's ratios come from ``bench/loader_overhead.py``
and each wrapper's pass-through cost per call from ``bench/wrappers.py``.
"""

import os
import sys

from bench import common

TENSORS = 1250
NUMEL = 6800            # 1250 x 6800 x 4 bytes = 34 MB
CYCLES_PER_SAMPLE = 5


def _import_shape():
    root = common.STAND_IN_0270
    if root not in sys.path:
        sys.path.insert(0, root)
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


def _interleaved(patches, mm, cycle, cycles_per_sample, rounds):
    """Per-round seconds of ``cycles_per_sample`` cycles: ``unpatched``, ``patched`` and ``unpatched_again``."""
    def sample():
        for _ in range(cycles_per_sample):
            cycle()

    return common.interleaved({"unpatched": (sample, lambda: patches.unpatch(mm)),
                               "patched": (sample, lambda: patches.patch(mm)),
                               "unpatched_again": (sample, lambda: patches.unpatch(mm))}, rounds)


def _sizes(quick, tiny):
    """(tensors, numel, cycles per sample, rounds) of each measured configuration."""
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
            times = _interleaved(patches, mm, cycle, per_sample, pairs)
            label = f"{tensors} tensors, {tensors * numel * 4 / 1e6:.3g} MB, load + full unload"
            records += [
                common.ratio_record("overhead", "patched_over_unpatched_cycle", times["patched"],
                                    times["unpatched"], config=label),
                common.difference_record("overhead", "added_us_per_wrapped_call", times["patched"],
                                         times["unpatched"], times["unpatched_again"], per=calls * per_sample,
                                         wrapped_calls_per_cycle=calls, cycles=per_sample, config=label),
            ]
    finally:
        patches.unpatch(mm)
        STATE.reset()
    return (records + _sibling("loader_overhead").run(quick=quick, tiny=tiny, workspace=workspace)
            + _sibling("wrappers").run(quick=quick or tiny))


def _sibling(name):
    import importlib
    return importlib.import_module(f"bench.{name}")


if __name__ == "__main__":
    import json
    import logging
    logging.disable(logging.INFO)
    for record in run(quick="--quick" in sys.argv, tiny="--tiny" in sys.argv):
        print(json.dumps(record))
