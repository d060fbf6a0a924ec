"""The load in progress, protected from pin eviction: within one ``load_models_gpu`` nothing is unpinned and pinned
again.

Which models a load is loading comes from the model_management patch: its ``load_models_gpu`` wrapper runs the
``load`` pair (``comfy_memx.core.signals``), whose record of the call in progress (its ``models`` by weakref) the pair
drops when the call returns.  The budget protects a load (:meth:`~comfy_memx.pins.budget.PinBudget.begin_load`) from
the first pin decision seen inside it until that record dies (weakref callback) or a pin is seen outside any load,
whichever comes first, so no load outlives its call.  When the load ends the budget is settled to ComfyUI's counters, as models unloaded during the
load dropped their pins on paths comfy_memx does not wrap.  With the model_management patch disabled, only the
requesting model is protected.

``_scope_lock`` (a plain Lock) only guards the ``open`` flag of one scope; nothing allocates while it is held, so
the weakref callback that takes it cannot deadlock.
"""

import threading
import weakref

from comfy_memx.core import guard, pairs, signals
from comfy_memx.pins import owners, reconcile
from comfy_memx.pins.context import call, later_or_now, session

_scope_lock = threading.Lock()


class ProtectedLoad:
    """One load_models_gpu call that the budget protects; ends when its ``LoadCall`` dies or a pin is seen outside
    it, whichever comes first."""
    __slots__ = ("model_ids", "budget", "token_ref", "open", "__weakref__")

    def __init__(self, model_ids, budget, token):
        self.model_ids = model_ids
        self.budget = budget
        self.open = True
        self.token_ref = weakref.ref(token, guard.callback("pins.load_ended", self._token_gone))

    def _token_gone(self, _ref):
        later_or_now(self.end)

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
    if current is not None and current.open and current.token_ref() is load:
        return
    if current is not None:
        current.end()
    model_ids = [owners.patcher_model_id(p) for p in pairs.subjects(load) if getattr(p, "model", None) is not None]
    scope = ProtectedLoad(tuple(dict.fromkeys(model_ids)), state.budget, load)
    local.scope = scope
    call(state.budget.begin_load, scope.model_ids)
