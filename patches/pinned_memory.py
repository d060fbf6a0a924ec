"""Wraps ComfyUI's pinned-memory functions in ``comfy.model_management`` so that pins stay within comfy_memx's cap.

Sites: ``pin_memory`` / ``unpin_memory`` (legacy tensor pinning by ``ModelPatcher.pin_weight_to_device`` /
``unpin_weight``: each pin is asked of the budget, evicting other models' pins most recently used first or being
refused; each unpin is given back), ``ensure_pin_budget`` / ``ensure_pin_registerable`` (ComfyUI's own checks,
passed through; they keep comfy_memx's view of the current load in step), ``free_pins`` / ``free_registrations``
(ComfyUI's eviction of DynamicVRAM pins: on 0.27.0 their least-recently-used walk is replaced by a most-recently-
used one that spares the load in progress; newer releases, which walk MRU first already, are passed through).
:func:`adopt` sets ``MAX_PINNED_MEMORY`` to comfy_memx's cap right after import, only where ComfyUI turned pinning
on itself (an NVIDIA or AMD GPU and no ``--disable-pinned-memory``; on CPU-only machines it stays -1), and logs
the cap with its source; ``unpatch`` puts ComfyUI's value back.  Every eviction and refusal is a ``pin_evict`` /
``pin_refused`` event.  Checked against ComfyUI 0.27.0 (all six sites) and 0.3.64 (no pinning: every site is
skipped as absent).  The DynamicVRAM pin itself is ``comfy_memx.patches.dynamic_pins``.
Settings: ``COMFY_MEMX_PIN_LIMIT`` (auto, off, a size or a percentage of RAM), ``COMFY_MEMX_PIN_SCOPE``
(process or host), ``COMFY_MEMX_DISABLE=pinned_memory``.
"""

import logging
import sys

from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.pins import session as pinning

log = logging.getLogger("comfy_memx")


def _memx_pin_memory(mm, original, switch):
    def pin_memory(*args, **kwargs):
        if not switch.on or not pinning.managing(mm):
            return original(*args, **kwargs)
        with pinning.PIN_LOCK:
            grant = None
            try:
                tensor = args[0] if args else kwargs["tensor"]
                grant = pinning.before_tensor_pin(tensor, sys._getframe(1))
            except Exception as exc:
                internal_error("pin budget", exc)
            if grant is pinning.REFUSED:
                return False
            if grant is None:
                return original(*args, **kwargs)
            pinned = False
            try:
                pinned = original(*args, **kwargs)
                return pinned
            finally:
                try:
                    pinning.after_tensor_pin(grant, pinned)
                except Exception as exc:
                    internal_error("pin budget", exc)
    return pin_memory


def _memx_unpin_memory(mm, original, switch):
    def unpin_memory(*args, **kwargs):
        if not switch.on or not pinning.managing(mm):
            return original(*args, **kwargs)
        known = None
        try:
            known = pinning.before_tensor_unpin(args[0] if args else kwargs["tensor"])
        except Exception as exc:
            internal_error("pin budget", exc)
        result = original(*args, **kwargs)
        if known is not None:
            try:
                pinning.after_tensor_unpin(known, result)
            except Exception as exc:
                internal_error("pin budget", exc)
        return result
    return unpin_memory


def _memx_pin_check(mm, original, switch):
    def pin_check(*args, **kwargs):
        if switch.on and pinning.managing(mm):
            try:
                pinning.note_pin_check()
            except Exception as exc:
                internal_error("pin load tracking", exc)
        return original(*args, **kwargs)
    return pin_check


def _arguments(args, kwargs, names, defaults):
    """The 0.27.0 parameters ``names`` of a call, or None when it carries anything else (then passed through)."""
    if len(args) > len(names) or set(kwargs) - set(names[len(args):]):
        return None
    values = dict(zip(names, args), **kwargs)
    if names[0] not in values:
        return None
    return [values.get(name, defaults.get(name)) for name in names]


def _memx_free_registrations(mm, original, switch):
    def free_registrations(*args, **kwargs):
        call = None
        if switch.on and pinning.reorders_eviction(mm):
            call = _arguments(args, kwargs, ("shortfall", "evict_active"), {"evict_active": True})
        if call is None:
            return original(*args, **kwargs)
        try:
            return pinning.free_registrations_mru(mm, *call)
        except Exception as exc:
            internal_error("MRU free_registrations", exc)
            return original(*args, **kwargs)
    return free_registrations


def _memx_free_pins(mm, original, switch):
    def free_pins(*args, **kwargs):
        call = None
        if switch.on and pinning.reorders_eviction(mm):
            call = _arguments(args, kwargs, ("size", "evict_active"), {"evict_active": False})
        if call is None:
            return original(*args, **kwargs)
        try:
            return pinning.free_pins_mru(mm, *call)
        except Exception as exc:
            internal_error("MRU free_pins", exc)
            return original(*args, **kwargs)
    return free_pins


class PinnedMemoryPatch(Patch):
    """ComfyUI's pin functions and cap in ``comfy.model_management``, under comfy_memx's budget."""

    name = "pinned_memory"
    target = "comfy.model_management"
    sites = {
        "pin_memory": _memx_pin_memory,
        "unpin_memory": _memx_unpin_memory,
        "ensure_pin_budget": _memx_pin_check,
        "ensure_pin_registerable": _memx_pin_check,
        "free_pins": _memx_free_pins,
        "free_registrations": _memx_free_registrations,
    }

    def before_unpatch(self, module):
        """Put ComfyUI's own ``MAX_PINNED_MEMORY`` back and stop budgeting pins."""
        if pinning.started_for(module):
            module.MAX_PINNED_MEMORY = pinning.comfyui_max()
            pinning.stop()

    def adopt(self, module):
        """Right after import: put comfy_memx's cap into ``MAX_PINNED_MEMORY`` where ComfyUI enabled pinning, and
        log it.

        Leaves ComfyUI alone where it did not enable pinning (``MAX_PINNED_MEMORY`` <= 0: CPU-only, non-NVIDIA/AMD,
        ``--disable-pinned-memory``) or has no pinning at all (0.3.64).  ``COMFY_MEMX_PIN_LIMIT=off`` sets it to 0.
        """
        comfyui_value = getattr(module, "MAX_PINNED_MEMORY", None)
        if comfyui_value is None or pinning.started_for(module):
            return
        if comfyui_value <= 0:
            log.debug("comfy_memx: pinned memory stays off (ComfyUI did not enable it: no NVIDIA/AMD GPU, or "
                      "--disable-pinned-memory)")
            return
        cap = pinning.start(module)
        module.MAX_PINNED_MEMORY = cap.bytes
        log.info(pinning.startup_line())


PATCH = PinnedMemoryPatch()
