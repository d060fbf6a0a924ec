"""Case ``offload``: GB/s of moving a model from RAM to the device and back, next to the best flat copy of the run.

Three measurements, whichever apply:

* ``stand-in`` (without ``--comfyui``): ComfyUI 0.27.0's ``load_models_gpu`` / ``free_memory`` on the stand-in
  shipped with comfy_memx, whose simulated GPU copies every tensor into a fresh buffer and back (so "device" is RAM
  here).  comfy_memx is active, and the GB/s that its ``load`` / ``unload`` events report are recorded too: they are
  what a user reads in the events log.  Floor: one flat ``copy_`` of the same number of bytes between two resident
  buffers.
* ``comfyui`` (with ``--comfyui``, run by ``bench/run.py`` inside that tree's interpreter): the same cycle through
  the real ``load_models_gpu`` / ``free_memory`` on a model of the checkpoint's shapes.  With ``--cpu`` ComfyUI
  moves no bytes (load and offload device are both the CPU), which is recorded as skipped.
* ``cuda`` (only when CUDA is available): per-tensor host-to-device and device-to-host copies of the checkpoint's
  tensors from pinned and from pageable memory; floor: the best flat pinned copy of the same bytes in the same
  round.  Target (T9): pinned H2D >= 0.85 x that floor; D2H to pinned >= 3 x D2H to pageable.

The model is the load case's layout (about 1250 fp16/bf16 tensors; 2 GiB, 256 MiB with ``--quick``).
"""

import os
import sys

from bench import common

CASE = "offload"
PINNED_TARGET = 0.85
D2H_PINNED_OVER_PAGEABLE = 3.0


def run(quick=False, tiny=False, comfy=None, labels=None):
    """Return the records of case ``offload``; ``comfy`` is a real ComfyUI (see ``bench/run.py``) or None."""
    import torch
    labels = dict(labels or {})
    total = common.checkpoint_bytes(quick, tiny)
    layout = common.checkpoint_layout(total)
    rounds = common.rounds_for(quick, tiny, 15, 7)
    if comfy is None:
        records = stand_in(layout, rounds, labels)
    else:
        records = comfyui(comfy, layout, rounds, labels)
    if torch.cuda.is_available():
        records += cuda_copies(layout, rounds, labels)
    else:
        records.append(common.skipped_record(CASE, "no CUDA device: pinned versus pageable not measured",
                                             path="cuda", **labels))
    return records


def _model_tensors(layout, device="cpu"):
    import torch
    dtypes = {"F16": torch.float16, "BF16": torch.bfloat16}
    return {name: torch.full(shape, 0.5, dtype=dtypes[dtype], device=device) for name, shape, dtype in layout}


def _flat_pair(nbytes):
    import torch
    return torch.full((nbytes,), 7, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)


def _cycles(rounds, load, unload, floor, sync=lambda: None):
    """Per-round seconds of ``load``, ``unload`` and ``floor`` (the floor first in even rounds, last in odd ones)."""
    times = {"load": [], "unload": [], "floor": []}

    def cycle(record):
        for name, step in (("load", load), ("unload", unload)):
            seconds = common.timed(lambda: (step(), sync()))
            if record:
                times[name].append(seconds)

    with common.gc_paused():
        for index in range(rounds + 1):
            record = index > 0
            if index % 2 == 0:
                floor_s = common.timed(lambda: (floor(), sync()))
                cycle(record)
            else:
                cycle(record)
                floor_s = common.timed(lambda: (floor(), sync()))
            if record:
                times["floor"].append(floor_s)
    return times


def stand_in(layout, rounds, labels):
    """``load_models_gpu`` / ``free_memory`` on the 0.27.0 stand-in with comfy_memx's events; see the docstring."""
    from comfy_memx.core import registry
    from comfy_memx.core.state import STATE
    from comfy_memx.core.bootstrap import bootstrap
    from bench.common import STAND_IN_0270
    STATE.reset()
    bootstrap("bench", {"COMFY_MEMX_LEAK_MODE": "off"})
    root = STAND_IN_0270
    if root not in sys.path:
        sys.path.insert(0, root)
    import torch
    import comfy.model_management as mm
    import comfy.model_patcher
    events = []
    STATE.events.subscribe(events.append)
    try:
        module = torch.nn.Module()
        for index, tensor in enumerate(_model_tensors(layout).values()):
            module.register_parameter(f"w{index}", torch.nn.Parameter(tensor, requires_grad=False))
        records = _measure_patcher(mm, comfy.model_patcher.ModelPatcher, module, rounds, events,
                                   dict(labels, path="stand-in 0.27.0 (simulated GPU: RAM copies)"))
    finally:
        registry.remove_all()
        STATE.reset()
    return records


