"""Turns what the model-management wrappers observe into ledger updates and ``load``/``unload`` events.

Unload reasons travel down the call chain with the ``unload_scope`` pair (``comfy_memx.core.signals``), whose record
of each scope in progress keeps the ledger's memo ``(reason, own)``: ``unload_all_models`` chooses its own reason,
``unload_all``, ``free_request`` (called by ComfyUI's prompt worker for POST /free) or ``oom`` (called while an
out-of-memory exception is being handled); ``free_memory`` is ``memory_pressure`` unless an enclosing scope already
chose a reason; ``LoadedModel.model_unload`` reads them (``other`` outside any scope, e.g. called by a custom node).
The frame is the caller that entered the outermost scope, found again on the live stack by the pair
(``core.pairs.caller``): ``ledger.causes`` turns it into ``requested_by`` only when an unload really happens.  A ``load_models_gpu`` call is the ``load`` pair's record (its models by weakref, its caller by id: what
memory-pressure causes and the pin budget, which spares them, read); the ledger's memo of it is a
:class:`LoadBooks` (the entries loaded when it began, the full unloads seen during it), only when something was
loaded, so that the entries the call dropped silently (a clone replacing its original) are reported when it
returns.  The pair keeps and unwinds these records, never this module.
Nothing here walks the heap or a state dict: every figure is an attribute read that ComfyUI itself keeps.
The end of the outermost ``free_request`` scope fires ``signals.free_request_unload_ended`` (``POST /memx/free``
follows it).
"""

import sys
from sys import exc_info
import time
import weakref

from comfy_memx.core import pairs, signals
from comfy_memx.core.errors import internal_error
from comfy_memx.core.refs import external_refcount
from comfy_memx.core.state import STATE
from comfy_memx.ledger import causes
from comfy_memx.ledger.attribution import WORKER_FUNCTION, current_owner


def enter_unload_scope(model_management, site, caller_frame):
    """The ``unload_scope`` pair's "before" half: the memo ``(reason, own)`` of a scope that ``site`` enters
    (``free_memory``, ``unload_all_models``, ``unload_model_and_clones``) from ``caller_frame``.  ``unload_all_models``
    chooses its own reason (``own``): ``oom``, ``free_request`` or ``unload_all``; the others keep an enclosing
    scope's (their reason counts only when no scope encloses them).  Every scope keeps the outermost one's frame
    (the pair's record of it): see :func:`current_cause`."""
    if site != "unload_all_models":
        return UNLOAD_SCOPE_REASONS.get(site, "other"), False
    if exc_info()[1] is None:   # no exception being handled (the common case): no out-of-memory to test for
        if caller_frame is not None and caller_frame.f_code.co_name == WORKER_FUNCTION:   # (_caller_reason, inline)
            return "free_request", True
        return "unload_all", True
    try:
        return reason_for_unload_all(caller_frame, _oom_test(model_management)), True
    except Exception as exc:
        internal_error("unload reason", exc)
        return "unload_all", True


def exit_unload_scope(scope, model_management, site):
    """The ``unload_scope`` pair's "after" half: when the outermost scope was a ``free_request`` (ComfyUI's worker
    serving free flags), fire ``free_request_unload_ended``."""
    if scope[0] == "free_request" and len(signals.unload_scope.calls()) == 1:
        signals.free_request_unload_ended.fire()


UNLOAD_SCOPE_REASONS = {"free_memory": "memory_pressure", "unload_model_and_clones": "other"}
"""The reason of an unload scope entered outside any other (``unload_all_models`` chooses its own)."""


def _oom_test(mm):
    if hasattr(mm, "is_oom"):
        return mm.is_oom
    oom_type = getattr(mm, "OOM_EXCEPTION", None)
    return (lambda exc: isinstance(exc, oom_type)) if isinstance(oom_type, type) else None


def scope_of_unloads():
    """``(reason, frame)`` of the unloads happening now on this thread: the reason of the outermost unload scope whose
    "before" half worked, or of an ``unload_all_models`` inside it, and the frame that entered the outermost one;
    None outside any scope."""
    scopes = signals.unload_scope
    found = None
    for call in scopes.calls():
        scope = scopes.memo(call, enter_unload_scope)
        if scope is None:
            continue
        if found is None:
            found = [scope[0], pairs.caller(call)]
        elif scope[1]:
            found[0] = scope[0]
    return found


