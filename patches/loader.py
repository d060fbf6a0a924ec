"""Wraps ComfyUI's checkpoint loader ``comfy.utils.load_torch_file`` so each file load becomes a ``file_load`` event.

ComfyUI logs how many megabytes it moved, never how long a file took to load.  With an event log or a subscriber
present, every call records ``file`` (basename), ``format`` (``safetensors`` for ``.safetensors``/``.sft`` paths,
``pickle`` for what ``torch.load`` returned as a dict, else ``other``), ``bytes``, ``tensors``, ``device``,
``seconds``, ``gb_per_s``, ``lazy`` and ``owner`` (as in the ledger).

The event's fields, and why they cost what they cost, are ``comfy_memx.ledger.fileloads``'s.  With no event
listener the wrapper checks that and calls through.

Checked against ComfyUI 0.3.64 and 0.27.0 (both ``load_torch_file(ckpt, safe_load=False, device=None,
return_metadata=False)``; 0.27.0 reads through ``load_safetensors`` when aimdo is enabled, which this wrapper covers
because ``load_torch_file`` calls it).  Return values and exceptions (including ComfyUI's rewritten "corrupt or
incomplete" ``ValueError``) pass through untouched.
# COMFY: ``comfy/clip_vision.py`` (and 0.27.0 ``comfy/bg_removal_model.py``) bind ``from .utils import
load_torch_file`` when they are imported; the post-import hook patches ``comfy.utils`` before they are, so those
aliases get the wrapper too (not with a late activation from a custom node).
Settings: ``COMFY_MEMX_EVENTS`` (no listener: no event work), ``COMFY_MEMX_DISABLE=loader``.
"""

import sys
from time import perf_counter

from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.core.state import STATE
from comfy_memx.ledger import api as ledger


def _memx_load_torch_file(utils, original, switch):
    def load_torch_file(*args, **kwargs):
        if not switch.on or not STATE.events.wanted:
            return original(*args, **kwargs)
        start = perf_counter()
        result = original(*args, **kwargs)
        seconds = perf_counter() - start
        try:
            ledger.file_loaded(utils, args, kwargs, result, seconds, sys._getframe(1))
        except Exception as exc:
            internal_error("file load accounting", exc)
        return result
    return load_torch_file


class LoaderPatch(Patch):
    """``file_load`` events from ComfyUI's checkpoint loader in ``comfy.utils``."""

    name = "loader"
    target = "comfy.utils"
    sites = {"load_torch_file": _memx_load_torch_file}


PATCH = LoaderPatch()
