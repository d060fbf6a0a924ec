"""Turns what the model-management wrappers observe into ledger updates and ``load``/``unload`` events.

Unload reasons travel down the call chain in a per-thread stack: ``unload_all_models`` pushes ``unload_all``,
``free_request`` (called by ComfyUI's prompt worker for POST /free) or ``oom`` (called while an out-of-memory
exception is being handled); ``free_memory`` pushes ``memory_pressure`` unless a caller already chose a reason;
``LoadedModel.model_unload`` reads the top (``other`` when called directly, e.g. by a custom node).
Nothing here walks the heap or a state dict: every figure is an attribute read that ComfyUI itself keeps.
The outermost ``free_request`` scope is announced to ``STATE.free_request_hooks`` (``POST /memx/free`` follows it).
"""

import sys
import threading
import time

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.ledger.attribution import current_owner

REASONS = ("memory_pressure", "unload_all", "free_request", "clone_replaced", "oom", "other")
_OWN_REFS = 2  # the caller's local variable and getrefcount's own argument

class _ReasonStack(threading.local):
    def __init__(self):
        self.stack = []


_reasons = _ReasonStack()


def push_reason(reason, keep_outer=False):
    """Enter a scope whose unloads have ``reason`` (or the enclosing scope's reason when ``keep_outer``)."""
    stack = _reasons.stack
    if stack:
        stack.append(stack[-1] if keep_outer else reason)
        return
    if reason == "free_request" and STATE.free_request_hooks:
        _announce_free_request("start")
    stack.append(reason)


def pop_reason():
    """Leave the scope entered by the matching :func:`push_reason`."""
    stack = _reasons.stack
    if stack.pop() == "free_request" and not stack and STATE.free_request_hooks:
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


class _UnloadedInLoad(threading.local):
    def __init__(self):
        self.scopes = []


_unloaded_in_load = _UnloadedInLoad()


def begin_load_scope():
    """A ``load_models_gpu`` call starts on this thread: full unloads during it are noted (see :func:`note_unloaded`)."""
    _unloaded_in_load.scopes.append(set())


def end_load_scope():
    """The ``load_models_gpu`` call ends: returns the ids of the module weakrefs that ``model_unload`` fully unloaded
    during it (its clone-replacement check skips them; they were reported by the unload)."""
    scopes = _unloaded_in_load.scopes
    return scopes.pop() if scopes else set()


def note_unloaded(module_ref):
    """``model_unload`` fully unloaded the entry whose ``real_model`` weakref is ``module_ref``."""
    scopes = _unloaded_in_load.scopes
    if scopes:
        scopes[-1].add(id(module_ref))


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
    return stack[-1] if stack else "other"


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
    record.loads += 1
    record.loaded_at = record.last_used
    if STATE.events.wanted:
        STATE.events.emit("load", **_identity(record), bytes=moved, loaded_bytes=loaded_after,
                            seconds=round(seconds, 6), gb_per_s=_rate(moved, seconds))


def on_unload(patcher, module, loaded_before, loaded_after, fully, seconds, refcounts, reason=None):
    """Record one unload (``model_unload`` or a silent clone replacement) and emit an ``unload`` event."""
    if module is None:
        return
    record = STATE.ledger.record_for(module)
    if patcher is not None:
        record.add_patcher(patcher)
    freed = max(0, loaded_before - loaded_after)
    record.loaded_bytes = loaded_after
    record.touch()
    unload = {"reason": reason or current_reason(), "bytes": freed, "partial": not fully,
              "refcounts": refcounts, "extra_referrers": max(0, refcounts["module"] - record.live_patchers()),
              "seconds": round(seconds, 6), "gb_per_s": _rate(freed, seconds), "time": round(time.time(), 6)}
    record.unloads.append(unload)
    if STATE.events.wanted:
        STATE.events.emit("unload", **_identity(record), **unload)


def _identity(record):
    return {"model": record.model, "model_id": record.model_id, "patcher_id": record.patcher_id,
            "model_bytes": record.model_bytes, "device": record.device, "owner": record.owner._asdict()}


def _rate(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 and nbytes > 0 else None
