"""The glue between ComfyUI's pinned-memory functions and comfy_memx's :class:`~comfy_memx.pins.budget.PinBudget`.

One process-wide budget is built when ComfyUI's ``comfy.model_management`` has been imported and turned pinning on
(``MAX_PINNED_MEMORY > 0``): the cap comes from :func:`comfy_memx.pins.cap.resolve_cap` on a host probe and
``COMFY_MEMX_PIN_LIMIT``; the scope from ``COMFY_MEMX_PIN_SCOPE``.  The wrappers in ``comfy_memx.patches.pinned_memory``
and ``comfy_memx.patches.dynamic_pins`` call in here:

* a pin request (``pin_memory(tensor)`` of the legacy ModelPatcher, ``comfy.pinned_memory.pin_memory(module)`` of
  DynamicVRAM) is attributed to its model, asked of the budget, and either refused (``pin_refused`` event, the
  wrapper returns False as ComfyUI does when it cannot pin) or granted, after the budget's evictions were carried
  out with ComfyUI's own calls: ``ModelPatcher.unpin_weight`` for legacy pins, ``unregister_inactive_pins`` (cap)
  or ``partially_unload_ram`` (RAM pressure) for dynamic ones;
* every unpin goes back to the budget (by the tensor's address, so no frame or model lookup is needed there);
* ``free_pins`` / ``free_registrations`` (ComfyUI's own eviction when it is short of RAM or of registrable bytes)
  walk the dynamic models most recently used first instead of 0.27.0's least recently used first, and never touch
  the models of the load in progress.

Which model a legacy pin belongs to is read from the caller: ComfyUI pins through
``ModelPatcher.pin_weight_to_device(self, key)``, so the caller frame's ``self`` is the patcher and ``self.model``
the torch module, whose ledger record gives the ``model_id``.  Which models a load is loading comes from the
model_management patch: its ``load_models_gpu`` wrapper publishes each call as an ``accounting.LoadCall`` (with the
``models`` argument) that dies when the call returns, so no load outlives its call, and a pin made outside any load
ends the previous load at once.  With the model_management patch disabled, only the requesting model is protected.  Nothing here holds a model, a patcher
or a frame beyond one call: models are known by ``model_id`` strings and ledger records by weakref.

Pin decisions are taken one at a time under :data:`PIN_LOCK`, from the budget's answer through the evictions to
ComfyUI's registration, so that no decision sees another one's evictions half done (ComfyUI pins from its prompt
worker thread only, so this costs nothing there); unpins are not serialized.  A release that arrives from a
garbage-collection finalizer while this thread is inside the budget is settled right after, as the budget's lock
is not reentrant.

RAM pressure is read with :func:`comfy_memx.pins.host.available_ram` at most every ``RAM_READING_MAX_AGE`` seconds;
bytes granted since the last reading are subtracted, so the cached figure only errs on the safe side.
Imports no torch and no ComfyUI module; it only touches the ComfyUI modules handed to it.
"""

import collections
import logging
import os
import sys
import threading
import time
import weakref

from comfy_memx.core.comfyui import running_version
from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.core.units import format_bytes
from comfy_memx.ledger import accounting

log = logging.getLogger("comfy_memx")

GIB = 1024 ** 3
HEADROOM_BYTES = 2 * GIB          # RAM left available after a pin; ComfyUI 0.27.0 keeps at least the same for its pins
RAM_READING_MAX_AGE = 0.05        # seconds a reading of available RAM is reused
UNATTRIBUTED = "unattributed"     # pins whose model could not be told; never evicted (nothing to evict them with)
PREEXISTING = "pinned_before_comfy_memx"
REFUSED = object()                # from before_*_pin: the wrapper answers False without calling ComfyUI



class PinSession:
    """comfy_memx's pinned-memory state in this process (a part of the process state): the budget in force
    (``current``, None until :func:`start`), per-thread flags (``local``) and the releases that arrived from a
    garbage-collection finalizer while this thread was inside the budget (``deferred``)."""

    def __init__(self):
        self.current = None
        self.local = threading.local()
        self.deferred = collections.deque()

    def close(self):
        """Drop the budget (reset of the process state)."""
        stop()


def _session():
    return STATE.part(PinSession)
