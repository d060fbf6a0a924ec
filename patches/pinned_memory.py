"""Wraps ComfyUI's pinned-memory functions in ``comfy.model_management`` so that pins stay within comfy_memx's cap
and comfy_memx's books equal ComfyUI's ``TOTAL_PINNED_MEMORY``.

Sites: ``pin_memory`` / ``unpin_memory`` (legacy tensor pinning by ``ModelPatcher.pin_weight_to_device`` /
``unpin_weight``: each pin is asked of the budget, evicting other models' pins most recently used first or being
refused; each unpin is booked back; 0.38's ``evict_active`` argument and its False answer pass through),
``ensure_pin_budget`` / ``ensure_pin_registerable`` (ComfyUI's own checks, passed through; they keep comfy_memx's
view of the current load in step), ``reset_cast_buffers`` (after every node; the patches pins it destroys are
booked), ``free_model_pins`` (0.33+: the eviction step of ComfyUI's tiered loops, passed through and booked),
``free_pins`` / ``free_registrations`` (ComfyUI's eviction of DynamicVRAM pins: on 0.27.0 their least-recently-used
walk is replaced by a most-recently-used one that spares the load in progress; newer releases, which walk MRU
first already, are passed through; every release is booked as a ``pin_evict`` event with ``by="comfyui"``).
:func:`adopt` sets ``MAX_PINNED_MEMORY`` to comfy_memx's cap right after import, only where ComfyUI turned pinning
on itself (an NVIDIA or AMD GPU and no ``--disable-pinned-memory``; on CPU-only machines it stays -1), and logs
the cap with its source; ``unpatch`` puts ComfyUI's value back.  Checked against ComfyUI 0.27.0 and 0.33.0 (real
trees, with the registration call faked: tests/real/test_real_pins.py), the 0.38 sources (pin_memory's new argument and
return, the fast subsets), and 0.3.64 (no pinning: every site is skipped as absent).  The DynamicVRAM pin itself is
``comfy_memx.patches.dynamic_pins``.  Every call into the pin wing goes through ``comfy_memx.pins.facade``, whose
guard answers what ComfyUI does alone when the wing fails (not budgeted, its own eviction walk, no bookkeeping).
Settings: ``COMFY_MEMX_PIN_LIMIT`` (auto, off, a size or a percentage of RAM), ``COMFY_MEMX_PIN_SCOPE``
(process or host), ``COMFY_MEMX_DISABLE=pinned_memory``.
"""

import logging
import sys

from comfy_memx.core.patching import Patch
from comfy_memx.pins.facade import FAILED, PINS as pins, REFUSED

log = logging.getLogger("comfy_memx")


def _tensor_pin_request(args, kwargs, caller):
    """The budget's answer to one ``pin_memory(tensor, evict_active=True)`` call (a grant, REFUSED or None)."""
    tensor = args[0] if args else kwargs["tensor"]
    evict_active = args[1] if len(args) > 1 else kwargs.get("evict_active", True)
    return pins.before_tensor_pin(tensor, caller, evict_active)


def _memx_pin_memory(mm, original, switch):
    def pin_memory(*args, **kwargs):
        if not switch.on or not pins.budgeted(mm):
            return original(*args, **kwargs)
        lock = pins.decision_lock()
        if lock is None:
            return original(*args, **kwargs)
        with lock:
            grant = _tensor_pin_request(args, kwargs, sys._getframe(1)) if args or "tensor" in kwargs else None
            if grant is REFUSED:
                return False   # COMFY: what pin_memory answers when it cannot pin
            if grant is None:
                return original(*args, **kwargs)
            result = False
            try:
                result = original(*args, **kwargs)
                return result
            finally:
                pins.after_tensor_pin(grant, result)
    return pin_memory


def _memx_unpin_memory(mm, original, switch):
    def unpin_memory(*args, **kwargs):
        if not switch.on or not pins.budgeted(mm) or not (args or "tensor" in kwargs):
            return original(*args, **kwargs)
        known = pins.before_tensor_unpin(args[0] if args else kwargs["tensor"])
        result = original(*args, **kwargs)
        if known is not None:
            pins.after_tensor_unpin(known, result)
        return result
    return unpin_memory


