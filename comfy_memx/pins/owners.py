"""Which model a pin belongs to, told by ``model_id`` (the ledger's key), never by holding the model.

* A legacy pin comes from ``ModelPatcher.pin_weight_to_device(self, key)``: the calling frame's ``self`` is the
  patcher, ``self.model`` the torch module, whose ledger record gives the ``model_id``.
* A DynamicVRAM pin is asked for one layer (or one LowVRAM patch) whose ``_pin_state`` is the pin state dict of
  its model on one device (``model.dynamic_pins[device]``); the model is found among ComfyUI's loaded models by
  that dict's identity, once per pin state (cached by its id, checked against a weakref of the model).

Every model found is remembered weakly: its ledger record (``State.records``, whose death makes the budget forget
the model) and, for dynamic pins, its torch module (``State.dynamic``, read by :mod:`~comfy_memx.pins.reconcile`).
"""

import weakref

from comfy_memx.core import guard
from comfy_memx.core.state import STATE
from comfy_memx.pins import layout
from comfy_memx.pins.context import UNATTRIBUTED, call, later_or_now, session


def calling_patcher(frame, depth=3):
    """The ModelPatcher whose method is pinning: ``self`` of ``pin_weight_to_device`` (looked for a few frames up
    in case another extension wrapped ``pin_memory`` over comfy_memx), or None."""
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and isinstance(getattr(owner, "pinned", None), set):
            return owner
        frame = frame.f_back
    return None


def patcher_model_id(patcher):
    """The ledger ``model_id`` of a ModelPatcher's torch module (the patcher is remembered weakly), or
    :data:`~comfy_memx.pins.session.UNATTRIBUTED`.  A dynamic patcher's module is tracked for reconciliation."""
    module = getattr(patcher, "model", None) if patcher is not None else None
    if module is None or not hasattr(patcher, "load_device"):
        return UNATTRIBUTED
    model_id = record_id(module, patcher)
    if layout.is_dynamic(patcher):
        track_dynamic(model_id, module)
    return model_id


def record_id(module, patcher=None):
    """The ledger ``model_id`` of ``module`` (creating its record), remembering the record weakly."""
    record = STATE.ledger.record_for(module)
    if patcher is not None:
        record.add_patcher(patcher)
    state = session().current
    if state is not None and record.model_id not in state.records:
        state.records[record.model_id] = weakref.ref(record, guard.callback("pins.record_gone", _record_gone(record.model_id)))
    return record.model_id


def track_dynamic(model_id, module):
    """Remember that ``module`` (a model's torch module) holds DynamicVRAM pins counted under ``model_id``."""
    state = session().current
    if state is not None and model_id not in state.dynamic:
        state.dynamic[model_id] = weakref.ref(module)


def dynamic_model_id(state, layer):
    """The model whose DynamicVRAM pin state ``layer`` (a layer or a LowVRAM patch) shares; UNATTRIBUTED when no
    loaded model owns it."""
    pin_state = getattr(layer, "_pin_state", None)
    if pin_state is None:
        return UNATTRIBUTED
    cached = state.pin_owner_of_state.get(id(pin_state))
    if cached is not None:
        top = cached[1]()
        if top is not None and any(value is pin_state for value in getattr(top, "dynamic_pins", {}).values()):
            return cached[0]
    for entry in list(getattr(state.mm, "current_loaded_models", ())):
        patcher = entry.model
        if patcher is None or not layout.is_dynamic(patcher):
            continue
        pins = getattr(patcher.model, "dynamic_pins", {})
        if any(value is pin_state for value in pins.values()):
            model_id = record_id(patcher.model, patcher)
            track_dynamic(model_id, patcher.model)
            state.pin_owner_of_state[id(pin_state)] = (model_id, weakref.ref(patcher.model))
            return model_id
    return UNATTRIBUTED


def active_dynamic_ids(state):
    """The model_ids of the loaded DynamicVRAM models that are active (loaded for the node running now)."""
    found = []
    for entry in list(getattr(state.mm, "current_loaded_models", ())):
        patcher = entry.model
        if patcher is None or not layout.is_dynamic(patcher):
            continue
        pin_state = layout.pin_state_of(patcher)
        if pin_state is not None and pin_state.get("active"):
            found.append(patcher_model_id(patcher))
    return found


def _record_gone(model_id):
    def gone(_ref):
        state = session().current
        if state is None or state.budget is None:
            return
        state.records.pop(model_id, None)
        state.dynamic.pop(model_id, None)
        later_or_now(lambda: call(state.budget.forget, model_id))
    return gone