# One pin decision at a time: from the budget's answer through the evictions to ComfyUI's registration (or its
# refusal), so that no other decision sees evictions half carried out.  ComfyUI pins from one thread anyway.
PIN_LOCK = threading.RLock()
_scope_lock = threading.Lock()


class _Grant:
    """A pin the budget granted and the wrapper is about to make."""
    __slots__ = ("model_id", "nbytes", "ptr", "mark")

    def __init__(self, model_id, nbytes):
        self.model_id, self.nbytes, self.ptr, self.mark = model_id, nbytes, None, None


class _LoadScope:
    """One load_models_gpu call that the budget protects; ends when its ``accounting.LoadCall`` dies or a pin is
    seen outside it, whichever comes first."""
    __slots__ = ("model_ids", "budget", "token_ref", "open", "__weakref__")

    def __init__(self, model_ids, budget, token):
        self.model_ids = model_ids
        self.budget = budget
        self.open = True
        self.token_ref = weakref.ref(token, self._token_gone)

    def _token_gone(self, _ref):
        _later_or_now(self.end)

    def end(self):
        """Stop protecting this load (once)."""
        with _scope_lock:
            if not self.open:
                return
            self.open = False
        _call(self.budget.end_load)


class RamGauge:
    """Available RAM for the budget's pressure rule, re-read at most every ``max_age`` seconds.

    Between readings the bytes granted since the last reading are subtracted, so a burst of pins cannot slip under
    the headroom on a stale figure.  ``read`` is a callable returning bytes.
    """

    def __init__(self, read, max_age=None):
        self._read = read
        self._max_age = max_age  # None: RAM_READING_MAX_AGE, read at each call
        self._at = -1e9
        self._value = 0
        self._granted = 0

    def __call__(self):
        now = time.monotonic()
        if now - self._at > (RAM_READING_MAX_AGE if self._max_age is None else self._max_age):
            self._value, self._at, self._granted = self._read(), now, 0
        return self._value - self._granted

    def note_granted(self, nbytes):
        """Count ``nbytes`` more as used until the next reading."""
        self._granted += nbytes


class _State:
    __slots__ = ("mm", "budget", "cap", "limit", "host", "comfyui_max", "gauge", "pins", "records",
                 "pin_owner_of_state")

    def __init__(self, mm, budget, cap, limit, host, comfyui_max, gauge):
        self.mm, self.limit = mm, limit
        self.budget, self.cap, self.host, self.comfyui_max, self.gauge = budget, cap, host, comfyui_max, gauge
        self.pins = {}                # data_ptr of a legacy pin -> model_id
        self.records = {}             # model_id -> weakref to its ledger record
        self.pin_owner_of_state = {}  # id(dynamic pin state dict) -> (model_id, weakref to the torch module)


# -- life cycle ---------------------------------------------------------------------------------------------------

def start(mm, host=None, available_ram=None, headroom_bytes=HEADROOM_BYTES, env_value=None):
    """Resolve the cap for this host and build the process-wide budget for ComfyUI's model_management ``mm``.

    Returns the :class:`~comfy_memx.pins.cap.PinCap` in force.  ``host`` defaults to a fresh
    :func:`~comfy_memx.pins.host.probe_host`; ``env_value`` to ``STATE.config.pin_limit``; ``available_ram`` (a
    callable, for tests) to the cached live gauge.  With a cap of 0 (``off``) no budget is built: ComfyUI itself
    refuses every pin once ``MAX_PINNED_MEMORY`` is 0.  Restarting closes the previous budget first.
    """
    from comfy_memx.pins import cap as pincap, host as hostmem
    from comfy_memx.pins.budget import PinBudget
    stop()
    host = host if host is not None else hostmem.probe_host()
    limit = STATE.config.pin_limit if env_value is None else env_value
    cap = pincap.resolve_cap(host, limit)
    gauge = RamGauge(available_ram or (lambda: hostmem.available_ram(host)))
    budget = None
    if cap.enabled:
        budget = PinBudget(cap.bytes, headroom_bytes=headroom_bytes, available_ram=gauge,
                           scope=STATE.config.pin_scope, on_event=_emit, describe=_describe)
    _session().current = _State(mm, budget, cap, limit, host, getattr(mm, "MAX_PINNED_MEMORY", None), gauge)
    if budget is not None:
        accounting.publish_loads(True)
        _seed_preexisting(mm)
    return cap


