"""The pin wing's one door: what the patch modules (``patches/pinned_memory.py``, ``patches/dynamic_pins.py``,
through the guarded facade ``comfy_memx.pins.facade``), the other wings and the benches call of it, one small,
stable API over the pin package, so that moving code between its modules never touches a caller.

Life cycle: :func:`start`, :func:`stop`, :func:`managing`, :func:`started_for`, :func:`comfyui_max`,
:func:`startup_line`, :func:`start_budget` / :func:`stop_budget` (the patch's adopt and unpatch). Decisions (callers
hold :func:`pin_lock`): :func:`before_tensor_pin` / :func:`after_tensor_pin`, :func:`before_layer_pin` /
:func:`after_layer_pin`, :func:`before_reregister`; :data:`REFUSED` is the answer that makes a wrapper reply as
ComfyUI does when it cannot pin. Bookkeeping: :func:`before_tensor_unpin` / :func:`after_tensor_unpin`,
:func:`note_pin_check`, :func:`after_comfyui_eviction`, :func:`after_node_reset` (the reactions to loads and unloads
are ``pins.loadscope``'s, subscribed while a session runs). Eviction order: :func:`reorders_eviction`,
:func:`free_pins_mru`, :func:`free_registrations_mru`. Reading a layer's pin cheaply (hot path of ``get_pin``):
:func:`layer_pin`. What the surface and the benches read: :func:`budget` (the pin budget in force, or None),
:func:`cap` (the cap in force, or None), :func:`comfyui_max`, :func:`managing`, :func:`current` (the pin session, or
None) and :data:`UNATTRIBUTED` (the budget's owner of pins no model claims).
"""

import logging

from comfy_memx.pins.eviction import (after_comfyui_eviction, after_node_reset, free_pins_mru,  # noqa: F401
                                      free_registrations_mru, reorders_eviction)
from comfy_memx.pins.layout import layer_pin  # noqa: F401
from comfy_memx.pins.loadscope import sync_load_scope
from comfy_memx.pins.requests import (after_layer_pin, after_tensor_pin, after_tensor_unpin,  # noqa: F401
                                      before_layer_pin, before_reregister, before_tensor_pin, before_tensor_unpin)
from comfy_memx.pins.context import REFUSED, UNATTRIBUTED, current, pin_lock  # noqa: F401
from comfy_memx.pins.session import (budget, cap, comfyui_max, managing, start, started_for,  # noqa: F401
                                     startup_line, stop)

log = logging.getLogger("comfy_memx")


def note_pin_check():
    """Called by the ``ensure_pin_budget`` / ``ensure_pin_registerable`` wrappers: keeps the current load in step
    (a load that pins nothing still marks its models as most recently used)."""
    state = current()
    if state is not None:
        sync_load_scope(state)


def start_budget(mm):
    """Right after ComfyUI's ``comfy.model_management`` (``mm``) is imported: where ComfyUI enabled pinning itself
    (``MAX_PINNED_MEMORY`` > 0), start the budget and return comfy_memx's cap in bytes (the patch puts it into
    ``MAX_PINNED_MEMORY``); None where ComfyUI did not enable pinning, has none (0.3.64) or the budget runs
    already."""
    comfyui_value = getattr(mm, "MAX_PINNED_MEMORY", None)
    if comfyui_value is None or started_for(mm):
        return None
    if comfyui_value <= 0:
        log.debug("comfy_memx: pinned memory stays off (ComfyUI did not enable it: no NVIDIA/AMD GPU, or "
                  "--disable-pinned-memory)")
        return None
    return start(mm).bytes


def stop_budget(mm):
    """Before ``comfy.model_management`` (``mm``) is unpatched: stop budgeting pins and return ComfyUI's own
    ``MAX_PINNED_MEMORY`` for the patch to put back (None when the budget never started for ``mm``)."""
    if not started_for(mm):
        return None
    comfyui_value = comfyui_max()
    stop()
    return comfyui_value
