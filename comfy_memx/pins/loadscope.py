"""The load in progress, protected from pin eviction: within one ``load_models_gpu`` nothing is unpinned and pinned
again.

Which models a load is loading comes from the model_management patch: its ``load_models_gpu`` wrapper runs the
``load`` pair (``comfy_memx.core.signals``), whose record of the call in progress keeps its ``models`` by weakref.
The budget protects a load (:meth:`~comfy_memx.pins.budget.PinBudget.begin_load`) from the first pin decision seen
inside it until the call ends (:func:`end_with_load`, the pin wing's "after" half of ``load``) or a pin is seen
outside any load, whichever comes first, so no load outlives its call.  When the load ends the budget is settled to
ComfyUI's counters, as models unloaded during the load dropped their pins on paths comfy_memx does not wrap.  With
the model_management patch disabled, only the requesting model is protected.

The pin wing's reactions to loads and unloads (:func:`end_load_protection`, :func:`settle_after_unload`) are
subscribed only while a pin session runs (:func:`follow_loads` from ``pins.session.start``, :func:`unfollow_loads`
when the session closes): a server whose ComfyUI has no pinning or turned it off (0.3.64, ``MAX_PINNED_MEMORY`` not
above 0) pays nothing for them on each load and unload.

``_scope_lock`` (a plain Lock) only guards the ``open`` flag of one scope; nothing allocates while it is held.
"""

import threading

from comfy_memx.core import pairs, signals
from comfy_memx.pins import owners, reconcile
from comfy_memx.pins.context import call, current, session

_scope_lock = threading.Lock()


class ProtectedLoad:
    """One load_models_gpu call that the budget protects (``token``: the id of the ``load`` pair's record of the call,
    which is on this thread's stack for as long as the call runs); ends with the call or when a pin is seen outside
    it, whichever comes first."""
    __slots__ = ("model_ids", "budget", "token", "open")

    def __init__(self, model_ids, budget, load):
        self.model_ids = model_ids
        self.budget = budget
        self.open = True
        self.token = id(load)

    def end(self):
        """Stop protecting this load (once), and settle the budget to ComfyUI's counters."""
        with _scope_lock:
            if not self.open:
                return
            self.open = False
        call(self.budget.end_load)
        state = session().current
        if state is not None and state.budget is self.budget:
            reconcile.sync(state)


def end_with_load():
    """This thread's ``load_models_gpu`` call is ending (its record still on the stack): stop protecting it, if it is
    the protected one."""
    local = session().local
    scope = getattr(local, "scope", None)
    load = signals.load.current()
    if scope is not None and scope.open and load is not None and scope.token == id(load):
        local.scope = None
        scope.end()


def protected_ids():
    """The model_ids of this thread's load in progress (empty outside a load)."""
    scope = getattr(session().local, "scope", None)
    return set(scope.model_ids) if scope is not None and scope.open else set()


def sync_load_scope(state):
    """Make the budget's load protection follow this thread's innermost ``load_models_gpu`` call."""
    load = signals.load.current()
    local = session().local
    current = getattr(local, "scope", None)
    if load is None:
        if current is not None:
            local.scope = None
            current.end()
        return
    if current is not None and current.open and current.token == id(load):
        return
    if current is not None:
        current.end()
    model_ids = [owners.patcher_model_id(p) for p in pairs.subjects(load) if getattr(p, "model", None) is not None]
    scope = ProtectedLoad(tuple(dict.fromkeys(model_ids)), state.budget, load)
    local.scope = scope
    call(state.budget.begin_load, scope.model_ids)


def end_load_protection(mm, models):
    """The ``load`` pair's "after" half: a ``load_models_gpu`` call ends, the budget stops sparing its models."""
    if current() is not None:
        end_with_load()


def settle_after_unload(entry, result, seconds, caller_frame):
    """The ``model_unload`` pair's "after" half: an unload may release pins behind the budget's back, so the budget
    settles to ComfyUI's counters."""
    state = current()
    if state is not None:
        reconcile.sync(state)


def follow_loads():
    """A pin session started: from now on every load ends its protection and every unload settles the budget."""
    signals.load.subscribe(after=end_load_protection)
    signals.model_unload.subscribe(after=settle_after_unload)


def unfollow_loads():
    """The pin session closed: loads and unloads no longer call this wing."""
    signals.load.unsubscribe(end_load_protection)
    signals.model_unload.unsubscribe(settle_after_unload)
