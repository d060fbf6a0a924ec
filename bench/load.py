"""Case ``load``: GB/s of loading a checkpoint from the page cache (warm) and from disk (cold), next to same-run floors.

The checkpoint is generated into a temporary folder: about 1250 fp16/bf16 tensors shaped like a diffusion model,
2 GiB (256 MiB with ``--quick``).  A load is what ComfyUI does with a checkpoint file: the loader call
(``comfy.utils.load_torch_file`` of the given ComfyUI tree, else ``safetensors.torch.load_file``) followed by
``copy_`` of every tensor into the model's resident tensors (``load_state_dict``); with safetensors' memory map the
bytes are only read during that copy, so timing the call alone would measure nothing.

Variants, interleaved in each round (order rotated):

* warm: the default path (and ``safetensors.load_file`` next to ComfyUI's loader); ``memcpy`` (resident ``copy_``
  of the same tensors: the floor of a page-cache load, which costs at least one copy per byte); ``raw_read``
  (``readinto`` of the whole file into one reused buffer); ``call_only`` (the loader call without the copy);
* cold (the file's pages dropped with ``POSIX_FADV_DONTNEED`` before each load): the default path, safetensors'
  ``pread`` backend (0.7+), and ``raw_read`` as the floor.

Targets (performance-anchors.md T8): warm default path >= 0.6 x memcpy; cold >= 0.9 x raw read.
Run ``python -m bench.load [--quick]`` for JSON lines, or through ``bench/run.py``.
"""

import os
import sys
import time

from bench import common

CASE = "load"
WARM_TARGET = 0.6
COLD_TARGET = 0.9


def _materialize(dest, state_dict):
    for name, tensor in dest.items():
        tensor.copy_(state_dict[name])


def default_loader(comfy_utils=None):
    """(label, load(path) -> state dict): ComfyUI's ``load_torch_file`` when given, else safetensors' ``load_file``."""
    if comfy_utils is not None:
        return "comfy.utils.load_torch_file", comfy_utils.load_torch_file
    from safetensors.torch import load_file
    return "safetensors.load_file", load_file


def pread_loader():
    """safetensors' ``pread`` backend (reads into allocated tensors: no memory map), or None when unsupported."""
    from safetensors.torch import load_file
    try:
        import inspect
        if "backend" not in inspect.signature(load_file).parameters:
            return None
    except (TypeError, ValueError):
        return None
    return lambda path: load_file(path, backend="pread")


def run(quick=False, tiny=False, workspace=None, comfy_utils=None, labels=None):
    """Generate the checkpoint, time the warm and cold variants, and return the records of case ``load``."""
    import torch
    from safetensors.torch import load_file
    labels = dict(labels or {})
    warm_rounds = common.rounds_for(quick, tiny, 15, 15)
    cold_rounds = common.rounds_for(quick, tiny, 5, 3)
    with common.workspace_for(workspace) as ws:
        path, layout = ws.checkpoint(common.checkpoint_bytes(quick, tiny))
        file_bytes = os.path.getsize(path)
        label, loader = default_loader(comfy_utils)
        resident = {name: tensor.clone() for name, tensor in load_file(path).items()}
        nbytes = sum(t.nbytes for t in resident.values())
        dest = {name: torch.zeros_like(tensor) for name, tensor in resident.items()}
        base = dict(labels, tensors=len(layout), file_bytes=file_bytes)

        def load_default():
            _materialize(dest, loader(path))

        def load_lazy_only():
            loader(path)

        variants = {"default": load_default, "memcpy": lambda: _materialize(dest, resident),
                    "raw_read": lambda: common.sequential_read(path), "call_only": load_lazy_only}
        if comfy_utils is not None:
            variants["safetensors"] = lambda: _materialize(dest, load_file(path))
        warm = common.interleaved(variants, warm_rounds)
        del resident
        records = [
            common.rate_record(CASE, "warm_gb_per_s", nbytes, warm["default"], warm["memcpy"], path=label,
                               floor_is="memcpy (resident copy_ of the same tensors)", target_min=WARM_TARGET, **base),
            common.rate_record(CASE, "warm_gb_per_s", file_bytes, warm["raw_read"], warm["memcpy"], floor_bytes=nbytes,
                               path="raw_read", floor_is="memcpy (resident copy_ of the same tensors)", **base),
            common.rate_record(CASE, "memcpy_gb_per_s", nbytes, warm["memcpy"], path="resident copy_", **base),
            *([common.rate_record(CASE, "warm_gb_per_s", nbytes, warm["safetensors"], warm["memcpy"],
                                  path="safetensors.load_file", floor_is="memcpy (resident copy_ of the same tensors)",
                                  **base)] if "safetensors" in warm else []),
            common.seconds_record(CASE, "loader_call_s", warm["call_only"], path=label,
                                  note="the loader call alone; with a memory map no byte is read yet", **base),
        ]

        dropped = common.drop_page_cache(path)
        cold_variants = {"default": (load_default, lambda: common.drop_page_cache(path)),
                         "raw_read": (lambda: common.sequential_read(path), lambda: common.drop_page_cache(path))}
        pread = pread_loader()
        if pread is not None:
            cold_variants["pread"] = (lambda: _materialize(dest, pread(path)), lambda: common.drop_page_cache(path))
        cold = common.interleaved(cold_variants, cold_rounds, warmup=0)
        cold_note = {} if dropped else {"note": "posix_fadvise unavailable: these reads were warm"}
        records += [
            common.rate_record(CASE, "cold_gb_per_s", nbytes, cold["default"], cold["raw_read"], floor_bytes=file_bytes,
                               path=label, floor_is="raw sequential read of the file, cold", target_min=COLD_TARGET,
                               **cold_note, **base),
            common.rate_record(CASE, "cold_gb_per_s", file_bytes, cold["raw_read"], path="raw_read", **cold_note,
                               **base),
        ]
        if pread is not None:
            records.append(common.rate_record(CASE, "cold_gb_per_s", nbytes, cold["pread"], cold["raw_read"],
                                              floor_bytes=file_bytes, path="safetensors.load_file(backend=pread)",
                                              floor_is="raw sequential read of the file, cold", **cold_note, **base))
        del dest
    return records


if __name__ == "__main__":
    import json
    started = time.time()
    for line in run(quick="--quick" in sys.argv[1:], tiny="--tiny" in sys.argv[1:]):
        print(json.dumps(line))
    print(f"# {time.time() - started:.1f} s", file=sys.stderr)
