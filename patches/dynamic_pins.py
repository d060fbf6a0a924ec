"""Wraps DynamicVRAM's per-layer pin, ``comfy.pinned_memory.pin_memory``, so that it counts against comfy_memx's cap.

With DynamicVRAM (comfy-aimdo) weights are pinned layer by layer while a model runs, through
``comfy.pinned_memory.pin_memory(module, subset="weights", size=None)``, not through the legacy
``comfy.model_management.pin_memory``.  Each such pin is asked of the same process-wide budget as the legacy ones
(``comfy_memx.pins.session``): granted, granted after other models' pins were unregistered or freed most recently used
first, or refused (the wrapper then returns False, as ComfyUI does when its own budget says no).  What ComfyUI
really registered is read from the growth of ``TOTAL_PINNED_MEMORY``, so a pin moved between layers of one model
(ComfyUI's pin stealing) or declined is given back.  Budgeting starts only once the ``pinned_memory`` patch has
applied the cap to ``comfy.model_management`` (so never on CPU-only machines, and not with
``COMFY_MEMX_DISABLE=pinned_memory``).  Checked against ComfyUI 0.27.0; 0.3.64 has no ``comfy.pinned_memory``.
Settings: ``COMFY_MEMX_PIN_LIMIT``, ``COMFY_MEMX_PIN_SCOPE``, ``COMFY_MEMX_DISABLE=dynamic_pins``.
"""

import sys

from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.pins import session as pinning


def _call_parts(args, kwargs):
    module = args[0] if args else kwargs["module"]
    subset = args[1] if len(args) > 1 else kwargs.get("subset", "weights")
    size = args[2] if len(args) > 2 else kwargs.get("size")
    return module, subset, size


def _memx_pin_memory(pm, original, switch):
    def pin_memory(*args, **kwargs):
        mm = sys.modules.get("comfy.model_management")
        if not switch.on or mm is None or not pinning.managing(mm):
            return original(*args, **kwargs)
        with pinning.PIN_LOCK:
            grant = None
            try:
                grant = pinning.before_module_pin(*_call_parts(args, kwargs))
            except Exception as exc:
                internal_error("dynamic pin budget", exc)
            if grant is pinning.REFUSED:
                return False
            if grant is None:
                return original(*args, **kwargs)
            try:
                return original(*args, **kwargs)
            finally:
                try:
                    pinning.after_module_pin(grant)
                except Exception as exc:
                    internal_error("dynamic pin budget", exc)
    return pin_memory


class DynamicPinsPatch(Patch):
    """DynamicVRAM's per-layer pin in ``comfy.pinned_memory``, under comfy_memx's budget."""

    name = "dynamic_pins"
    target = "comfy.pinned_memory"
    sites = {"pin_memory": _memx_pin_memory}


PATCH = DynamicPinsPatch()