def comfyui(comfy, layout, rounds, labels):
    """The same cycle through a real ComfyUI's model management (skipped when it runs on the CPU)."""
    import torch
    mm = comfy.model_management
    device = mm.get_torch_device()
    path = f"ComfyUI {comfy.version}"
    if device.type == "cpu":
        return [common.skipped_record(CASE, "ComfyUI runs on the CPU (--cpu): load_models_gpu moves no bytes",
                                      path=path, **labels)]
    from comfy_memx.core.state import STATE
    events = []
    STATE.events.subscribe(events.append)
    module = torch.nn.ModuleList()
    for tensor in _model_tensors(layout).values():
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(tensor, requires_grad=False)
        module.append(layer)
    pinned = getattr(mm, "MAX_PINNED_MEMORY", -1) > 0
    try:
        return _measure_patcher(mm, comfy.model_patcher.ModelPatcher, module, rounds, events,
                                dict(labels, path=path, device=str(device), pinned_memory=pinned),
                                sync=torch.cuda.synchronize if device.type == "cuda" else lambda: None)
    finally:
        STATE.events.unsubscribe(events.append)


def _measure_patcher(mm, patcher_class, module, rounds, events, labels, sync=lambda: None):
    device = mm.get_torch_device()
    patcher = patcher_class(module, load_device=device, offload_device=mm.unet_offload_device())
    nbytes = patcher.model_size()
    source, target = _flat_pair(nbytes)
    times = _cycles(rounds, lambda: mm.load_models_gpu([patcher]), lambda: mm.free_memory(1e30, device),
                    lambda: target.copy_(source), sync)
    loads = [e for e in events if e["event"] == "load" and e.get("bytes")]
    unloads = [e for e in events if e["event"] == "unload" and e.get("bytes")]
    floor_is = "flat copy_ of the same bytes, resident buffers"
    records = [
        common.rate_record(CASE, "ram_to_device_gb_per_s", nbytes, times["load"], times["floor"],
                           call="load_models_gpu", floor_is=floor_is, **labels),
        common.rate_record(CASE, "device_to_ram_gb_per_s", nbytes, times["unload"], times["floor"],
                           call="free_memory", floor_is=floor_is, **labels),
        common.rate_record(CASE, "flat_copy_gb_per_s", nbytes, times["floor"], **labels),
    ]
    for metric, found in (("event_load_gb_per_s", loads[-rounds:]), ("event_unload_gb_per_s", unloads[-rounds:])):
        if found:
            median, low, high = common.spread([e["gb_per_s"] for e in found if e["gb_per_s"] is not None])
            records.append(common.record(CASE, metric, median, "GB/s", min=low, max=high, events=len(found),
                                         event_bytes=found[-1]["bytes"], bytes=nbytes,
                                         note="from comfy_memx's load/unload events (model_load/model_unload only)",
                                         **labels))
    del patcher
    return records


def cuda_copies(layout, rounds, labels):
    """Per-tensor H2D and D2H copies from pinned and pageable memory against flat pinned copies (CUDA only)."""
    import torch
    device = torch.device("cuda")
    pageable = _model_tensors(layout)
    pinned = {name: tensor.pin_memory() for name, tensor in pageable.items()}
    on_device = {name: torch.empty_like(tensor, device=device) for name, tensor in pageable.items()}
    nbytes = sum(t.nbytes for t in pageable.values())
    flat_host = torch.full((nbytes,), 7, dtype=torch.uint8).pin_memory()
    flat_device = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def copy_all(targets, sources, non_blocking):
        def run_copies():
            for name, tensor in targets.items():
                tensor.copy_(sources[name], non_blocking=non_blocking)
            torch.cuda.synchronize()
        return run_copies

    def flat(target, source):
        def run_copy():
            target.copy_(source, non_blocking=True)
            torch.cuda.synchronize()
        return run_copy

    times = common.interleaved({
        "h2d_pinned": copy_all(on_device, pinned, True),
        "h2d_pageable": copy_all(on_device, pageable, False),
        "h2d_flat_pinned": flat(flat_device, flat_host),
        "d2h_pinned": copy_all(pinned, on_device, True),
        "d2h_pageable": copy_all(pageable, on_device, False),
        "d2h_flat_pinned": flat(flat_host, flat_device),
    }, rounds)
    name = torch.cuda.get_device_name(0)
    base = dict(labels, path="cuda", gpu=name, tensors=len(layout))
    records = []
    for direction in ("h2d", "d2h"):
        for memory in ("pinned", "pageable"):
            extra = {"target_min": PINNED_TARGET} if (direction, memory) == ("h2d", "pinned") else {}
            records.append(common.rate_record(CASE, f"{direction}_gb_per_s", nbytes, times[f"{direction}_{memory}"],
                                              times[f"{direction}_flat_pinned"], memory=memory,
                                              floor_is="flat pinned copy_ of the same bytes", **extra, **base))
        records.append(common.rate_record(CASE, f"{direction}_flat_gb_per_s", nbytes,
                                          times[f"{direction}_flat_pinned"], memory="pinned", **base))
    records.append(common.ratio_record(CASE, "d2h_pinned_over_pageable", times["d2h_pageable"], times["d2h_pinned"],
                                       target_min=D2H_PINNED_OVER_PAGEABLE, **base))
    return records


if __name__ == "__main__":
    import json
    for line in run(quick="--quick" in sys.argv[1:], tiny="--tiny" in sys.argv[1:]):
        print(json.dumps(line))
