"""``POST /memx/free``'s engine: follow one free request through ComfyUI's prompt worker and write its receipt.

ComfyUI's own ``POST /free`` only sets flags on the prompt queue and answers at once; the prompt worker acts on
them after the prompt it is running (if any): ``unload_all_models()``, then ``executor.reset()`` for
``free_memory``, then ``gc.collect()`` and ``soft_empty_cache()`` in the same turn (0.3.64 and 0.27.0 main.py).
A :class:`FreeWatch` sees that sequence without touching ComfyUI:

* ``waiting``: the flags are set, the worker has not started on them;
* ``unloading``: the worker's ``unload_all_models`` for /free runs (announced by
  ``STATE.free_request_hooks``); its ``unload`` events are collected;
* ``collecting``: it returned; the worker resets its caches and collects garbage next;
* ``done``: a full (generation 2) collection finished on the worker's thread (seen through ``gc.callbacks``).
  An automatic full collection that happens to run on that thread during the cache reset ends the wait a moment
  early (rare; the receipt could then list a model that the reset frees right after).

The receipt then lists what was freed, what ComfyUI still has loaded, and the survivors: models whose torch
module is alive although ComfyUI no longer holds them, each with the holder chains of a time-bounded strict
search.  Everything is held by weakref or ``model_id``; a module is strong only inside one search.
The hooks are installed only while a request waits.
"""

import gc
import sys
import threading
import time

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.surface.readmodel import still_loaded

MAX_SEARCHED = 8          # survivors per request that get a holder search (each bounded by COMFY_MEMX_LEAK_BUDGET)

_lock = threading.RLock()  # re-entrant: a gc callback can run on a thread that holds it


class FreeDesk:
    """The free requests being followed in this process (a part of the process state)."""

    def __init__(self):
        self.watches = []
        self.runs_started = 0
        self.subscribed_to = None


def _desk():
    return STATE.part(FreeDesk)


class FreeWatch:
    """One free request, from its flags to the worker's garbage-collection pass; holds no model."""

    def __init__(self, unload_models, free_memory):
        self.unload_models = unload_models
        self.free_memory = free_memory
        self.state = "waiting"
        self.began = time.time()
        self.finished = None
        self.after_run = 0           # worker runs started before this request; a later one is ours
        self.thread_id = None        # the prompt worker's thread, once it started on our flags
        self.unloads = []            # the worker's unload events for this request (plain dicts)
        self.before = {r.model_id: r for r in STATE.ledger.records()}  # records only: weakrefs to modules
        self._event = threading.Event()
        self._callbacks = []

    @property
    def done(self):
        """True once the worker has unloaded, reset its caches and collected garbage for this request."""
        return self._event.is_set()

    def wait(self, timeout):
        """Block until :attr:`done` or ``timeout`` seconds passed; returns :attr:`done`."""
        return self._event.wait(timeout)

    def add_done_callback(self, callback):
        """Call ``callback()`` (on the worker's thread) when the request is done; at once if it already is."""
        with _lock:
            if not self.done:
                self._callbacks.append(callback)
                return
        callback()

    def _finish(self):
        self.state = "done"
        self.finished = time.time()
        self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception as exc:
                internal_error("free-request callback", exc)


def begin(unload_models=True, free_memory=True):
    """Start following a free request; call before setting ComfyUI's flags, and :func:`end` afterwards."""
    watch = FreeWatch(unload_models, free_memory)
    with _lock:
        watch.after_run = _desk().runs_started
        _desk().watches.append(watch)
        if _on_free_phase not in STATE.free_request_hooks:
            STATE.free_request_hooks.append(_on_free_phase)
        if _on_gc not in gc.callbacks:
            gc.callbacks.append(_on_gc)
        if _desk().subscribed_to is not STATE.events:
            _unsubscribe()
            _desk().subscribed_to = STATE.events
            _desk().subscribed_to.subscribe(_on_event)
    return watch


def end(watch):
    """Stop following ``watch``; the hooks are removed when no request waits any more."""
    with _lock:
        if watch in _desk().watches:
            _desk().watches.remove(watch)
        if _desk().watches:
            return
        if _on_free_phase in STATE.free_request_hooks:
            STATE.free_request_hooks.remove(_on_free_phase)
        if _on_gc in gc.callbacks:
            gc.callbacks.remove(_on_gc)
        _unsubscribe()


def waiting():
    """How many free requests are being followed now."""
    with _lock:
        return len(_desk().watches)


def _unsubscribe():
    if _desk().subscribed_to is not None:
        _desk().subscribed_to.unsubscribe(_on_event)
        _desk().subscribed_to = None


def _on_free_phase(phase):
    me = threading.get_ident()
    with _lock:
        if phase == "start":
            _desk().runs_started += 1
            for watch in _desk().watches:
                if watch.state == "waiting" and watch.after_run < _desk().runs_started:
                    watch.state, watch.thread_id = "unloading", me
        elif phase == "end":
            for watch in _desk().watches:
                if watch.state == "unloading" and watch.thread_id == me:
                    watch.state = "collecting"


def _on_gc(phase, info):
    if phase != "stop" or info.get("generation") != 2:
        return
    me = threading.get_ident()
    with _lock:
        finished = [w for w in _desk().watches if w.state == "collecting" and w.thread_id == me]
        for watch in finished:
            watch._finish()


def _on_event(event):
    if event.get("event") != "unload" or event.get("reason") != "free_request":
        return
    me = threading.get_ident()
    with _lock:
        for watch in _desk().watches:
            if watch.state == "unloading" and watch.thread_id == me:
                watch.unloads.append({"model": event.get("model"), "model_id": event.get("model_id"),
                                      "bytes": event.get("bytes", 0), "device": event.get("device")})