def stop():
    """Drop the budget (giving a host-scope share back) and every record of pins; ComfyUI is not touched."""
    session = STATE.existing_part(PinSession)
    if session is None:
        return
    state, session.current = session.current, None
    accounting.publish_loads(False)
    session.local.__dict__.clear()
    session.deferred.clear()
    if state is not None and state.budget is not None:
        try:
            state.budget.close()
        except Exception as exc:
            internal_error("closing the pin budget", exc)


def managing(mm=None):
    """True when comfy_memx budgets pins (for ComfyUI's model_management ``mm``, when given)."""
    state = _session().current
    return state is not None and state.budget is not None and (mm is None or state.mm is mm)


def started_for(mm):
    """True when :func:`start` ran for ComfyUI's model_management ``mm`` (pinning budgeted, or turned off)."""
    state = _session().current
    return state is not None and state.mm is mm


def budget():
    """The process-wide :class:`~comfy_memx.pins.budget.PinBudget`, or None when comfy_memx does not budget pins."""
    return _session().current.budget if _session().current is not None else None


def cap():
    """The :class:`~comfy_memx.pins.cap.PinCap` resolved by :func:`start`, or None before it."""
    return _session().current.cap if _session().current is not None else None


def comfyui_max():
    """``MAX_PINNED_MEMORY`` as ComfyUI computed it before comfy_memx applied its cap (None before :func:`start`)."""
    return _session().current.comfyui_max if _session().current is not None else None


def startup_line():
    """The INFO line for the cap :func:`start` resolved (see :func:`cap_line`); None before it."""
    state = _session().current
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


# -- legacy tensor pins (comfy.model_management.pin_memory / unpin_memory) ----------------------------------------

def before_tensor_pin(tensor, caller):
    """Decide a ``pin_memory(tensor)`` call; ``caller`` is the frame that called ComfyUI's function.

    Returns None (not budgeted: ComfyUI will refuse it itself, or comfy_memx is inactive), :data:`REFUSED` (over
    the budget, or already pinned), or a grant to pass to :func:`after_tensor_pin` with the result of the real pin.
    """
    state = _session().current
    if state is None or state.budget is None:
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
    model_id = _patcher_model_id(_calling_patcher(caller))
    _sync_load_scope(state)
    grant = _request(state, model_id, tensor.nbytes)
    if grant is not REFUSED:
        grant.ptr = ptr
    return grant


def after_tensor_pin(grant, pinned):
    """Record the outcome of a granted legacy pin: keep it when ComfyUI pinned, give the bytes back otherwise."""
    state = _session().current
    if state is None:
        return
    if pinned is True:
        state.pins[grant.ptr] = grant.model_id
    else:
        _release(grant.model_id, grant.nbytes)


def before_tensor_unpin(tensor):
    """Return ``(address, pinned bytes)`` of a tensor about to be unpinned, or None when it is not a known pin."""
    state = _session().current
    if state is None or state.budget is None:
        return None
    ptr = tensor.data_ptr()
    size = getattr(state.mm, "PINNED_MEMORY", {}).get(ptr)
    return (ptr, size) if size else None


def after_tensor_unpin(known, unpinned):
    """Give the bytes of a successful unpin back to the budget, under the model that pinned them."""
    state = _session().current
    if state is None or known is None or unpinned is not True:
        return
    ptr, size = known
    _release(state.pins.pop(ptr, PREEXISTING), size)


# -- dynamic pins (comfy.pinned_memory.pin_memory) ---------------------------------------------------------------

def before_module_pin(module, subset, size):
    """Decide a DynamicVRAM ``pin_memory(module, subset, size)`` call; see :func:`before_tensor_pin`.

    ``size`` None means ComfyUI's default (weight and bias, aligned), computed here with ComfyUI's own helper.
    """
    state = _session().current
    if state is None or state.budget is None or getattr(state.mm, "MAX_PINNED_MEMORY", 0) <= 0:
        return None
    if getattr(module, "_pin", None) is not None:
        return None  # already has a pin: ComfyUI re-registers or skips it without a new request
    if size is None:
        helpers = sys.modules.get("comfy.memory_management")
        if helpers is None or not hasattr(helpers, "vram_aligned_size"):
            return None
        size = helpers.vram_aligned_size([getattr(module, "weight", None), getattr(module, "bias", None)])
    if not size or size <= 0:
        return None
    _sync_load_scope(state)
    grant = _request(state, _dynamic_model_id(state, module), int(size))
    if grant is not REFUSED:
        grant.mark = (getattr(state.mm, "TOTAL_PINNED_MEMORY", 0), getattr(_session().local, "freed", 0))
    return grant


