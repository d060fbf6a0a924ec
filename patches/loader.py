"""Wraps ComfyUI's checkpoint loader ``comfy.utils.load_torch_file`` so each file load becomes a ``file_load`` event.

ComfyUI logs how many megabytes it moved, never how long a file took to load.  With an event log or a subscriber
present, every call records ``file`` (basename), ``format`` (``safetensors`` for ``.safetensors``/``.sft`` paths,
``pickle`` for what ``torch.load`` returned as a dict, else ``other``), ``bytes``, ``tensors``, ``device``,
``seconds``, ``gb_per_s``, ``lazy`` and ``owner`` (as in the ledger).

Fires ``file_loaded`` (``comfy_memx.core.signals``); the event's fields, and why they cost what they cost, are
``comfy_memx.ledger.fileloads``'s.  With no event
listener the wrapper checks that and calls through.

Checked against ComfyUI 0.3.64, 0.27.0 and 0.33.0 (all three ``load_torch_file(ckpt, safe_load=False, device=None,
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

from comfy_memx.core import signals
from comfy_memx.core.patching import Patch
from comfy_memx.core.state import STATE


def _memx_load_torch_file(utils, original, switch):
    def load_torch_file(*args, **kwargs):
        if not switch.on or not STATE.events.wanted:
            return original(*args, **kwargs)
        start = perf_counter()
        result = original(*args, **kwargs)
        signals.file_loaded.fire(utils, args, kwargs, result, perf_counter() - start, sys._getframe(1))
        return result
    return load_torch_file


class LoaderPatch(Patch):
    """``file_load`` events from ComfyUI's checkpoint loader in ``comfy.utils``."""

    name = "loader"
    target = "comfy.utils"
    sites = {"load_torch_file": _memx_load_torch_file}


PATCH = LoaderPatch()
