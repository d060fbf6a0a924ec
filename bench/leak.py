"""Benchmark T6: the strict-leak holder search against objgraph and against one heap scan, in one run.

The heap is synthetic (performance-anchors.md, "Notes on method"): filler Node/slotted objects, lists and dicts
plus 500 small tensors on top of ``import torch``, >= 1e6 GC-tracked objects (``quick``: ~1e5).  The target
tensor is reachable only through ``module -> __dict__ -> _CACHE dict -> list -> Holder -> state dict ->
tensor`` (depth 6).  Three timings are taken in the same process:

* ``search_s``: :func:`comfy_memx.leaks.holders.find_holders` finding that chain (best of 3);
* ``objgraph_s``: ``objgraph.find_backref_chain(target, objgraph.is_proper_module)`` (objgraph is the
  bench-only reference; it runs ``gc.collect()`` first, as its users get it; best of 2, 1 when quick);
* ``scan_s``: one ``gc.get_referrers(target)`` pass over the same heap (best of 3).

Targets (T6): ``objgraph_s / search_s >= 3`` and ``search_s / scan_s <= 6``.  Run ``python bench/leak.py
[--quick]``; it prints one JSON record per line.
"""

import gc
import json
import sys
import os
import time
import types

if __package__ in (None, ""):  # run as a script from a checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PACK = "memx_leak_bench_pack"
CACHE_KEY = "qwen_2512.safetensors_1024"
HOLDER_INDEX = 7
OBJGRAPH_FLOOR = 3.0
SCAN_CEILING = 6.0


class Holder:
    """A custom node's model holder.

    Slotted so that the chain stays exactly depth 6 across repeated searches: labelling ``holder.state`` on a
    plain instance would create its inline-kept ``__dict__`` (CPython >= 3.11) and add one level.
    """

    __slots__ = ("state",)

    def __init__(self, state):
        self.state = state


class Node:
    def __init__(self, value, link):
        self.value = value
        self.link = link


class SlotNode:
    __slots__ = ("value", "link")

    def __init__(self, value, link):
        self.value = value
        self.link = link


def build_heap(objects):
    """Return ``(keepalive, module, target)`` with at least ``objects`` GC-tracked objects added."""
    import torch

    filler = []
    per_round = 5
    previous = None
    for i in range(objects // per_round + 1):
        node = Node(i, previous) if i % 2 else SlotNode(i, previous)
        filler.append([node, {"i": i, "node": node}, (node, i)])
        previous = node if i % 64 else None
    tensors = {f"t{i}": torch.zeros(4) for i in range(500)}
    target = torch.zeros(8)
    module = types.ModuleType(PACK)
    holders = [Holder({"weight": torch.zeros(2)}) for _ in range(HOLDER_INDEX)]
    holders.append(Holder({"weight": target, "bias": torch.zeros(2)}))
    module._CACHE = {CACHE_KEY: holders}
    sys.modules[PACK] = module
    return (filler, tensors), module, target


def _best(repeats, call):
    best, result = None, None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        elapsed = time.perf_counter() - started
        best = elapsed if best is None else min(best, elapsed)
    return best, result


def run(quick=False):
    """Build the heap, time the three searches, and return JSON records (``case: leak``)."""
    import objgraph

    from comfy_memx.leaks.holders import find_holders

    keepalive, module, target = build_heap(100_000 if quick else 1_100_000)
    try:
        gc.collect()
        heap = len(gc.get_objects())
        expected = f"{PACK}._CACHE[{CACHE_KEY!r}][{HOLDER_INDEX}].state['weight']"

        scan_s, _ = _best(3, lambda: len(gc.get_referrers(target)))
        search_s, report = _best(3, lambda: find_holders(target, budget_s=60.0))
        paths = [chain.path for chain in report.chains]
        if expected not in paths:
            raise AssertionError(f"search did not find {expected!r}: {paths}")
        objgraph_s, chain = _best(1 if quick else 2, lambda: objgraph.find_backref_chain(
            target, objgraph.is_proper_module, max_depth=20))
        if not chain or chain[0] is not module or len(chain) != 7:
            raise AssertionError(f"objgraph did not find the depth-6 chain (length {len(chain or ())})")
        del chain
    finally:
        sys.modules.pop(PACK, None)
        del keepalive, module, target

    over_objgraph = objgraph_s / search_s
    in_scans = search_s / scan_s
    record = {"case": "leak"}
    return [
        dict(record, metric="heap_objects", value=heap, unit="objects"),
        dict(record, metric="search_s", value=round(search_s, 4), unit="s", scans=report.scans,
             objects_visited=report.objects_visited),
        dict(record, metric="objgraph_s", value=round(objgraph_s, 4), unit="s"),
        dict(record, metric="scan_s", value=round(scan_s, 4), unit="s"),
        dict(record, metric="speedup_vs_objgraph", value=round(over_objgraph, 2), unit="x",
             ratio=round(over_objgraph, 2), formula="objgraph_s/search_s", target_min=OBJGRAPH_FLOOR,
             ok=over_objgraph >= OBJGRAPH_FLOOR),
        dict(record, metric="search_in_scans", value=round(in_scans, 2), unit="scans",
             ratio=round(in_scans, 2), formula="search_s/scan_s", target_max=SCAN_CEILING,
             ok=in_scans <= SCAN_CEILING),
    ]


if __name__ == "__main__":
    for line in run(quick="--quick" in sys.argv[1:]):
        print(json.dumps(line))