def _memx_pin_check(mm, original, switch):
    def pin_check(*args, **kwargs):
        if switch.on and pins.budgeted(mm):
            pins.note_pin_check()
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


def _booked(original, reason, call_args, call_kwargs):
    """Run one of ComfyUI's eviction functions unchanged, then book what it released."""
    try:
        return original(*call_args, **call_kwargs)
    finally:
        pins.after_comfyui_eviction(reason)


def _mru_instead(mm, original, switch, parameters, defaults, reason, mru):
    """A wrapper of one of ComfyUI's eviction walks: where the pin budget reorders eviction it runs ``mru`` (the
    most-recently-used walk that spares the load in progress) on the call's ``parameters``; otherwise, or when that
    fails, ComfyUI's own walk, booked as evictions of ``reason``."""
    def evict(*args, **kwargs):
        if not switch.on or not pins.budgeted(mm):
            return original(*args, **kwargs)
        call = _arguments(args, kwargs, parameters, defaults) if pins.reorders_eviction(mm) else None
        if call is None:
            return _booked(original, reason, args, kwargs)
        answer = mru(mm, *call)
        return _booked(original, reason, args, kwargs) if answer is FAILED else answer
    return evict


def _memx_free_registrations(mm, original, switch):
    return _mru_instead(mm, original, switch, ("shortfall", "evict_active"), {"evict_active": True}, "cap",
                        pins.free_registrations_mru)


def _memx_free_pins(mm, original, switch):
    return _mru_instead(mm, original, switch, ("size", "evict_active"), {"evict_active": False}, "ram_pressure",
                        pins.free_pins_mru)


def _memx_free_model_pins(mm, original, switch):
    def free_model_pins(*args, **kwargs):
        if not switch.on or not pins.budgeted(mm):
            return original(*args, **kwargs)
        registrations = kwargs.get("registrations", args[4] if len(args) > 4 else False)
        return _booked(original, "cap" if registrations else "ram_pressure", args, kwargs)
    return free_model_pins


def _memx_reset_cast_buffers(mm, original, switch):
    def reset_cast_buffers(*args, **kwargs):
        if not switch.on or not pins.budgeted(mm):
            return original(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            pins.after_node_reset()
    return reset_cast_buffers


class PinnedMemoryPatch(Patch):
    """ComfyUI's pin functions and cap in ``comfy.model_management``, under comfy_memx's budget."""

    name = "pinned_memory"
    target = "comfy.model_management"
    # Order matters for the startup line only: it names the skipped sites in this order.
    sites = {
        "pin_memory": _memx_pin_memory,
        "unpin_memory": _memx_unpin_memory,
        "ensure_pin_budget": _memx_pin_check,
        "ensure_pin_registerable": _memx_pin_check,
        "reset_cast_buffers": _memx_reset_cast_buffers,
        "free_model_pins": _memx_free_model_pins,
        "free_pins": _memx_free_pins,
        "free_registrations": _memx_free_registrations,
    }

    def before_unpatch(self, module):
        """Put ComfyUI's own ``MAX_PINNED_MEMORY`` back and stop budgeting pins."""
        comfyui_value = pins.stop_budget(module)
        if comfyui_value is not None:
            module.MAX_PINNED_MEMORY = comfyui_value

    def adopt(self, module):
        """Right after import: put comfy_memx's cap into ``MAX_PINNED_MEMORY`` where ComfyUI enabled pinning, and
        log it.

        Leaves ComfyUI alone where it did not enable pinning (``MAX_PINNED_MEMORY`` <= 0: CPU-only, non-NVIDIA/AMD,
        ``--disable-pinned-memory``) or has no pinning at all (0.3.64).  ``COMFY_MEMX_PIN_LIMIT=off`` sets it to 0.
        """
        cap_bytes = pins.start_budget(module)
        if cap_bytes is not None:
            module.MAX_PINNED_MEMORY = cap_bytes
            log.info(pins.startup_line())


PATCH = PinnedMemoryPatch()