class LoadBooks:
    """The ledger's memo of one ``load_models_gpu`` call (the ``load`` pair) that began with entries loaded:
    ``before`` (``(entry weakref, module weakref)`` of those entries) and ``unloaded`` (None until the first: the ids
    of the ``real_model`` weakrefs of the entries fully unloaded, or reported otherwise, during the call)."""
    __slots__ = ("before", "unloaded")

    def __init__(self, before):
        self.before, self.unloaded = before, None


def begin_load(model_management, models, frame):
    """The ``load`` pair's "before" half: :class:`LoadBooks` of the entries loaded now, or None when none is (then
    the call can drop none silently and its "after" has nothing to do)."""
    if not model_management.current_loaded_models:
        return None
    return LoadBooks(loaded_entry_refs(model_management))


def end_load(books, model_management, models):
    """The ``load`` pair's "after" half: report the entries the call dropped silently (a clone replaced them)."""
    if books.before:
        _note_clone_replacements(model_management, books, pairs.caller(signals.load.current()))


def current_load():
    """The innermost ``load_models_gpu`` call in progress on this thread (the ``load`` pair's record: its models
    by ``core.pairs.subjects``, its caller by ``core.pairs.caller``), or None."""
    return signals.load.current()


def note_unloaded(module_ref):
    """The entry whose ``real_model`` weakref is ``module_ref`` left ComfyUI's list and was reported."""
    key = id(module_ref)
    loads = signals.load
    for call in loads.calls():
        books = loads.memo(call, begin_load)
        if books is not None:
            if books.unloaded is None:
                books.unloaded = set()
            books.unloaded.add(key)


def current_cause(caller_frame):
    """``(reason, requested_by)`` of an unload happening now; ``caller_frame`` asked when no scope is open."""
    reason, frame = scope_of_unloads() or ("other", caller_frame)
    return reason, causes.requested_by(reason, frame, current_load())


def reason_for_unload_all(caller_frame, oom_test):
    """Why ``unload_all_models`` was called: ``oom``, ``free_request`` or ``unload_all``."""
    exc = exc_info()[1]
    if exc is not None and oom_test is not None:
        try:
            if oom_test(exc):
                return "oom"
        except Exception:
            pass
    return _caller_reason(caller_frame)


def _caller_reason(caller_frame):
    """``free_request`` when ComfyUI's prompt worker called, else ``unload_all``."""
    if caller_frame is not None and caller_frame.f_code.co_name == WORKER_FUNCTION:
        return "free_request"
    return "unload_all"


def unload_refcounts(patcher_refcount, module_refcount):
    """The ``refcounts`` of an unload from ``sys.getrefcount`` of its patcher (None when gone) and its module, each
    taken with the object in one local of the caller's frame (see ``core.refs``)."""
    return {"patcher": external_refcount(patcher_refcount) if patcher_refcount is not None else 0,
            "module": external_refcount(module_refcount)}


def on_load(entry, patcher, loaded_before, seconds, caller_frame):
    """Record ``LoadedModel.model_load``: bytes moved, time, owner; emit a ``load`` event when bytes moved."""
    module = getattr(patcher, "model", None)
    if module is None:
        return
    record = STATE.ledger.record_for(module)
    loaded_after = patcher.loaded_size()
    moved = loaded_after - loaded_before
    record.model_bytes = patcher.model_size()
    _seen_loaded(record, entry, patcher, loaded_after)
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
        requested = causes.requested_by(reason, caller_frame, current_load())
    requested = requested or scope_requested
    when = round(time.time(), 6)
    causes.on_unloaded(record, reason, requested, freed, when)
    record.unload_seq = STATE.ledger.next_unload_number()
    # ComfyUI's LoadedModel holds its patcher by weakref: after model_unload it may already be gone
    copied = copies_bytes(patcher) if patcher is not None else record.copies
    unload = {"reason": reason, "requested_by": requested, "bytes": freed, "partial": not fully, "copied": copied,
              "refcounts": refcounts, "extra_referrers": max(0, refcounts["module"] - record.live_patchers()),
              "seconds": round(seconds, 6), "gb_per_s": _rate(freed, seconds) if copied is not False else None,
              "time": when}
    record.unloads.append(unload)
    if STATE.events.wanted:
        STATE.events.emit("unload", **_identity(record), **unload)


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
    return STATE.ledger.next_unload_number(), loaded_entry_refs(model_management)


