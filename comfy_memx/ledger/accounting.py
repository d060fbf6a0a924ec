"""Turns what the model-management wrappers observe into ledger updates and ``load``/``unload`` events.

Unload reasons travel down the call chain in a per-thread stack of ``(reason, frame)``: ``unload_all_models``
pushes ``unload_all``, ``free_request`` (called by ComfyUI's prompt worker for POST /free) or ``oom`` (called while
an out-of-memory exception is being handled); ``free_memory`` pushes ``memory_pressure`` unless a caller already
chose a reason; ``LoadedModel.model_unload`` reads the top (``other`` when called directly, e.g. by a custom node).
The frame is the caller that entered the outermost scope: ``ledger.causes`` turns it into ``requested_by`` only when
an unload really happens.  ``load_models_gpu`` calls are scopes too (:class:`LoadScope`): the models being loaded,
for memory-pressure causes, and the full unloads seen during the call.
Nothing here walks the heap or a state dict: every figure is an attribute read that ComfyUI itself keeps.
The outermost ``free_request`` scope is announced to ``STATE.free_request_hooks`` (``POST /memx/free`` follows it).
"""

import itertools
import sys
import threading
import time
import weakref

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.ledger import causes
from comfy_memx.ledger.attribution import current_owner

REASONS = ("memory_pressure", "unload_all", "free_request", "clone_replaced", "dropped", "oom", "other")
_OWN_REFS = 2  # the caller's local variable and getrefcount's own argument

class _ReasonStack(threading.local):
    def __init__(self):
        self.stack = []


_reasons = _ReasonStack()


def push_reason(reason, keep_outer=False, frame=None):
    """Enter a scope whose unloads have ``reason`` (or the enclosing scope's when ``keep_outer``); ``frame`` is the
    caller that asked (default: the caller of this function)."""
    stack = _reasons.stack
    if stack:
        stack.append(stack[-1] if keep_outer else (reason, stack[-1][1]))
        return
    if reason == "free_request" and STATE.free_request_hooks:
        _announce_free_request("start")
    stack.append((reason, frame if frame is not None else sys._getframe(1)))


def pop_reason():
    """Leave the scope entered by the matching :func:`push_reason`."""
    stack = _reasons.stack
    if stack.pop()[0] == "free_request" and not stack and STATE.free_request_hooks:
        _announce_free_request("end")


def _announce_free_request(phase):
    for hook in list(STATE.free_request_hooks):
        try:
            hook(phase)
        except Exception as exc:
            internal_error("free-request hook", exc)


class LoadCall:
    """One ``load_models_gpu`` call in progress on this thread; it dies when the call returns (pinning watches)."""
    __slots__ = ("models", "__weakref__")

    def __init__(self, models):
        self.models = models


class _LoadStack(threading.local):
    def __init__(self):
        self.stack = []


_loads = _LoadStack()


class LoadScope:
    """A ``load_models_gpu`` call (``models``, the caller ``frame``) in progress on this thread; ``unloaded``
    (None until the first) collects the ids of the ``real_model`` weakrefs of the entries that were fully unloaded,
    or reported otherwise, during it."""
    __slots__ = ("models", "frame", "unloaded")

    def __init__(self, models, frame):
        self.models, self.frame, self.unloaded = models, frame, None


class _Scopes(threading.local):
    def __init__(self):
        self.scopes = []


_scopes = _Scopes()


def load_scopes():
    """This thread's stack of :class:`LoadScope` (the load_models_gpu wrapper pushes and pops it inline)."""
    return _scopes.scopes


def current_load_scope():
    """The innermost ``load_models_gpu`` scope of this thread, or None."""
    scopes = _scopes.scopes
    return scopes[-1] if scopes else None


def note_unloaded(module_ref):
    """The entry whose ``real_model`` weakref is ``module_ref`` left ComfyUI's list and was reported."""
    key = id(module_ref)
    for scope in _scopes.scopes:
        if scope.unloaded is None:
            scope.unloaded = set()
        scope.unloaded.add(key)


def publish_loads(on):
    """Make the load_models_gpu wrapper publish :class:`LoadCall` objects (the pin budget turns this on; without
    it load_models_gpu pays nothing for them)."""
    STATE.publish_loads = bool(on)


def load_stack():
    """This thread's stack of :class:`LoadCall` (the load_models_gpu wrapper pushes and pops it)."""
    return _loads.stack


def current_load():
    """The innermost ``load_models_gpu`` call in progress on this thread, or None."""
    stack = _loads.stack
    return stack[-1] if stack else None


def reason_stack():
    """This thread's stack of unload reasons (wrappers on hot paths push and pop it directly)."""
    return _reasons.stack


def current_reason():
    """The reason of the innermost unload scope of this thread, ``other`` outside any."""
    stack = _reasons.stack
    return stack[-1][0] if stack else "other"


def current_cause(caller_frame):
    """``(reason, requested_by)`` of an unload happening now; ``caller_frame`` asked when no scope is open."""
    stack = _reasons.stack
    reason, frame = stack[-1] if stack else ("other", caller_frame)
    return reason, causes.requested_by(reason, frame, current_load_scope())


def reason_for_unload_all(caller_frame, oom_test):
    """Why ``unload_all_models`` was called: ``oom``, ``free_request`` or ``unload_all``."""
    exc = sys.exc_info()[1]
    if exc is not None and oom_test is not None:
        try:
            if oom_test(exc):
                return "oom"
        except Exception:
            pass
    if caller_frame is not None and caller_frame.f_code.co_name == "prompt_worker":
        return "free_request"
    return "unload_all"


