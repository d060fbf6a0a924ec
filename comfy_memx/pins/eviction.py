"""ComfyUI's own pin evictions: walked most recently used first on 0.27.0, observed and booked on every version.

ComfyUI releases DynamicVRAM pins by itself when it is short of RAM (``ensure_pin_budget`` -> ``free_pins``, and
the per-node ``free_pins`` of the executor) or of registrable bytes (``free_registrations``), after every node
(``reset_cast_buffers`` destroys the ``patches`` subsets: 0.27.0 ``patches``, 0.33.0 also ``patches-loaded``, 0.38
also ``patches-fast``), and in 0.33+ through the module global ``free_model_pins`` that its tiered loops call.

* 0.27.0 walks its models least recently used first (``reversed(current_loaded_models)``): comfy_memx replaces
  ``free_pins`` / ``free_registrations`` by :func:`free_pins_mru` / :func:`free_registrations_mru`, the same
  loops most recently used first that never touch the load in progress, with the same results.
* 0.33+ walks them most recently used first already (``models_for_pin_eviction``): its functions run unchanged.

Either way every such call is followed by :func:`after_comfyui_eviction` (or :func:`after_node_reset`), which
settles the budget to ComfyUI's counters (:mod:`~comfy_memx.pins.reconcile`) and reports each model that lost
pins as a ``pin_evict`` event with ``by="comfyui"``.  The innermost observed call reports (0.33's ``free_pins``
calls ``free_model_pins`` once per tier), the outer ones find nothing left to report.
"""

from comfy_memx.core import guard
from comfy_memx.core.state import STATE
from comfy_memx.pins import layout, loadscope, owners, reconcile
from comfy_memx.pins.context import call, current, describe, pin_lock


def reorders_eviction(mm):
    """True when this ComfyUI's eviction loops run least recently used first (0.27.0) and comfy_memx walks them
    most recently used first instead; newer releases already walk MRU first (``models_for_pin_eviction``)."""
    state = current()
    return state is not None and state.mm is mm and not hasattr(mm, "models_for_pin_eviction")


def free_registrations_mru(mm, shortfall, evict_active=True):
    """ComfyUI 0.27.0's ``free_registrations`` with the walk reversed: unregister dynamic pins of other models,
    most recently used first, until ``shortfall`` plus ComfyUI's hysteresis is covered; inactive models before
    active ones, active ones only with ``evict_active``; never a model of the load in progress.  Same result.

    The order is decided before ComfyUI unregisters anything, and the books are settled after the walk (an error
    there is logged, never raised): when this fails, it failed before any of ComfyUI's pins moved, so the wrapper
    can run ComfyUI's own walk instead and get ComfyUI's own answer."""
    if getattr(mm, "MAX_PINNED_MEMORY", 0) <= 0:
        return False
    if shortfall <= 0:
        return True
    hysteresis = getattr(mm, "REGISTERABLE_PIN_HYSTERESIS", 0)
    remaining = shortfall + hysteresis
    with pin_lock():
        order = _eviction_order(mm, evict_active)
        try:
            for patcher in order:
                remaining -= patcher.unregister_inactive_pins(remaining)
                if remaining <= 0:
                    return True
            return remaining <= hysteresis
        finally:   # the books: an error there is comfy_memx's, never a reason to walk again
            guard.call("pin eviction bookkeeping", after_comfyui_eviction, "cap")


def free_pins_mru(mm, size, evict_active=False):
    """ComfyUI 0.27.0's ``free_pins`` with the walk reversed: free (``partially_unload_ram``) up to ``size`` bytes
    of other dynamic models' pins, most recently used first, only inactive ones unless ``evict_active``, never a
    model of the load in progress.  Returns the bytes freed, as ComfyUI does.  Decided before and booked after the
    walk, as :func:`free_registrations_mru`."""
    freed_total = 0
    with pin_lock():
        order = _eviction_order(mm, evict_active)
        try:
            for patcher in order:
                if size - freed_total <= 0:
                    return freed_total
                freed_total += patcher.partially_unload_ram(size - freed_total)
            return freed_total
        finally:
            guard.call("pin eviction bookkeeping", after_comfyui_eviction, "ram_pressure")


def _eviction_order(mm, evict_active):
    """The patchers an MRU walk visits: inactive models first, then (with ``evict_active``) active ones."""
    return [patcher for active in ((False, True) if evict_active else (False,))
            for patcher, _model_id in _dynamic_candidates(mm, active)]


def after_comfyui_eviction(reason):
    """Book what one of ComfyUI's eviction calls released: settle, and a ``pin_evict`` event per model that lost
    pins (``reason`` "cap" for unregistrations, "ram_pressure" for destroyed pins)."""
    state = current()
    if state is None:
        return
    changes = reconcile.settle_all(state)
    for model_id, change in changes.items():
        if change < 0:
            STATE.events.emit("pin_evict", model=describe(model_id), model_id=model_id, bytes=int(-change),
                              reason=reason, policy="mru", scope=state.budget.scope, by="comfyui")


def after_node_reset():
    """Book ``reset_cast_buffers`` (end of every node): the patches subsets it destroyed leave the budget."""
    state = current()
    if state is not None:
        reconcile.settle_all(state)


def _dynamic_candidates(mm, active):
    """(patcher, model_id) of the dynamic models ComfyUI may evict, most recently used first."""
    state = current()
    protected = loadscope.protected_ids()
    found = []
    for index, entry in enumerate(list(getattr(mm, "current_loaded_models", ()))):
        patcher = entry.model
        if patcher is None or not layout.is_dynamic(patcher):
            continue
        pin_state = layout.pin_state_of(patcher)
        if pin_state is None or bool(pin_state.get("active")) != active:
            continue
        model_id = owners.patcher_model_id(patcher)
        if model_id in protected:
            continue
        found.append((index, model_id, patcher))
    if state is not None:
        recency = call(state.budget.recency)
        rank = {model_id: position for position, model_id in enumerate(reversed(recency))}
        found.sort(key=lambda item: (rank.get(item[1], len(rank)), item[0]))
    return [(patcher, model_id) for _, model_id, patcher in found]
