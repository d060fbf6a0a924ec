"""Wraps DynamicVRAM's per-layer pins in ``comfy.pinned_memory`` so that they count against comfy_memx's cap.

With DynamicVRAM (comfy-aimdo) weights are pinned layer by layer while a model runs, through
``comfy.pinned_memory.pin_memory(module, subset="weights", size=None)``, not through the legacy
``comfy.model_management.pin_memory``; ``get_pin(module, subset)``, called by ComfyUI's ops for every layer cast,
registers an existing pin again when an eviction had only unregistered it.  Sites:

* ``pin_memory``: each new pin is asked of the process-wide budget (``comfy_memx.pins``): granted, granted after
  other models' pins were unregistered or freed most recently used first, or refused (the wrapper then returns
  False without calling ComfyUI).  A layer that already has a pin in that subset (0.33+ ``module._pins[subset]``,
  0.27.0 ``module._pin``) never asks for room.
* ``get_pin``: a re-registration is asked of the budget the same way; refused, the wrapper returns the pin
  unregistered, as ComfyUI does when ``cudaHostRegister`` fails.  Every other call (no pin, or registered: the
  per-cast hot path) costs two dict lookups.

What ComfyUI really registered is read from its own per-subset counters after the call, so a pin moved between
layers of one model (ComfyUI's pin stealing), declined, or made while ComfyUI evicted another model's pins is
booked exactly.  Budgeting starts only once the ``pinned_memory`` patch has applied the cap to
``comfy.model_management`` (so never on CPU-only machines, and not with ``COMFY_MEMX_DISABLE=pinned_memory``).
The disable switch is ComfyUI's own (0.38 ``DISABLE_PINNED_MEMORY``, before ``--disable-pinned-memory``).
Checked against ComfyUI 0.27.0 and 0.33.0 (real trees, registration faked) and the 0.38 sources; 0.3.64 has no
``comfy.pinned_memory``.
Every call into the pin wing goes through ``comfy_memx.pins.facade``, whose guard answers what ComfyUI does alone
when the wing fails.
Settings: ``COMFY_MEMX_PIN_LIMIT``, ``COMFY_MEMX_PIN_SCOPE``, ``COMFY_MEMX_DISABLE=dynamic_pins``.
"""

import sys

from comfy_memx.core.patching import Patch
from comfy_memx.pins.facade import PINS as pins, REFUSED


def _call_parts(args, kwargs):
    module = args[0] if args else kwargs.get("module")
    subset = args[1] if len(args) > 1 else kwargs.get("subset", "weights")
    return module, subset


def _granted(grant, refused_answer, original, args, kwargs):
    """Carry out one pin decision (taken under the decision lock): REFUSED answers ``refused_answer`` as ComfyUI
    does when it cannot pin, None calls ComfyUI unbudgeted, a grant calls ComfyUI and books what it registered."""
    if grant is REFUSED:
        return refused_answer
    if grant is None:
        return original(*args, **kwargs)
    try:
        return original(*args, **kwargs)
    finally:
        pins.after_layer_pin(grant)


def _memx_pin_memory(pm, original, switch):
    def pin_memory(*args, **kwargs):
        mm = sys.modules.get("comfy.model_management")
        if not switch.on or mm is None or not pins.budgeted(mm):
            return original(*args, **kwargs)
        lock = pins.decision_lock()
        if lock is None:
            return original(*args, **kwargs)
        with lock:
            module, subset = _call_parts(args, kwargs)
            size = args[2] if len(args) > 2 else kwargs.get("size")
            grant = pins.before_layer_pin(module, subset, size) if module is not None else None
            return _granted(grant, False, original, args, kwargs)
    return pin_memory


def _memx_get_pin(pm, original, switch):
    def get_pin(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        module, subset = _call_parts(args, kwargs)
        if module is None:
            return original(*args, **kwargs)
        pin, registered = pins.layer_pin(module, subset)
        if pin is None or registered:
            return original(*args, **kwargs)
        mm = sys.modules.get("comfy.model_management")
        if mm is None or not pins.budgeted(mm):
            return original(*args, **kwargs)
        lock = pins.decision_lock()
        if lock is None:
            return original(*args, **kwargs)
        with lock:
            return _granted(pins.before_reregister(module, subset), pin, original, args, kwargs)
    return get_pin


class DynamicPinsPatch(Patch):
    """DynamicVRAM's per-layer pins in ``comfy.pinned_memory``, under comfy_memx's budget."""

    name = "dynamic_pins"
    target = "comfy.pinned_memory"
    sites = {"pin_memory": _memx_pin_memory, "get_pin": _memx_get_pin}


PATCH = DynamicPinsPatch()