def external_refcount(obj_refcount):
    """``sys.getrefcount`` taken by a wrapper holding the object in one local, minus those two own references."""
    return max(0, obj_refcount - _OWN_REFS)


def on_load(entry, patcher, loaded_before, seconds, caller_frame):
    """Record ``LoadedModel.model_load``: bytes moved, time, owner; emit a ``load`` event when bytes moved."""
    module = getattr(patcher, "model", None)
    if module is None:
        return
    record = STATE.ledger.record_for(module)
    record.add_patcher(patcher)
    loaded_after = patcher.loaded_size()
    moved = loaded_after - loaded_before
    record.patcher_id = id(patcher)
    record.device = str(getattr(entry, "device", None))
    record.model_bytes = patcher.model_size()
    record.loaded_bytes = loaded_after
    record.touch()
    if moved <= 0 and record.loads:
        return
    record.owner = current_owner(caller_frame)
    record.copies = copies_bytes(patcher)
    record.loads += 1
    record.loaded_at = record.last_used
    reload = causes.on_loaded(record, moved, seconds)
    if STATE.events.wanted:
        copied = record.copies
        STATE.events.emit("load", **_identity(record), bytes=moved, loaded_bytes=loaded_after,
                          seconds=round(seconds, 6), gb_per_s=_rate(moved, seconds) if copied else None,
                          copied=copied, reload=reload)


def on_unload(patcher, module, loaded_before, loaded_after, fully, seconds, refcounts, caller_frame, reason=None,
              requested=None):
    """Record one unload (``model_unload``, a silent clone replacement, an entry dropped from ComfyUI's list) and
    emit an ``unload`` event with its cause; ``caller_frame`` asked for it when no unload scope is open."""
    if module is None:
        return
    record = STATE.ledger.record_for(module)
    if patcher is not None:
        record.add_patcher(patcher)
    freed = max(0, loaded_before - loaded_after)
    record.loaded_bytes = loaded_after
    record.touch()
    scope_reason, scope_requested = current_cause(caller_frame) if requested is None else (None, requested)
    reason = reason or scope_reason
    if requested is None and reason != scope_reason:
        requested = causes.requested_by(reason, caller_frame, current_load_scope())
    requested = requested or scope_requested
    when = round(time.time(), 6)
    causes.on_unloaded(record, reason, requested, freed, when)
    record.unload_seq = next(_unload_numbers)
    # ComfyUI's LoadedModel holds its patcher by weakref: after model_unload it may already be gone
    copied = copies_bytes(patcher) if patcher is not None else record.copies
    unload = {"reason": reason, "requested_by": requested, "bytes": freed, "partial": not fully, "copied": copied,
              "refcounts": refcounts, "extra_referrers": max(0, refcounts["module"] - record.live_patchers()),
              "seconds": round(seconds, 6), "gb_per_s": _rate(freed, seconds) if copied is not False else None,
              "time": when}
    record.unloads.append(unload)
    if STATE.events.wanted:
        STATE.events.emit("unload", **_identity(record), **unload)


_unload_numbers = itertools.count()


def loaded_entry_refs(model_management):
    """``(entry weakref, module weakref)`` of every loaded entry of ComfyUI's ``current_loaded_models``: nothing
    here keeps an entry or a model alive (the entry weakref is None for an entry type without weakref support)."""
    refs = []
    for entry in model_management.current_loaded_models:
        module_ref = entry.real_model
        if module_ref is not None:
            try:
                refs.append((weakref.ref(entry), module_ref))
            except TypeError:
                refs.append((None, module_ref))
    return refs


def entries_snapshot(model_management):
    """What ComfyUI's ``current_loaded_models`` holds now, by weakref, with the number of the last reported unload:
    taken before a node runs, so that :func:`note_dropped` can tell what the node removed behind ComfyUI's back."""
    return next(_unload_numbers), loaded_entry_refs(model_management)


def note_dropped(model_management, snapshot, requested):
    """Report, as unloads of reason ``dropped`` asked for by ``requested``, the entries that left ComfyUI's list
    since ``snapshot`` while their module lives and no unload of theirs was reported (a custom node removed them
    from ``current_loaded_models``: ComfyUI no longer manages those weights, which stay where they were)."""
    started, refs = snapshot
    remaining = {id(entry) for entry in model_management.current_loaded_models}
    for entry_ref, module_ref in refs:
        entry = entry_ref() if entry_ref is not None else None
        if entry is not None and (id(entry) in remaining or entry.real_model is None):
            continue
        if entry_ref is None:
            continue
        module = module_ref()
        if module is None:
            continue
        record = STATE.ledger.record_for(module)
        if record.unload_seq > started:
            continue  # reported during the node: unloaded, or replaced by a clone
        patcher = entry.model if entry is not None else None
        del entry
        loaded = int(getattr(module, "model_loaded_weight_memory", 0) or 0)
        refcounts = {"patcher": external_refcount(sys.getrefcount(patcher)) if patcher is not None else 0,
                     "module": external_refcount(sys.getrefcount(module))}
        on_unload(patcher, module, loaded, loaded, True, 0.0, refcounts, None, reason="dropped", requested=requested)
        del module, patcher


def copies_bytes(patcher):
    """False when ``patcher``'s load and offload devices are the same (``--cpu``): then a load or an unload only
    changes ComfyUI's accounting of loaded bytes and copies nothing, so it has no transfer rate."""
    try:
        return str(patcher.load_device) != str(patcher.offload_device)
    except AttributeError:
        return None


def _identity(record):
    return {"model": record.model, "model_id": record.model_id, "patcher_id": record.patcher_id,
            "model_bytes": record.model_bytes, "device": record.device, "owner": record.owner._asdict()}


def _rate(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 and nbytes > 0 else None