def after_module_pin(grant):
    """Keep the part of a granted dynamic pin that ComfyUI registered, give back the rest (ComfyUI declined, or
    moved a pin between layers of one model without registering anything).

    Registered = growth of ``TOTAL_PINNED_MEMORY`` during the call plus what ComfyUI evicted meanwhile through the
    wrapped ``free_pins`` / ``free_registrations`` (those bytes left the total too).
    """
    state = _session().current
    if state is None:
        return
    total_before, freed_before = grant.mark
    registered = (getattr(state.mm, "TOTAL_PINNED_MEMORY", 0) - total_before
                  + getattr(_session().local, "freed", 0) - freed_before)
    kept = max(0, min(int(registered), grant.nbytes))
    if kept < grant.nbytes:
        _release(grant.model_id, grant.nbytes - kept)


# -- ComfyUI's own eviction (free_pins / free_registrations) and its budget checks --------------------------------

def note_pin_check():
    """Called by the ``ensure_pin_budget`` / ``ensure_pin_registerable`` wrappers: keeps the current load in step
    (a load that pins nothing still marks its models as most recently used)."""
    state = _session().current
    if state is not None and state.budget is not None:
        _sync_load_scope(state)


def reorders_eviction(mm):
    """True when this ComfyUI's eviction loops run least recently used first (0.27.0) and comfy_memx walks them
    most recently used first instead; newer releases already walk MRU first (``models_for_pin_eviction``)."""
    return managing(mm) and not hasattr(mm, "models_for_pin_eviction")


def free_registrations_mru(mm, shortfall, evict_active=True):
    """ComfyUI 0.27.0's ``free_registrations`` with the walk reversed: unregister dynamic pins of other models,
    most recently used first, until ``shortfall`` plus ComfyUI's hysteresis is covered; inactive models before
    active ones, active ones only with ``evict_active``; never a model of the load in progress.  Same result."""
    if getattr(mm, "MAX_PINNED_MEMORY", 0) <= 0:
        return False
    if shortfall <= 0:
        return True
    hysteresis = getattr(mm, "REGISTERABLE_PIN_HYSTERESIS", 0)
    remaining = shortfall + hysteresis
    with PIN_LOCK:
        for active in ((False, True) if evict_active else (False,)):
            for patcher, model_id in _dynamic_candidates(mm, active):
                freed = patcher.unregister_inactive_pins(remaining)
                _account_comfy_eviction(model_id, freed, "cap")
                remaining -= freed
                if remaining <= 0:
                    return True
    return remaining <= hysteresis


def free_pins_mru(mm, size, evict_active=False):
    """ComfyUI 0.27.0's ``free_pins`` with the walk reversed: free (``partially_unload_ram``) up to ``size`` bytes
    of other dynamic models' pins, most recently used first, only inactive ones unless ``evict_active``, never a
    model of the load in progress.  Returns the bytes freed, as ComfyUI does."""
    freed_total = 0
    with PIN_LOCK:
        for active in ((False, True) if evict_active else (False,)):
            for patcher, model_id in _dynamic_candidates(mm, active):
                if size - freed_total <= 0:
                    return freed_total
                freed = patcher.partially_unload_ram(size - freed_total)
                _account_comfy_eviction(model_id, freed, "ram_pressure")
                freed_total += freed
    return freed_total


# -- internals ----------------------------------------------------------------------------------------------------

