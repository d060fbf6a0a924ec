"""Part of case ``overhead``: what the instrumented loader (``patches/loader.py``) costs per checkpoint load.

On the ComfyUI 0.27.0 stand-in's ``comfy.utils.load_torch_file``, with comfy_memx writing its events to a file (the
expensive configuration: every load builds, serializes and flushes a ``file_load`` line), patched and unpatched
loads alternate (A B, B A, ...) and each figure is the median of the per-pair ratios, with min and max:

* ``big``: the load case's checkpoint (2 GiB, 256 MiB with ``--quick``), loaded and copied into resident tensors
  (what ``load_state_dict`` does after the memory-mapped load).  Target: <= 1.02.
* ``small``: 1250 small tensors (2 MiB), same steps; per-tensor work of safetensors dominates.  Target: <= 1.03.
* ``loader_added_us_per_load``: the wrapper alone around a stub loader that returns the small state dict at once
  (``os.stat``, owner lookup, one event line written and flushed): per round, unpatched, patched and unpatched
  again; the median extra time per load, reported only above the resolution the two unpatched timings give
  (bench/common.py :func:`common.difference_record`), never negative.  Each ratio record also carries
  ``from_stub``, 1 + that cost / the unpatched load time (``from_stub_max`` with the upper bound when the cost is
  below the resolution): the same ratio without the run-to-run noise of whole loads (a shared 2-core machine moves
  a 50 ms load by +-10 %, far more than the wrapper costs).
"""

import os
import sys

from bench import common

CASE = "overhead"
BIG_TARGET = 1.02
SMALL_TARGET = 1.03


def _rounds(patches, utils, call, rounds, again=False):
    """Per-round seconds of ``call`` unpatched and patched (and unpatched again with ``again``), order rotated."""
    variants = {"unpatched": (call, lambda: patches.unpatch(utils)), "patched": (call, lambda: patches.patch(utils))}
    if again:
        variants["unpatched_again"] = (call, lambda: patches.unpatch(utils))
    return common.interleaved(variants, rounds)


def run(quick=False, tiny=False, workspace=None):
    """Measure patched/unpatched checkpoint loads; returns records of case ``overhead``."""
    import torch
    from comfy_memx.core import registry
    from comfy_memx.core.state import STATE
    from comfy_memx.core import wrapping
    from comfy_memx.core.bootstrap import bootstrap
    from bench.common import STAND_IN_0270
    with common.workspace_for(workspace) as ws:
        big_path, _ = ws.checkpoint(common.checkpoint_bytes(quick, tiny))
        small_path, _ = ws.checkpoint(common.TINY_BYTES)
        events_path = ws.file("loader_overhead_events.jsonl")
        STATE.reset()
        bootstrap("bench", {"COMFY_MEMX_LEAK_MODE": "off", "COMFY_MEMX_EVENTS": events_path})
        root = STAND_IN_0270
        if root not in sys.path:
            sys.path.insert(0, root)
        import comfy.utils as utils
        patches = registry.patch_of("loader")
        real = wrapping.original_of(utils, "load_torch_file")
        records = []
        try:
            state = real(small_path)
            patches.unpatch(utils)
            utils.load_torch_file = lambda _ckpt, *args, **kwargs: state
            patches.patch(utils)
            calls = common.rounds_for(quick, tiny, 2000, 1000, 50)
            stub = _rounds(patches, utils, lambda: [utils.load_torch_file(small_path) for _ in range(calls)],
                           2 if tiny else 7, again=True)
            added = common.difference_record(
                CASE, "loader_added_us_per_load", stub["patched"], stub["unpatched"], stub["unpatched_again"],
                per=calls, config="stub loader returning 1250 tensors; event written to a file")
            records.append(added)
            added_s = (added["upper_bound"] if added.get("below_resolution") else added["value"]) / 1e6
            stub_label = "from_stub_max" if added.get("below_resolution") else "from_stub"
            patches.unpatch(utils)
            utils.load_torch_file = real
            patches.patch(utils)
            del state
            for config, path, pairs, target in (
                    ("big", big_path, common.rounds_for(quick, tiny, 15, 15, 3), BIG_TARGET),
                    ("small", small_path, common.rounds_for(quick, tiny, 41, 21, 3), SMALL_TARGET)):
                dest = {name: torch.zeros_like(t) for name, t in real(path).items()}

                def load():
                    for name, tensor in utils.load_torch_file(path).items():
                        dest[name].copy_(tensor)
                times = _rounds(patches, utils, load, pairs)
                unpatched_s = common.spread(times["unpatched"])[0]
                label = f"{config}: {len(dest)} tensors, {os.path.getsize(path) / 1e6:.4g} MB, load_torch_file + copy_"
                records.append(common.ratio_record(
                    CASE, "loader_patched_over_unpatched", times["patched"], times["unpatched"], target_max=target,
                    config=label, unpatched_ms=1000 * unpatched_s, events="file",
                    **{stub_label: 1 + added_s / unpatched_s}))
                del dest
        finally:
            patches.unpatch(utils)
            utils.load_torch_file = real
            registry.remove_all()
            STATE.reset()
    return records


if __name__ == "__main__":
    import json
    for line in run(quick="--quick" in sys.argv[1:], tiny="--tiny" in sys.argv[1:]):
        print(json.dumps(line))
