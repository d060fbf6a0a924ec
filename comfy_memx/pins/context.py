"""The pin state of this process and the rule for calling into the budget: what every module of the pin glue
shares, with no life cycle of its own (that is :mod:`~comfy_memx.pins.session`).

Locks, and the one rule they follow (no lock that a garbage-collector or weakref callback can take is held while
Python may allocate):

* the pin lock (:func:`pin_lock`, re-entrant, ``PinSession.lock``): one pin decision at a time, from the budget's
  answer through the evictions to ComfyUI's registration.  It is held while ComfyUI runs (which allocates), so no
  finalizer or weakref callback of comfy_memx ever takes it: releases seen from a finalizer (ComfyUI unpins in
  ``ModelPatcher.__del__``) only update counters and settle the budget, and the budget's own lock is handled as
  below.
* the budget's lock (inside :class:`~comfy_memx.pins.budget.PinBudget`): every call into the budget goes through
  :func:`call`, which marks this thread as inside it; a callback that arrives on this thread meanwhile (a garbage
  collection inside the budget) is queued by :func:`later_or_now` and run right after the thread leaves.
* ``State.counter_lock``: held only for one int addition and one dict store with a str key (:meth:`State.add_legacy`,
  called by unpins on any thread, finalizers included).  Neither allocates a garbage-collected object, so no
  collection, hence no finalizer, can start while it is held.
* ``_scope_lock`` (:mod:`~comfy_memx.pins.loadscope`): flips one flag; nothing allocates while it is held.

Imports no torch and no ComfyUI module.
"""

import collections
import logging
import threading

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE

log = logging.getLogger("comfy_memx")

UNATTRIBUTED = "unattributed"     # pins whose model could not be told; never evicted (nothing to evict them with)
PREEXISTING = "pinned_before_comfy_memx"
REFUSED = object()                # from before_*_pin: the wrapper answers as ComfyUI does when it cannot pin

class PinSession:
    """comfy_memx's pinned-memory state in this process (a part of the process state): the :class:`State` in force
    (``current``, None until :func:`comfy_memx.pins.session.start`), per-thread flags (``local``: ``busy`` inside the budget, ``scope`` the
    load being protected) and the calls that arrived from a finalizer while this thread was inside the budget
    (``deferred``)."""

    def __init__(self):
        self.current = None
        self.local = threading.local()
        self.deferred = collections.deque()
        self.on_close = None    # what the session's start subscribed, undone by close (pins.loadscope)
        # One pin decision at a time: from the budget's answer through the evictions to ComfyUI's registration (or
        # its refusal), so that no other decision sees evictions half carried out.  ComfyUI pins from one thread
        # anyway.  Never taken by a finalizer or weakref callback (see the module docstring).
        self.lock = threading.RLock()

    def close(self):
        """Drop the budget (giving a host-scope share back) and every record of pins; ComfyUI is not touched."""
        state, self.current = self.current, None
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()
        self.local.__dict__.clear()
        self.deferred.clear()
        if state is not None and state.budget is not None:
            try:
                state.budget.close()
            except Exception as exc:
                internal_error("closing the pin budget", exc)


class State:
    """What one :func:`comfy_memx.pins.session.start` set up: ComfyUI's model_management ``mm``, the budget (None when the cap is off), the
    cap and how it was found, and comfy_memx's books of ComfyUI's pins, by model key (``model_id`` strings, never a
    model; weakrefs only):

    ``pins`` legacy pin address -> model_id; ``legacy`` model_id -> bytes of its legacy pins (changed only by
    :meth:`add_legacy`); ``dynamic`` model_id -> weakref to the torch module whose DynamicVRAM pins it owns;
    ``records`` model_id -> weakref to its ledger record; ``pin_owner_of_state`` id(pin state dict) -> (model_id,
    weakref to the torch module).  The other dicts are changed with single GIL-atomic operations (also from
    finalizers) and read from snapshots.
    """

    __slots__ = ("mm", "budget", "cap", "limit", "host", "comfyui_max", "gauge", "pins", "legacy", "dynamic",
                 "records", "pin_owner_of_state", "counter_lock", "unknown_bytes", "drift", "drift_reported")

    def __init__(self, mm, budget, cap, limit, host, comfyui_max, gauge):
        self.mm, self.limit = mm, limit
        self.budget, self.cap, self.host, self.comfyui_max, self.gauge = budget, cap, host, comfyui_max, gauge
        self.pins = {}
        self.legacy = {}
        self.dynamic = {}
        self.records = {}
        self.pin_owner_of_state = {}
        self.counter_lock = threading.Lock()
        self.unknown_bytes = 0      # what pins of no known model may hold (granted as UNATTRIBUTED; see reconcile)
        self.drift = 0              # TOTAL_PINNED_MEMORY above everything pins explain: bytes nobody holds
        self.drift_reported = False

    def add_legacy(self, model_id, delta):
        """Add ``delta`` bytes (negative: unpinned) to ``model_id``'s legacy pins, atomically across threads."""
        with self.counter_lock:
            left = self.legacy.get(model_id, 0) + delta
            if left > 0:
                self.legacy[model_id] = left
            else:
                self.legacy.pop(model_id, None)


def session():
    """This process's :class:`PinSession`."""
    return STATE.part(PinSession)


def pin_lock():
    """The lock of one pin decision at a time (re-entrant); the pin wrappers hold it around ComfyUI's call."""
    return session().lock


def current():
    """The :class:`State` in force when comfy_memx budgets pins, else None."""
    state = session().current
    return state if state is not None and state.budget is not None else None


# -- calling into the budget --------------------------------------------------------------------------------------

def call(method, *args):
    """Call a budget method, marking this thread as inside the budget, then run what was deferred meanwhile."""
    local = session().local
    local.busy = getattr(local, "busy", 0) + 1
    try:
        result = method(*args)
    finally:
        local.busy -= 1
    if session().deferred and not local.busy:
        _drain()
    return result


def later_or_now(action):
    """Run ``action`` now, or after this thread leaves the budget when a finalizer (garbage collection) brought us
    here from inside it: the budget's lock is not reentrant."""
    if getattr(session().local, "busy", 0):
        session().deferred.append(action)
    else:
        action()


def _drain():
    part = session()
    while part.deferred and not getattr(part.local, "busy", 0):
        try:
            action = part.deferred.popleft()
        except IndexError:
            return
        try:
            action()
        except Exception as exc:
            internal_error("deferred pin bookkeeping", exc)


def emit_event(event):
    """Send a budget event dict (``event`` key = its name) to the event log."""
    event = dict(event)
    STATE.events.emit(event.pop("event"), **event)


def describe(model_id):
    """The class name part of a ``model_id`` ("QwenImageModel#3" -> "QwenImageModel")."""
    return model_id.rpartition("#")[0] or model_id