def _request(state, model_id, nbytes):
    loading = (model_id, UNATTRIBUTED, PREEXISTING)
    decision = _call(state.budget.request, model_id, nbytes, loading)
    if decision.refused:
        return REFUSED
    state.gauge.note_granted(nbytes)
    if decision.evict:
        short = _carry_out(state, decision)
        if short:
            # Give the grant back before the evictions that did not happen count again, so that no other
            # thread ever sees more committed than the cap.
            _release(model_id, nbytes)
            for victim, missing in short:
                _call(state.budget.cancel_eviction, victim, missing)
            STATE.events.emit("pin_refused", model=_describe(model_id), model_id=model_id, bytes=nbytes,
                                reason="eviction_failed", policy=state.budget.policy, scope=state.budget.scope)
            return REFUSED
    return _Grant(model_id, nbytes)


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
    record_ref = state.records.get(model_id)
    record = record_ref() if record_ref is not None else None
    module = record.module_ref() if record is not None else None
    if module is None:
        return 0
    freed = 0
    seen_pin_sets = set()
    for patcher_ref in list(record.patchers.values()):
        patcher = patcher_ref()
        if freed >= nbytes:
            break
        if patcher is None or getattr(patcher, "model", None) is not module:
            continue
        if _is_dynamic(patcher):
            freed += _evict_dynamic(state, patcher, model_id, nbytes - freed, reason)
            continue
        pinned = getattr(patcher, "pinned", None)
        if not pinned or id(pinned) in seen_pin_sets:  # clones share their parent's set
            continue
        seen_pin_sets.add(id(pinned))
        for key in list(pinned):
            if freed >= nbytes:
                break
            before = getattr(_session().local, "freed", 0)
            patcher.unpin_weight(key)
            freed += getattr(_session().local, "freed", 0) - before
    return freed


def _evict_dynamic(state, patcher, model_id, nbytes, reason):
    if reason == "ram_pressure":
        freed = patcher.partially_unload_ram(nbytes)
    else:
        freed = patcher.unregister_inactive_pins(nbytes)
    _release(model_id, freed)
    if freed < nbytes:
        # ComfyUI frees dynamic pins on paths comfy_memx does not wrap (end of node, unload): bytes the budget
        # still counts but ComfyUI no longer holds are settled here, as freed.
        actual = _dynamic_registered_bytes(patcher)
        if actual is not None:
            stale = max(0, _call(state.budget.pinned, model_id) - actual)
            stale = min(stale, nbytes - freed)
            _release(model_id, stale)
            freed += stale
    return freed


def _account_comfy_eviction(model_id, freed, reason):
    if freed <= 0:
        return
    _release(model_id, freed)
    state = _session().current
    if state is not None and state.budget is not None:
        STATE.events.emit("pin_evict", model=_describe(model_id), model_id=model_id, bytes=int(freed),
                            reason=reason, policy="mru", scope=state.budget.scope, by="comfyui")


def _dynamic_candidates(mm, active):
    """(patcher, model_id) of the dynamic models ComfyUI may evict, most recently used first."""
    state = _session().current
    protected = _protected_ids()
    found = []
    for index, entry in enumerate(list(getattr(mm, "current_loaded_models", ()))):
        patcher = entry.model
        if patcher is None or not _is_dynamic(patcher):
            continue
        pin_state = patcher.model.dynamic_pins[patcher.load_device]
        if bool(pin_state.get("active")) != active:
            continue
        model_id = _patcher_model_id(patcher)
        if model_id in protected:
            continue
        found.append((index, model_id, patcher))
    if state is not None and state.budget is not None:
        recency = _call(state.budget.recency)
        rank = {model_id: position for position, model_id in enumerate(reversed(recency))}
        found.sort(key=lambda item: (rank.get(item[1], len(rank)), item[0]))
    return [(patcher, model_id) for _, model_id, patcher in found]


def _protected_ids():
    scope = getattr(_session().local, "scope", None)
    return set(scope.model_ids) if scope is not None and scope.open else set()


def _is_dynamic(patcher):
    is_dynamic = getattr(patcher, "is_dynamic", None)
    return bool(is_dynamic()) if is_dynamic is not None else False


def _dynamic_registered_bytes(patcher):
    """Registered bytes of a dynamic model per ComfyUI's own counters (0.27.0 layout), or None if unreadable."""
    try:
        pin_state = patcher.model.dynamic_pins[patcher.load_device]
        return sum(value[3][0] for value in pin_state.values() if isinstance(value, tuple) and len(value) > 3)
    except Exception:
        return None


def _calling_patcher(frame, depth=3):
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


def _patcher_model_id(patcher):
    """The ledger ``model_id`` of a ModelPatcher's torch module (the patcher is remembered weakly), or
    :data:`UNATTRIBUTED`."""
    module = getattr(patcher, "model", None) if patcher is not None else None
    if module is None or not hasattr(patcher, "load_device"):
        return UNATTRIBUTED
    return _record_id(module, patcher)


