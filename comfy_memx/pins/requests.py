"""Pins asked of the budget: each new registration ComfyUI is about to make is attributed to its model, asked of
the budget, and refused or granted after the budget's evictions were carried out with ComfyUI's own calls.

Paths (all under :func:`~comfy_memx.pins.context.pin_lock`, held by the patch wrappers):

* ``comfy.model_management.pin_memory(tensor[, evict_active])``: a legacy pin (:func:`before_tensor_pin` /
  :func:`after_tensor_pin`); every ``unpin_memory`` is booked back by address (:func:`after_tensor_unpin`, which
  may run in a finalizer: it only updates a counter and settles).
* ``comfy.pinned_memory.pin_memory(layer, subset, size)``: a new DynamicVRAM pin (:func:`before_layer_pin` /
  :func:`after_layer_pin`).  A layer that already has a pin in that subset (0.33+ ``layer._pins[subset]``, 0.27.0
  ``layer._pin``) never asks for room: a registered one is left alone, an unregistered one is registered again by
  ComfyUI's ``get_pin``, asked for by :func:`before_reregister`.
* A refusal answers as ComfyUI does when it cannot pin (False; for ``get_pin`` the unregistered pin).

What a grant really became is read afterwards from ComfyUI's own counters (:mod:`~comfy_memx.pins.reconcile`):
the grant is in flight during the call, then the model is settled, so a pin ComfyUI declined, or moved between
layers of one model, or made while evicting someone else, is counted exactly, and a grant ComfyUI refused (0.38
``pin_memory`` returns False when its own ``ensure_pin_registerable`` fails) is given back.  The budget is
settled before every decision, so ComfyUI's own cap check (``MAX_PINNED_MEMORY`` is comfy_memx's cap) never finds
a shortfall after comfy_memx made room: it does not refuse a pin comfy_memx evicted for.

Evictions: ``ModelPatcher.unpin_weight`` for legacy pins; for dynamic pins :func:`~comfy_memx.pins.layout.
release_dynamic` (cap: the 0.38 fast subsets destroyed, then ``unregister_inactive_pins``; RAM pressure:
``partially_unload_ram``).  Bytes freed are measured on ComfyUI's counters, not on return values.
"""

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.pins import layout, loadscope, owners, reconcile
from comfy_memx.pins.context import PREEXISTING, REFUSED, UNATTRIBUTED, call, current, describe, later_or_now


class Grant:
    """A pin the budget granted and the wrapper is about to make."""
    __slots__ = ("model_id", "nbytes", "ptr")

    def __init__(self, model_id, nbytes):
        self.model_id, self.nbytes, self.ptr = model_id, nbytes, None


# -- legacy tensor pins (comfy.model_management.pin_memory / unpin_memory) ----------------------------------------

def before_tensor_pin(tensor, caller, evict_active=True):
    """Decide a ``pin_memory(tensor[, evict_active])`` call; ``caller`` is the frame that called ComfyUI's function.

    Returns None (not budgeted: ComfyUI will refuse it itself, or comfy_memx is inactive), :data:`REFUSED` (over
    the budget, or already pinned), or a grant to pass to :func:`after_tensor_pin` with the result of the real pin.
    With ``evict_active`` False (0.38) the pins of active DynamicVRAM models are not evicted for it, as ComfyUI's own
    ``ensure_pin_registerable(size, evict_active=False)`` would not.
    """
    state = current()
    if state is None:
        return None
    mm = state.mm
    if getattr(mm, "MAX_PINNED_MEMORY", 0) <= 0:
        return None
    allowed = getattr(mm, "PINNING_ALLOWED_TYPES", None)
    if allowed is not None and type(tensor).__name__ not in allowed:
        return None
    if getattr(tensor.device, "type", None) != "cpu" or not tensor.is_contiguous():
        return None
    ptr = tensor.data_ptr()
    if ptr == 0:
        return None
    if ptr in getattr(mm, "PINNED_MEMORY", ()):
        # Already pinned: ComfyUI answers False before doing anything.  Answering for it (instead of passing the
        # call on) matters when another thread evicts this very pin meanwhile: ComfyUI would then register it
        # again without the budget knowing.
        return REFUSED
    model_id = owners.patcher_model_id(owners.calling_patcher(caller))
    reconcile.sync(state)
    loadscope.sync_load_scope(state)
    grant = _request(state, model_id, tensor.nbytes, spare_active=not evict_active)
    if grant is not REFUSED:
        grant.ptr = ptr
    return grant


def after_tensor_pin(grant, pinned):
    """Book the outcome of a granted legacy pin: the bytes stay with the model when ComfyUI pinned, else go back."""
    state = current()
    if state is None:
        return
    if pinned is True:
        state.pins[grant.ptr] = grant.model_id
        state.add_legacy(grant.model_id, grant.nbytes)
    _conclude(state, grant)


def before_tensor_unpin(tensor):
    """Return ``(address, pinned bytes)`` of a tensor about to be unpinned, or None when it is not a known pin."""
    state = current()
    if state is None:
        return None
    ptr = tensor.data_ptr()
    size = getattr(state.mm, "PINNED_MEMORY", {}).get(ptr)
    return (ptr, size) if size else None


def after_tensor_unpin(known, unpinned):
    """Book a successful unpin back under the model that pinned it (safe from a finalizer)."""
    state = current()
    if state is None or known is None or unpinned is not True:
        return
    ptr, size = known
    model_id = state.pins.pop(ptr, PREEXISTING)
    state.add_legacy(model_id, -size)
    later_or_now(lambda: reconcile.settle_model(state, model_id))