def set_flags(watch, prompt_queue):
    """Set ComfyUI's ``/free`` flags for ``watch`` (the same flags its own POST /free sets)."""
    if watch.unload_models:
        prompt_queue.set_flag("unload_models", True)
    if watch.free_memory:
        prompt_queue.set_flag("free_memory", True)


def nudge(watch, prompt_queue):
    """Set the flags again while the worker has not started on them; returns True when it did.

    # COMFY: the prompt worker reads the flags after each prompt, then collects garbage, then waits on the queue
    # (up to 1000 s).  A flag set between its read and its wait wakes nobody, so it would sit until the next prompt.
    """
    if watch.state != "waiting":
        return False
    set_flags(watch, prompt_queue)
    return True


def prompt_running(prompt_queue):
    """True when ComfyUI's prompt worker is executing a prompt (the flags wait for it)."""
    running = getattr(prompt_queue, "currently_running", None)
    return bool(running)


def receipt(watch, model_management=None, search_holders=True):
    """The receipt of ``watch``: freed, still_loaded, survivors (with holder chains when ``search_holders``).

    Survivors are taken among the models alive when the request began, plus every leaked model: with
    ``free_memory`` ComfyUI has dropped its caches, so any of them still alive is kept by something else; with
    ``unload_models`` only, a model counts when ComfyUI warned about it or no ModelPatcher refers to it any more.
    Before the worker is done only the leaked ones are known, and no search runs.
    """
    if model_management is None:
        model_management = sys.modules.get("comfy.model_management")
    loaded = still_loaded(model_management)
    loaded_ids = {row["model_id"] for row in loaded}
    freed = _freed(watch)
    survivors = _survivors(watch, loaded_ids)
    if search_holders:
        for survivor, record in survivors[:MAX_SEARCHED]:
            try:
                survivor.update(_holders_of(record, [watch, survivors]))
            except Exception as exc:  # a failed search leaves the survivor listed, with the error
                survivor["search"] = {"error": f"{type(exc).__name__}: {exc}"}
                try:
                    internal_error("holder search for /memx/free", exc)
                except Exception:
                    pass
        for survivor, _ in survivors[MAX_SEARCHED:]:
            survivor["search"] = {"note": f"not searched: only {MAX_SEARCHED} survivors are searched per request"}
    rows = [survivor for survivor, _ in survivors]
    waited = (watch.finished or time.time()) - watch.began
    return {"status": "done" if watch.done else "pending", "worker": watch.state, "waited_s": round(waited, 3),
            "request": {"unload_models": watch.unload_models, "free_memory": watch.free_memory},
            "freed": freed, "freed_bytes": sum(row["unloaded_bytes"] for row in freed),
            "released_bytes": sum(row["bytes"] for row in freed if row["released"]),
            "still_loaded": loaded, "survivors": rows,
            "survivor_bytes": sum(row["bytes"] for row in rows)}


def _freed(watch):
    with _lock:
        unloads = list(watch.unloads)
    by_id = {}
    for unload in unloads:
        row = by_id.setdefault(unload["model_id"], {"model": unload["model"], "model_id": unload["model_id"],
                                                    "unloaded_bytes": 0, "device": unload["device"]})
        row["unloaded_bytes"] += int(unload["bytes"] or 0)
    if watch.done:
        for model_id, record in watch.before.items():
            if not record.alive and model_id not in by_id:
                by_id[model_id] = {"model": record.model, "model_id": model_id, "unloaded_bytes": 0,
                                   "device": record.device}
    rows = []
    for model_id, row in by_id.items():
        record = watch.before.get(model_id)
        row["bytes"] = record.model_bytes if record is not None else 0
        row["released"] = record is not None and not record.alive
        row["owner"] = record.owner._asdict() if record is not None else None
        rows.append(row)
    return rows


def _survivors(watch, loaded_ids):
    candidates = dict(watch.before) if watch.done else {}
    for record in STATE.ledger.records():
        if record.leak is not None:
            candidates.setdefault(record.model_id, record)
    found = []
    for model_id, record in candidates.items():
        if model_id in loaded_ids or not record.alive:
            continue
        why = _why_alive(record)
        if why == "kept" and not (watch.done and watch.free_memory):
            continue
        module = record.module_ref()
        resident = int(getattr(module, "model_loaded_weight_memory", 0) or 0) if module is not None else 0
        del module
        found.append(({"model": record.model, "model_id": model_id, "owner": record.owner._asdict(),
                       "bytes": record.model_bytes, "resident_bytes": resident, "reason": why, "leak": record.leak,
                       "holders": None, "search": None}, record))
    return found


def _why_alive(record):
    if record.leak is not None:
        return "leaked"
    if record.live_patchers() == 0:
        return "orphaned"
    return "kept"


def _holders_of(record, ignore):
    from comfy_memx.leaks import holders
    module = record.module_ref()
    if module is None:
        return {"holders": [], "search": {"note": "freed before the search"}}
    try:
        report = holders.find_holders(module, budget_s=STATE.config.leak_budget,
                                      ignore=[*ignore, *STATE.ledger.containers()],
                                      ignore_frames_up_to=sys._getframe())
    finally:
        del module
    return {"holders": [{"path": c.path, "package": c.package, "root_kind": c.root_kind} for c in report.chains],
            "search": {"seconds": round(report.seconds, 4), "objects_visited": report.objects_visited,
                       "complete": report.complete, "note": report.note or None}}