def _record_id(module, patcher=None):
    record = STATE.ledger.record_for(module)
    if patcher is not None:
        record.add_patcher(patcher)
    state = _session().current
    if state is not None and record.model_id not in state.records:
        state.records[record.model_id] = weakref.ref(record, _record_gone(record.model_id))
    return record.model_id


def _record_gone(model_id):
    def gone(_ref):
        state = _session().current
        if state is None or state.budget is None:
            return
        state.records.pop(model_id, None)
        _later_or_now(lambda: _call(state.budget.forget, model_id))
    return gone


def _dynamic_model_id(state, module):
    """The model whose DynamicVRAM pin state ``module`` (a layer) shares; UNATTRIBUTED when none is loaded."""
    pin_state = getattr(module, "_pin_state", None)
    if pin_state is None:
        return UNATTRIBUTED
    cached = state.pin_owner_of_state.get(id(pin_state))
    if cached is not None:
        top = cached[1]()
        if top is not None and any(value is pin_state for value in getattr(top, "dynamic_pins", {}).values()):
            return cached[0]
    for entry in list(getattr(state.mm, "current_loaded_models", ())):
        patcher = entry.model
        if patcher is None or not _is_dynamic(patcher):
            continue
        pins = getattr(patcher.model, "dynamic_pins", {})
        if any(value is pin_state for value in pins.values()):
            model_id = _record_id(patcher.model, patcher)
            state.pin_owner_of_state[id(pin_state)] = (model_id, weakref.ref(patcher.model))
            return model_id
    return UNATTRIBUTED


def _sync_load_scope(state):
    """Make the budget's load protection follow this thread's innermost ``load_models_gpu`` call.

    The model_management patch publishes each call as an ``accounting.LoadCall`` that dies when the call returns;
    the scope ends then (weakref callback) or at the first pin seen outside any load.
    """
    call = accounting.current_load()
    current = getattr(_session().local, "scope", None)
    if call is None:
        if current is not None:
            _session().local.scope = None
            current.end()
        return
    if current is not None and current.open and current.token_ref() is call:
        return
    if current is not None:
        current.end()
    model_ids = [_patcher_model_id(p) for p in list(call.models or ()) if getattr(p, "model", None) is not None]
    scope = _LoadScope(tuple(dict.fromkeys(model_ids)), state.budget, call)
    _session().local.scope = scope
    _call(state.budget.begin_load, scope.model_ids)


def _release(model_id, nbytes):
    if not nbytes or nbytes <= 0:
        return
    _session().local.freed = getattr(_session().local, "freed", 0) + nbytes
    state = _session().current
    if state is None or state.budget is None:
        return
    budget = state.budget
    _later_or_now(lambda: _call(budget.release, model_id, nbytes))


def _call(method, *args):
    """Call a budget method, marking this thread as inside the budget, then settle deferred releases."""
    _session().local.busy = getattr(_session().local, "busy", 0) + 1
    try:
        result = method(*args)
    finally:
        _session().local.busy -= 1
    if _session().deferred and not _session().local.busy:
        _drain()
    return result


def _later_or_now(action):
    """Run ``action`` now, or after this thread leaves the budget when a finalizer (garbage collection) brought us
    here from inside it: the budget's lock is not reentrant."""
    if getattr(_session().local, "busy", 0):
        _session().deferred.append(action)
    else:
        action()


def _drain():
    while _session().deferred and not getattr(_session().local, "busy", 0):
        try:
            action = _session().deferred.popleft()
        except IndexError:
            return
        action()


def _seed_preexisting(mm):
    """Count pins ComfyUI made before comfy_memx took over (late activation) so the cap covers them too."""
    total = sum(getattr(mm, "PINNED_MEMORY", {}).values())
    if total > 0 and _call(_session().current.budget.request, PREEXISTING, total, (PREEXISTING,)).refused:
        log.warning("comfy_memx: %s pinned before comfy_memx started is above the cap; it is left to ComfyUI",
                    format_bytes(total))


def _emit(event):
    event = dict(event)
    STATE.events.emit(event.pop("event"), **event)


def _describe(model_id):
    return model_id.rpartition("#")[0] or model_id
