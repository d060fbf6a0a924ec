"""The ``file_load`` event of one checkpoint load (``comfy.utils.load_torch_file``): which file, its format, bytes,
tensors, device, seconds, rate, whether its tensors are still lazy, and its owner (as in the ledger).

``bytes`` is the file size from one ``os.stat`` after the load: what the loader had to read, header included, at a
constant few microseconds (summing the returned tensors' ``nbytes`` would cost 0.1-0.2 ms per 1250 tensors and miss
what a ``state_dict`` unwrap drops).  ``lazy`` is true when the returned tensors still point into a memory map of the
file (safetensors' default, the 0.27.0 aimdo reader, or ``--mmap-torch-files``): their bytes are read on first use
(``load_state_dict`` copying them into the model, or the model's move to the device, which the ``load`` event
times), so ``gb_per_s`` then measures mapping the file, not reading it.  The file is never read again.
"""

import os

from comfy_memx.core.state import STATE
from comfy_memx.ledger.attribution import current_owner

SAFETENSORS_SUFFIXES = (".safetensors", ".sft")


def file_loaded(utils, args, kwargs, result, seconds, caller_frame):
    """Emit the ``file_load`` event of ``utils.load_torch_file(*args, **kwargs)`` that returned ``result`` after
    ``seconds``, called from ``caller_frame`` (its owner).  Only called when the event stream has a listener."""
    STATE.events.emit("file_load", **file_load_fields(utils, args, kwargs, result, seconds),
                      owner=current_owner(caller_frame)._asdict())


def file_load_fields(utils, args, kwargs, result, seconds):
    """The ``file_load`` event fields (all but ``owner``) of one ``load_torch_file(*args, **kwargs)`` call."""
    path = args[0] if args else kwargs.get("ckpt")
    device = args[2] if len(args) > 2 else kwargs.get("device")
    state_dict = result[0] if type(result) is tuple else result  # (sd, metadata) with return_metadata
    fmt = file_format(path, state_dict)
    nbytes = file_size(path)
    return {"file": os.path.basename(os.fspath(path)), "format": fmt, "bytes": nbytes,
            "tensors": len(state_dict) if isinstance(state_dict, dict) else None,
            "device": "cpu" if device is None else str(device), "seconds": round(seconds, 6),
            "gb_per_s": round(nbytes / seconds / 1e9, 3) if nbytes and seconds > 0 else None,
            "lazy": is_lazy(fmt, state_dict, getattr(utils, "MMAP_TORCH_FILES", False))}


def file_format(path, state_dict):
    """``safetensors`` for a ``.safetensors``/``.sft`` path (ComfyUI's test), ``pickle`` for a dict, else ``other``."""
    if os.fspath(path).lower().endswith(SAFETENSORS_SUFFIXES):
        return "safetensors"
    return "pickle" if isinstance(state_dict, dict) else "other"


def file_size(path):
    """Size in bytes of the file at ``path`` (one ``os.stat``), None when it cannot be read."""
    try:
        return os.stat(path).st_size
    except (OSError, TypeError, ValueError):
        return None


def is_lazy(fmt, state_dict, mmap_torch_files):
    """True when the state dict's tensors still live in a memory map of the file (bytes not read yet).

    safetensors and aimdo tensors are views of the map: their CPU storage is not resizable, unlike the storage of a
    copy (``--disable-mmap``) or a tensor on another device.  ``torch.load`` storages are never resizable, so a pickle
    file counts as lazy exactly when ComfyUI passed ``mmap=True`` (``--mmap-torch-files``) and loaded to the CPU.
    """
    tensor = _first_tensor(state_dict)
    if tensor is None or tensor.device.type != "cpu":
        return False
    if fmt == "safetensors":
        return not tensor.untyped_storage().resizable()
    return fmt == "pickle" and bool(mmap_torch_files)


def _first_tensor(state_dict, look_at=8):
    if not isinstance(state_dict, dict):
        return None
    for _, value in zip(range(look_at), state_dict.values()):
        if hasattr(value, "untyped_storage") and value.nbytes:
            return value
    return None