def note_dropped(model_management, snapshot, requested):
    """Report, as unloads of reason ``dropped`` asked for by ``requested``, the entries that left ComfyUI's list
    since ``snapshot`` while their module lives and no unload of theirs was reported (a custom node removed them
    from ``current_loaded_models``: ComfyUI no longer manages those weights, which stay where they were)."""
    started, refs = snapshot

    def reported(_entry_alive, _module_ref, module):
        return STATE.ledger.record_for(module).unload_seq > started   # during the node: unloaded, or a clone's

    _report_departed(model_management, refs, reported, "dropped", None, requested)


def _note_clone_replacements(model_management, books, frame):
    # COMFY: load_models_gpu pops entries whose patcher is a clone of a model being loaded and detaches them
    # without model_unload (0.3.64, 0.27.0, 0.33.0); such an entry left the list (and may already be gone) while its
    # module lives on, often under a new entry for the clone.  Full unloads during the call are in ``unloaded``.
    def reported(entry_alive, module_ref, _module):
        return not entry_alive and books.unloaded is not None and id(module_ref) in books.unloaded

    _report_departed(model_management, books.before, reported, "clone_replaced", frame, None)


def _report_departed(model_management, refs, reported, reason, frame, requested):
    """Report as unloads of ``reason`` the entries of ``refs`` (:func:`loaded_entry_refs`) that left ComfyUI's list
    while their module lives, unless ``reported(entry_alive, module_ref, module)``.  Holds each entry, patcher and
    module in one local only while it is counted (the refcounts), never across the loop."""
    remaining = {id(entry) for entry in model_management.current_loaded_models}
    for entry_ref, module_ref in refs:
        if entry_ref is None:
            continue
        entry = entry_ref()
        if entry is not None and (id(entry) in remaining or entry.real_model is None):
            continue
        module = module_ref()
        if module is None or reported(entry is not None, module_ref, module):
            continue
        patcher = entry.model if entry is not None else None
        del entry
        refcounts = unload_refcounts(sys.getrefcount(patcher) if patcher is not None else None,
                                     sys.getrefcount(module))
        if reason == "clone_replaced":
            loaded = (patcher.loaded_size() if patcher is not None
                      else int(getattr(module, "model_loaded_weight_memory", 0)))
            note_unloaded(module_ref)
        else:
            loaded = int(getattr(module, "model_loaded_weight_memory", 0) or 0)
        on_unload(patcher, module, loaded, loaded, True, 0.0, refcounts, frame, reason=reason, requested=requested)
        del module, patcher


def loaded_size(entry):
    """Bytes of ComfyUI's ``entry`` (a LoadedModel) on its device, read without keeping its patcher in a local
    variable of the caller."""
    patcher = entry.model
    return patcher.loaded_size() if patcher is not None else 0


def note_model_unload(entry, module_ref, loaded_before, fully, seconds, caller_frame):
    """Record ``LoadedModel.model_unload`` of ``entry`` (its ``real_model`` weakref ``module_ref`` read before the
    call, which may clear it): bytes freed, partial or full, refcounts, cause."""
    module = module_ref() if module_ref is not None else None
    if module is None:
        return
    if fully:
        note_unloaded(module_ref)
    patcher = entry.model
    after = patcher.loaded_size() if patcher is not None else 0
    refcounts = unload_refcounts(sys.getrefcount(patcher) if patcher is not None else None, sys.getrefcount(module))
    on_unload(patcher, module, loaded_before, after, fully, seconds, refcounts, caller_frame)


def adopt_loaded(model_management):
    """Late activation: put the models ComfyUI already holds into the ledger (owner unknown, no load counted)."""
    for entry in list(getattr(model_management, "current_loaded_models", ())):
        patcher = entry.model
        module = entry.real_model() if entry.real_model is not None else None
        if patcher is None or module is None:
            continue
        _seen_loaded(STATE.ledger.record_for(module), entry, patcher, patcher.loaded_size())
        del module


def _seen_loaded(record, entry, patcher, loaded_bytes):
    """What every sighting of ComfyUI's ``entry`` loaded sets in ``record``: its patcher, device, bytes, last use."""
    record.add_patcher(patcher)
    record.patcher_id = id(patcher)
    record.device = str(getattr(entry, "device", None))
    record.loaded_bytes = loaded_bytes
    record.touch()


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
