"""The budget follows ComfyUI's own books: every model's record is what ComfyUI really holds registered for it.

ComfyUI changes ``TOTAL_PINNED_MEMORY`` on paths comfy_memx wraps (pin, unpin, its eviction entry points) and on
paths it does not (``ModelPatcherDynamic.partially_unload_ram`` / ``unregister_inactive_pins`` called by an unload,
``__del__`` or ``reset_cast_buffers``).  Instead of inferring registrations from the growth of the total (wrong as
soon as ComfyUI evicts something else during the same call), comfy_memx reads ComfyUI's own per-model counters:

* a model's legacy pins: the bytes comfy_memx saw ``pin_memory`` / ``unpin_memory`` register and unregister for it
  (``State.legacy``; those two functions are the only writers of ``PINNED_MEMORY``);
* a model's DynamicVRAM pins: the ``pinned_size`` counters of every subset of its pin states
  (:func:`~comfy_memx.pins.layout.model_registered_bytes`), which ComfyUI keeps in step with the total on every
  path;
* what no known model explains (dynamic pins of a model comfy_memx never saw, pins made before it started):
  ``TOTAL_PINNED_MEMORY`` minus the above, under ``UNATTRIBUTED``, but only up to what such pins can hold: the
  legacy pins of no known model plus the bytes granted to pins of no known model (``State.unknown_bytes``, which
  shrinks with the leftover as they are released);
* the rest is *drift* of ComfyUI's counter (an update lost, a pin freed without it): bytes nobody holds.  It is
  logged once with the amount and kept in ``State.drift``, never booked in the budget, so it protects nothing and
  refuses no pin.

:func:`settle_all` sets every record to that (the budget adds the grants still in flight), so after it the budget's
bytes minus those in flight equal ``TOTAL_PINNED_MEMORY``.  It costs one dict walk per model with pins.
:func:`sync` is the cheap form run at every observation point (each wrapped pin path, each decision, the end of a
load): one comparison of totals, and :func:`settle_all` only when ComfyUI's total moved without comfy_memx.
"""

from comfy_memx.pins import layout
from comfy_memx.pins.context import PREEXISTING, UNATTRIBUTED, call, log


def truth(state, model_id):
    """Bytes ComfyUI holds registered for ``model_id`` now (legacy plus dynamic); None for UNATTRIBUTED, which is
    what is left over (see :func:`settle_all`)."""
    if model_id == UNATTRIBUTED:
        return None
    dynamic = 0
    ref = state.dynamic.get(model_id)
    if ref is not None:
        module = ref()
        dynamic = layout.model_registered_bytes(module) if module is not None else 0
    return state.legacy.get(model_id, 0) + dynamic


def settle_model(state, model_id):
    """Settle one model's record to :func:`truth` (all models when it is UNATTRIBUTED); returns the change."""
    actual = truth(state, model_id)
    if actual is None:
        return settle_all(state).get(model_id, 0)
    return call(state.budget.settle, model_id, actual)


def settle_all(state):
    """Settle every model's record to ComfyUI's counters; returns ``{model_id: change}`` of the records that moved
    (negative: bytes ComfyUI released)."""
    budget = state.budget
    keys = set(state.legacy) | set(state.dynamic) | set(call(budget.models))
    keys.discard(UNATTRIBUTED)
    changes = {}
    explained = 0
    for model_id in keys:
        actual = truth(state, model_id)
        explained += actual
        change = call(budget.settle, model_id, actual)
        if change:
            changes[model_id] = change
    total = _total(state.mm)
    leftover = state.legacy.get(UNATTRIBUTED, 0)
    unexplained = max(0, total - explained - leftover)
    held = min(unexplained, state.unknown_bytes)
    _pinned, in_flight = call(budget.totals)
    # Released unknown pins shrink what unknown pins may hold (grants still in flight may not be registered yet).
    state.unknown_bytes = min(state.unknown_bytes, unexplained + in_flight)
    _note_drift(state, unexplained - held, total)
    actual = leftover + held
    change = call(budget.settle, UNATTRIBUTED, actual)
    if change:
        changes[UNATTRIBUTED] = change
    return changes


def sync(state):
    """Settle the budget when ComfyUI's ``TOTAL_PINNED_MEMORY`` differs from it and the known drift (cheap when it
    does not)."""
    pinned, in_flight = call(state.budget.totals)
    if pinned - in_flight + state.drift != _total(state.mm):
        return settle_all(state)
    return {}


def note_unknown(state, nbytes):
    """A pin of no known model was granted ``nbytes``: that much of the unexplained total may be really held."""
    state.unknown_bytes += max(0, int(nbytes))


def _note_drift(state, drift, total):
    state.drift = drift
    if drift > 0 and not state.drift_reported:
        state.drift_reported = True
        from comfy_memx.core.units import format_bytes
        log.warning("comfy_memx: ComfyUI's TOTAL_PINNED_MEMORY (%s) is %s above what its registered pins explain; "
                    "that drift is not counted against the pin cap (no pin holds it; logged once)",
                    format_bytes(total), format_bytes(drift))


def seed_preexisting(state):
    """At start: count the pins ComfyUI made before comfy_memx took over (late activation), so the cap covers them;
    legacy ones under PREEXISTING, dynamic ones under UNATTRIBUTED."""
    preexisting = sum(getattr(state.mm, "PINNED_MEMORY", {}).values())
    # Dynamic pins made before comfy_memx took over are held by models it never saw: they may be real.
    state.unknown_bytes += max(0, _total(state.mm) - preexisting)
    if preexisting > 0:
        state.add_legacy(PREEXISTING, preexisting)
        if call(state.budget.request, PREEXISTING, preexisting, (PREEXISTING,)).refused:
            from comfy_memx.core.units import format_bytes
            log.warning("comfy_memx: %s pinned before comfy_memx started is above the cap; nothing more is pinned "
                        "until ComfyUI releases some of it", format_bytes(preexisting))
    settle_all(state)


def _total(mm):
    try:
        return int(getattr(mm, "TOTAL_PINNED_MEMORY", 0) or 0)
    except (TypeError, ValueError):
        return 0
