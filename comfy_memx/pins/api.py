"""The pin wing's one door: what the patch modules (``patches/pinned_memory.py``, ``patches/dynamic_pins.py``), the
other wings and the benches call of it, one small, stable API over the pin package, so that moving code between its
modules never touches a caller.

Life cycle: :func:`start`, :func:`stop`, :func:`managing`, :func:`started_for`, :func:`comfyui_max`,
:func:`startup_line`.  Decisions (callers hold :func:`pin_lock`): :func:`before_tensor_pin` /
:func:`after_tensor_pin`, :func:`before_layer_pin` / :func:`after_layer_pin`, :func:`before_reregister`;
:data:`REFUSED` is the answer that makes a wrapper reply as ComfyUI does when it cannot pin.  Bookkeeping:
:func:`before_tensor_unpin` / :func:`after_tensor_unpin`, :func:`note_pin_check`, :func:`after_comfyui_eviction`,
:func:`after_node_reset`, :func:`settle`.  Eviction order: :func:`reorders_eviction`, :func:`free_pins_mru`,
:func:`free_registrations_mru`.  Reading a layer's pin cheaply (hot path of ``get_pin``): :func:`layer_pin`.
What the surface and the benches read: :func:`budget` (the pin budget in force, or None), :func:`cap` (the cap in
force, or None), :func:`comfyui_max`, :func:`managing`, :func:`current` (the pin session, or None) and
:data:`UNATTRIBUTED` (the budget's owner of pins no model claims).
"""

from comfy_memx.core.errors import internal_error
from comfy_memx.pins import reconcile
from comfy_memx.pins.eviction import (after_comfyui_eviction, after_node_reset, free_pins_mru,  # noqa: F401
                                      free_registrations_mru, reorders_eviction)
from comfy_memx.pins.layout import layer_pin  # noqa: F401
from comfy_memx.pins.loadscope import sync_load_scope
from comfy_memx.pins.requests import (after_layer_pin, after_tensor_pin, after_tensor_unpin,  # noqa: F401
                                      before_layer_pin, before_reregister, before_tensor_pin, before_tensor_unpin)
from comfy_memx.pins.context import REFUSED, UNATTRIBUTED, current, pin_lock  # noqa: F401
from comfy_memx.pins.session import (budget, cap, comfyui_max, managing, start, started_for,  # noqa: F401
                                     startup_line, stop)


def call_granted(grant, refused_answer, after, original, args, kwargs):
    """Carry out one pin decision (taken under :func:`pin_lock` by the caller): :data:`REFUSED` answers
    ``refused_answer`` as ComfyUI does when it cannot pin, None calls ComfyUI unbudgeted, a grant calls ComfyUI and
    then ``after(grant, result)`` (an error there is comfy_memx's, logged once, never ComfyUI's)."""
    if grant is REFUSED:
        return refused_answer
    if grant is None:
        return original(*args, **kwargs)
    result = False
    try:
        result = original(*args, **kwargs)
        return result
    finally:
        try:
            after(grant, result)
        except Exception as exc:
            internal_error("pin budget", exc)


def note_pin_check():
    """Called by the ``ensure_pin_budget`` / ``ensure_pin_registerable`` wrappers: keeps the current load in step
    (a load that pins nothing still marks its models as most recently used)."""
    state = current()
    if state is not None:
        sync_load_scope(state)


def settle():
    """Settle the budget to ComfyUI's counters now (cheap when nothing moved behind comfy_memx's back).  For
    wrappers of paths that release pins without a pin function (an unload), and for readers."""
    state = current()
    if state is not None:
        reconcile.sync(state)


def budgeted(mm):
    """True when the pin budget decides for ``mm``; False when asking fails (our bug, logged once): ComfyUI then
    decides alone, as without comfy_memx.  The pin patches' guarded form of :func:`managing`."""
    try:
        return managing(mm)
    except Exception as exc:
        internal_error("pin budget", exc)
        return False


def decision_lock():
    """The lock of one pin decision at a time, or None when getting it fails (our bug, logged once).  The pin
    patches' guarded form of :func:`pin_lock`."""
    try:
        return pin_lock()
    except Exception as exc:
        internal_error("pin budget", exc)
        return None
