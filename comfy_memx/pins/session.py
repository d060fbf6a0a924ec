"""The life cycle of comfy_memx's pin budget in this process.

One process-wide :class:`~comfy_memx.pins.budget.PinBudget` is built when ComfyUI's ``comfy.model_management`` has
been imported and turned pinning on (``MAX_PINNED_MEMORY > 0``): the cap comes from
:func:`comfy_memx.pins.cap.resolve_cap` on a host probe and ``COMFY_MEMX_PIN_LIMIT``; the scope from
``COMFY_MEMX_PIN_SCOPE``.  :func:`start` / :func:`stop` / :func:`managing` and the read accessors live here; the
state they manage, its locks and the rule for calling into the budget are in :mod:`~comfy_memx.pins.context`; what
happens on each of ComfyUI's pin paths is in :mod:`~comfy_memx.pins.requests` (pins asked of the budget),
:mod:`~comfy_memx.pins.eviction` (ComfyUI's own evictions) and :mod:`~comfy_memx.pins.reconcile` (the budget
follows ComfyUI's own counters); the patch modules reach all of them through :mod:`comfy_memx.pins.api`.

Imports no torch and no ComfyUI module; it only touches the ComfyUI modules handed to it.
"""

from comfy_memx.core.comfyui import running_version
from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.core.units import format_bytes
from comfy_memx.pins import loadscope, reconcile
from comfy_memx.pins.context import (PREEXISTING, REFUSED, UNATTRIBUTED, PinSession,  # noqa: F401
                                     State, current, describe, emit_event, log, session)

GIB = 1024 ** 3
HEADROOM_BYTES = 2 * GIB          # RAM left available after a pin; ComfyUI 0.27.0 keeps at least the same for its pins


# -- life cycle ---------------------------------------------------------------------------------------------------

def start(mm, host=None, available_ram=None, headroom_bytes=HEADROOM_BYTES, env_value=None):
    """Resolve the cap for this host and build the process-wide budget for ComfyUI's model_management ``mm``.

    Returns the :class:`~comfy_memx.pins.cap.PinCap` in force.  ``host`` defaults to a fresh
    :func:`~comfy_memx.pins.host.probe_host`; ``env_value`` to ``STATE.config.pin_limit``; ``available_ram`` (a
    callable, for tests) to the cached live gauge.  With a cap of 0 (``off``) no budget is built: ComfyUI itself
    refuses every pin once ``MAX_PINNED_MEMORY`` is 0.  Pins ComfyUI made before are counted (late activation).
    Restarting closes the previous budget first.
    """
    from comfy_memx.pins import cap as pincap, host as hostmem
    from comfy_memx.pins.budget import PinBudget
    stop()
    host = host if host is not None else hostmem.probe_host()
    limit = STATE.config.pin_limit if env_value is None else env_value
    cap = pincap.resolve_cap(host, limit)
    gauge = hostmem.RamGauge(available_ram or (lambda: hostmem.available_ram(host)))
    budget = None
    if cap.enabled:
        budget = PinBudget(cap.bytes, headroom_bytes=headroom_bytes, available_ram=gauge,
                           scope=STATE.config.pin_scope, on_event=emit_event, describe=describe)
    session().current = State(mm, budget, cap, limit, host, getattr(mm, "MAX_PINNED_MEMORY", None), gauge)
    loadscope.follow_loads()
    session().on_close = loadscope.unfollow_loads
    if budget is not None:
        reconcile.seed_preexisting(session().current)
    return cap


def stop():
    """Drop the budget (giving a host-scope share back) and every record of pins; ComfyUI is not touched."""
    part = STATE.existing_part(PinSession)
    if part is not None:
        part.close()


def managing(mm=None):
    """True when comfy_memx budgets pins (for ComfyUI's model_management ``mm``, when given)."""
    state = session().current
    return state is not None and state.budget is not None and (mm is None or state.mm is mm)


def started_for(mm):
    """True when :func:`start` ran for ComfyUI's model_management ``mm`` (pinning budgeted, or turned off)."""
    state = session().current
    return state is not None and state.mm is mm


def budget():
    """The process-wide :class:`~comfy_memx.pins.budget.PinBudget`, settled to ComfyUI's own counters first, or
    None when comfy_memx does not budget pins."""
    state = current()
    if state is None:
        return None
    try:
        reconcile.settle_all(state)
    except Exception as exc:  # a stale figure is better than no figure
        internal_error("settling the pin books", exc)
    return state.budget


def cap():
    """The :class:`~comfy_memx.pins.cap.PinCap` resolved by :func:`start`, or None before it."""
    return session().current.cap if session().current is not None else None


def comfyui_max():
    """``MAX_PINNED_MEMORY`` as ComfyUI computed it before comfy_memx applied its cap (None before :func:`start`)."""
    return session().current.comfyui_max if session().current is not None else None


def startup_line():
    """The INFO line for the cap :func:`start` resolved (see :func:`cap_line`); None before it."""
    state = session().current
    if state is None:
        return None
    return cap_line(state.cap, state.limit, state.host, state.comfyui_max, running_version(state.mm),
                    STATE.config.pin_scope)


def cap_line(pin_cap, limit, host, comfyui_value, comfyui_version=None, scope="process"):
    """The INFO line that says which cap is in force, why, and what ComfyUI itself would have used."""
    comfy = "ComfyUI %s" % comfyui_version if comfyui_version else "ComfyUI"
    theirs = "%s would use %s" % (comfy, format_bytes(comfyui_value)) if comfyui_value and comfyui_value > 0 else ""
    if pin_cap.source == "auto":
        swap = "%s disk swap" % format_bytes(host.swap_disk) if host.swap_disk else "no disk swap"
        facts = ["%s RAM" % format_bytes(host.ram_total), swap]
        if host.cgroup_limit is not None:
            facts.append("cgroup limit %s" % format_bytes(host.cgroup_limit))
        if host.swap_zram:
            facts.append("zram %s not counted" % format_bytes(host.swap_zram))
        why = "auto: " + ", ".join(facts)
    else:
        why = "%s=%s" % (pin_cap.source, str(limit).strip())
    why = why + "; " + theirs if theirs else why
    if not pin_cap.enabled:
        return "comfy_memx: pinned memory off (%s)" % why
    shared = ", shared by all ComfyUI processes of this user" if scope == "host" else ""
    return "comfy_memx: pinned-memory cap %s%s (%s)" % (format_bytes(pin_cap.bytes), shared, why)
