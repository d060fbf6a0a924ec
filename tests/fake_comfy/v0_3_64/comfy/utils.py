"""Stand-in for ``comfy/utils.py``: only ``load_torch_file`` (importing this module is what first imports torch).

Same behaviour and return shapes as ComfyUI's: ``.safetensors``/``.sft`` files are read tensor by tensor through
``safetensors.safe_open`` (mmap-backed unless ``--disable-mmap``), other files through ``torch.load`` with
``weights_only=True``, unwrapping a ``state_dict`` key or a single-key wrapper dict.
"""
import safetensors
import torch

from comfy.cli_args import args

MMAP_TORCH_FILES = args.mmap_torch_files
DISABLE_MMAP = args.disable_mmap


def load_torch_file(ckpt, safe_load=False, device=None, return_metadata=False):
    """Load a checkpoint into a state dict; returns ``sd`` or ``(sd, metadata)`` with ``return_metadata``."""
    if device is None:
        device = torch.device("cpu")
    metadata = None
    if ckpt.lower().endswith((".safetensors", ".sft")):
        with safetensors.safe_open(ckpt, framework="pt", device=device.type) as f:
            sd = {}
            for key in f.keys():
                tensor = f.get_tensor(key)
                if DISABLE_MMAP:
                    tensor = tensor.to(device=device, copy=True)
                sd[key] = tensor
            if return_metadata:
                metadata = f.metadata()
    else:
        extra = {"mmap": True} if MMAP_TORCH_FILES else {}
        pl_sd = torch.load(ckpt, map_location=device, weights_only=True, **extra)
        if "state_dict" in pl_sd:
            sd = pl_sd["state_dict"]
        elif len(pl_sd) == 1:
            sd = next(iter(pl_sd.values()))
            if not isinstance(sd, dict):
                sd = pl_sd
        else:
            sd = pl_sd
    return (sd, metadata) if return_metadata else sd