# -- DynamicVRAM pins (comfy.pinned_memory.pin_memory / get_pin) -------------------------------------------------

def before_layer_pin(layer, subset, size):
    """Decide a DynamicVRAM ``pin_memory(layer, subset, size)`` call; see :func:`before_tensor_pin`.

    ``size`` None means ComfyUI's default (weight and bias, aligned), computed with ComfyUI's own helper.  A layer
    that already has a pin in ``subset`` is passed through (None): nothing new is registered, or ``get_pin``
    registers it again and asks for that itself.  A 0.38 fast subset (``*-fast``) spares the pins of active models,
    as ComfyUI does for it (``evict_active=not fast``).
    """
    state = current()
    if state is None or getattr(state.mm, "MAX_PINNED_MEMORY", 0) <= 0 or layout.pinning_disabled(state.mm):
        return None
    pin, _registered = layout.layer_pin(layer, subset)
    if pin is not None:
        return None
    if size is None:
        size = layout.default_layer_size(layer)
    if not size or size <= 0:
        return None
    reconcile.sync(state)
    loadscope.sync_load_scope(state)
    return _request(state, _used_now(state, layer), int(size), spare_active=subset.endswith("-fast"))


def before_reregister(layer, subset):
    """Decide a ``get_pin(layer, subset)`` call that is about to register an existing, unregistered pin again.

    Returns None (nothing to decide: no pin, already registered, pinning off), :data:`REFUSED` (the wrapper then
    returns the pin unregistered, as ComfyUI does when registration fails) or a grant for :func:`after_layer_pin`.
    """
    state = current()
    if state is None or getattr(state.mm, "MAX_PINNED_MEMORY", 0) <= 0 or layout.pinning_disabled(state.mm):
        return None
    pin, registered = layout.layer_pin(layer, subset)
    if pin is None or registered:
        return None
    reconcile.sync(state)
    loadscope.sync_load_scope(state)
    return _request(state, _used_now(state, layer), int(pin.nbytes))


def after_layer_pin(grant):
    """Settle a granted dynamic pin (or re-registration) to what ComfyUI registered; the rest goes back."""
    state = current()
    if state is not None:
        _conclude(state, grant)


# -- internals ----------------------------------------------------------------------------------------------------

def _used_now(state, layer):
    """The model of a layer being pinned, marked as the most recently used one: DynamicVRAM pins a model's layers
    while it runs, outside any ``load_models_gpu`` that would mark it."""
    model_id = owners.dynamic_model_id(state, layer)
    if model_id != UNATTRIBUTED:
        call(state.budget.touch, model_id)
    return model_id


def _conclude(state, grant):
    call(state.budget.conclude, grant.model_id, grant.nbytes)
    reconcile.settle_model(state, grant.model_id)
    reconcile.sync(state)


def _request(state, model_id, nbytes, spare_active=False):
    loading = (model_id, UNATTRIBUTED, PREEXISTING)
    if spare_active:
        loading += tuple(owners.active_dynamic_ids(state))
    decision = call(state.budget.request, model_id, nbytes, loading, True)
    if decision.refused:
        return REFUSED
    state.gauge.note_granted(nbytes)
    if decision.evict:
        short = _carry_out(state, decision)
        if short:
            # Give the grant back before the evictions that did not happen count again, so that no other
            # thread ever sees more committed than the cap.
            call(state.budget.conclude, model_id, nbytes)
            reconcile.settle_model(state, model_id)
            for victim, missing in short:
                call(state.budget.cancel_eviction, victim, missing)
            STATE.events.emit("pin_refused", model=describe(model_id), model_id=model_id, bytes=nbytes,
                              reason="eviction_failed", policy=state.budget.policy, scope=state.budget.scope)
            return REFUSED
    if model_id == UNATTRIBUTED:
        reconcile.note_unknown(state, nbytes)
    return Grant(model_id, nbytes)


def _carry_out(state, decision):
    """Unpin what the decision evicts, with ComfyUI's own calls; returns [(victim, bytes not unpinned)]."""
    short = []
    for victim, nbytes in decision.evict:
        try:
            freed = _evict(state, victim, nbytes, decision.reason)
        except Exception as exc:  # ComfyUI refused to unpin: the pin that needed the room is not made
            internal_error("pin eviction", exc)
            freed = 0
        if freed < nbytes:
            short.append((victim, nbytes - freed))
    return short


def _evict(state, model_id, nbytes, reason):
    """Unpin ``nbytes`` of ``model_id``'s pins; returns the registered bytes that really went (then settled)."""
    before = reconcile.truth(state, model_id)
    record_ref = state.records.get(model_id)
    record = record_ref() if record_ref is not None else None
    module = record.module_ref() if record is not None else None
    if before is None or module is None:
        return 0

    def freed():
        return before - reconcile.truth(state, model_id)

    seen_pin_sets = set()
    for patcher_ref in list(record.patchers.values()):
        patcher = patcher_ref()
        if freed() >= nbytes:
            break
        if patcher is None or getattr(patcher, "model", None) is not module:
            continue
        if layout.is_dynamic(patcher):
            layout.release_dynamic(patcher, nbytes - freed(), reason)
            continue
        pinned = getattr(patcher, "pinned", None)
        if not pinned or id(pinned) in seen_pin_sets:  # clones share their parent's set
            continue
        seen_pin_sets.add(id(pinned))
        for key in list(pinned):
            if freed() >= nbytes:
                break
            patcher.unpin_weight(key)
    result = freed()
    reconcile.settle_model(state, model_id)
    return result
