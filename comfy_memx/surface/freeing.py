"""``POST /memx/free``'s engine: follow one free request through ComfyUI's prompt worker and write its receipt.

ComfyUI's own ``POST /free`` only sets flags on the prompt queue and answers at once.  The prompt worker reads (and
clears) them with ``PromptQueue.get_flags()`` after the prompt it is running, if any, and acts on what it read:
``unload_all_models()`` (``unload_models``, which defaults to ``free_memory``), ``executor.reset()``
(``free_memory``), then ``gc.collect()`` and ``soft_empty_cache()`` in the same turn (0.3.64, 0.27.0 and 0.33.0
main.py).  A request is matched to the worker run that *consumed its flags*, exactly:

* :func:`submit` registers the request and sets its flags while holding the queue's own mutex (ComfyUI's
  ``RLock``, which ``set_flag`` and ``get_flags`` take too), and the ``get_flags`` wrapper
  (``patches/execution.py``) takes that mutex around ComfyUI's call, so every request registered before a
  ``get_flags`` belongs to the :class:`WorkerRun` it starts, and every later one to a later run;
* the run then goes ``unloading`` (until the worker's ``unload_all_models`` returns), ``resetting`` (until
  ``PromptExecutor.reset`` returns) and ``collecting`` (until a full, generation-2 collection ends on the worker's
  thread, seen through ``gc.callbacks``), then ``done``; its ``unload`` events are collected on the way;
* a request that gives up before the worker read its flags (``timeout``) withdraws them, unless another waiting
  request or another client (ComfyUI's own ``/free``) set the same flag: our flags are never left behind to fire
  an unrequested unload after the next prompt;
* while a request waits, :func:`nudge` wakes the worker with the queue's condition instead of setting the flags
  again.  # COMFY: the worker reads the flags after each prompt, collects garbage, then waits on the queue (up to
  1000 s); a flag set between its read and its wait wakes nobody.

Lock rule (docs/architecture.md, "Threads and locks"): the desk's lock is never taken by the ``gc.callbacks`` hook or
any weakref callback; the hook reads the run of its own thread from a dict and only the worker thread writes a run's
phase.

The receipt lists what was freed, what ComfyUI still has loaded, and the survivors: models whose torch module is
alive although ComfyUI no longer holds them, each with the holder chains of a time-bounded strict search.  ComfyUI
never warns about a model it unloaded, so once the worker has collected, a survivor whose search names a holder
that makes it a leak is recorded as one (``leaks.unwarned``: ``found_by`` ``after_free``), counted once like any leak.
With ``release`` (``/memx/free`` with ``"release": true``, ``free --release``), the survivors whose holder is known
(their leak report's, else a search's) are released in one job on the leak wing's release desk, which ComfyUI's
prompt worker runs between prompts (``leaks.release.desk``), and the receipt is written after it.
Everything is held by weakref or ``model_id``; a module is strong only inside one search.
"""

import contextlib
import functools
import gc
import sys
import threading
import time

from comfy_memx.core import callbacks, registry
from comfy_memx.core.comfyui import queue_busy
from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.leaks import api as leaks
from comfy_memx.surface import readmodel, retention
from comfy_memx.surface.readmodel import still_loaded

RECEIPT_WAIT_S = 0.5  # how long a receipt waits for another search to end; then its survivors say "busy"
FLAGS = ("unload_models", "free_memory")


class WorkerRun:
    """One turn of ComfyUI's prompt worker that read free flags, on its own thread; holds no model."""

    def __init__(self, thread_id, flags, requests, observe_unload, observe_reset):
        self.thread_id = thread_id
        self.free_memory = bool(flags.get("free_memory", False))
        self.unload_models = bool(flags.get("unload_models", self.free_memory))
        self.requests = requests
        self.unloads = []              # the worker's unload events of this run (plain dicts)
        self.started = time.time()
        self.finished = None
        if self.unload_models and observe_unload:
            self.phase = "unloading"
        elif self.free_memory and observe_reset:
            self.phase = "resetting"
        else:
            self.phase = "collecting"

    def unload_ended(self):
        """The worker's ``unload_all_models`` returned."""
        if self.phase == "unloading":
            self.phase = "resetting" if self.free_memory else "collecting"

    def reset_ended(self):
        """The worker's ``PromptExecutor.reset`` returned."""
        if self.phase in ("unloading", "resetting"):
            self.phase = "collecting"

    def finish(self):
        """The worker collected garbage: wake every request of this run (called on the worker's thread)."""
        self.phase = "done"
        self.finished = time.time()
        for request in self.requests:
            request.finished()


class FreeRequest(callbacks.Completion):
    """One free request, from its flags to the worker's garbage-collection pass; holds no model."""

    def __init__(self, queue, unload_models, free_memory, origin=None):
        super().__init__("free-request callback")
        self.queue = queue
        self.origin = origin or {"kind": "comfy_memx"}  # who asked: {"kind": "http", "client": ...} or comfy_memx's
        self.unload_models = unload_models
        self.free_memory = free_memory
        self.keys = tuple(name for name, wanted in zip(FLAGS, (unload_models, free_memory)) if wanted)
        self.began = time.time()
        self.run = None               # the WorkerRun that consumed this request's flags
        self.withdrawn = False
        self.before = {r.model_id: r for r in STATE.ledger.records()}  # records only: weakrefs to modules
        self.rss_before = retention.rss_bytes()

    @property
    def state(self):
        """``waiting`` (flags set, not read yet), ``withdrawn``, or the phase of the run that read them."""
        if self.run is not None:
            return self.run.phase
        return "withdrawn" if self.withdrawn else "waiting"

    def finished(self):
        """Mark done and run the callbacks (the run calls this on the worker's thread): done means the worker has
        unloaded, reset its caches and collected garbage for this request."""
        self.complete()


class FreeDesk:
    """The free requests and worker runs followed in this process (a part of the process state)."""

    def __init__(self):
        self.lock = threading.Lock()  # never taken by the gc hook or a weakref callback
        self.pending = []             # requests whose flags are set and not read by the worker yet
        self.runs = {}                # worker thread id -> WorkerRun in progress (read lock-free by the gc hook)
        self.external = set()         # flag names that someone else set while requests were pending
        self.events = None            # the EventLog we subscribed to while following requests
        self.local = threading.local()

    def busy(self):
        """True while a request waits or a run is in progress."""
        return bool(self.pending or self.runs)

    def close(self):
        """Remove the hooks (reset of the process state)."""
        self.pending.clear()
        self.runs.clear()
        _uninstall(self)


def _desk():
    return STATE.part(FreeDesk)


def submit(queue, unload_models=True, free_memory=True, follow=True, origin=None):
    """Register a free request and set ComfyUI's flags for it on ``queue`` (its ``PromptQueue``), atomically with
    respect to the worker's ``get_flags``; returns the :class:`FreeRequest`.  Call :func:`end` when done with it.

    With ``follow=False`` (the worker cannot be followed: the ``execution`` patch is off) the flags are only set,
    as ComfyUI's own ``/free`` does, and never withdrawn.
    """
    desk = _desk()
    request = FreeRequest(queue, unload_models, free_memory, origin)
    if not follow:
        for name in request.keys:
            queue.set_flag(name, True)
        return request
    with queue.mutex:
        flags = getattr(queue, "flags", {})
        with desk.lock:
            ours = {name for other in desk.pending for name in other.keys}
            already = {name for name in request.keys if flags.get(name) and name not in ours}
            desk.pending.append(request)
            desk.external.update(already)
            _install(desk)
        desk.local.setting = True
        try:
            for name in request.keys:
                queue.set_flag(name, True)
        finally:
            desk.local.setting = False
    return request


def end(request):
    """Stop following ``request``: withdraw its flags if the worker has not read them (see the module docstring)."""
    desk = _desk()
    queue = request.queue
    with queue.mutex:
        with desk.lock:
            if request in desk.pending:
                desk.pending.remove(request)
                request.withdrawn = True
                wanted = {name for other in desk.pending for name in other.keys} | desk.external
                flags = getattr(queue, "flags", {})
                for name in request.keys:
                    if name not in wanted:
                        flags.pop(name, None)
            if not desk.busy():
                desk.external.clear()
                _uninstall(desk)


def nudge(request):
    """Wake the prompt worker while ``request`` waits for it; returns True when it did."""
    if request.run is not None or request.withdrawn:
        return False
    queue = request.queue
    with queue.mutex:
        queue.not_empty.notify()
    return True


def waiting():
    """How many free requests wait for the worker to read their flags."""
    desk = STATE.existing_part(FreeDesk)
    return len(desk.pending) if desk is not None else 0


# -- the worker side: called by the wrappers in patches/execution.py and the unload scope of model_management ----

def flag_set(queue, name):
    """``PromptQueue.set_flag`` is about to set ``name``: remember it when someone else sets a flag we wait on."""
    desk = STATE.existing_part(FreeDesk)
    if desk is not None and desk.pending and not getattr(desk.local, "setting", False):
        with desk.lock:
            desk.external.add(name)


def flags_served(queue, flags, reset):
    """ComfyUI's ``get_flags`` returned ``flags`` (the get_flags wrapper still holds the queue's mutex): when it
    reset them, give the waiting requests to the run it starts."""
    desk = STATE.existing_part(FreeDesk)
    if desk is None or not desk.pending or not reset:
        return
    _start_run(desk, queue, flags)


def _start_run(desk, queue, flags):
    with desk.lock:
        taken = [request for request in desk.pending if request.queue is queue]
        desk.pending = [request for request in desk.pending if request.queue is not queue]
        desk.external.clear()
    if not taken:
        return
    run = WorkerRun(threading.get_ident(), flags, taken,
                    observe_unload=registry.is_patched("model_management", "unload_all_models"),
                    observe_reset=registry.is_patched("execution", "PromptExecutor.reset"))
    for request in taken:
        request.run = run
    desk.runs[run.thread_id] = run


def reset_ended():
    """The worker's ``PromptExecutor.reset`` returned (the ``free_memory`` part of a run)."""
    run = _my_run()
    if run is not None:
        run.reset_ended()


def _my_run():
    desk = STATE.existing_part(FreeDesk)
    return desk.runs.get(threading.get_ident()) if desk is not None else None


def free_request_unload_ended():
    """The worker's outermost ``free_request`` unload scope ended: its run moves on to the cache reset."""
    run = _my_run()
    if run is not None:
        run.unload_ended()


def _on_gc(phase, info):
    if phase != "stop" or info.get("generation") != 2:
        return
    desk = STATE.existing_part(FreeDesk)
    if desk is None:
        return
    me = threading.get_ident()
    run = desk.runs.get(me)
    if run is None or run.phase != "collecting":
        return
    desk.runs.pop(me, None)
    run.finish()


def _on_event(event):
    if event.get("event") != "unload" or event.get("reason") != "free_request":
        return
    run = _my_run()
    if run is not None and run.phase == "unloading":
        run.unloads.append({"model": event.get("model"), "model_id": event.get("model_id"),
                            "bytes": event.get("bytes", 0), "device": event.get("device")})


def requested_by(reason):
    """The requester of the unloads of a run that serves /memx/free requests (``ledger.causes`` asks this first)."""
    if reason != "free_request":
        return None
    run = _my_run()
    if run is None:
        return None
    http = [request.origin for request in run.requests if request.origin.get("kind") == "http"]
    if http:
        return {"kind": "http", "route": http[0].get("route"),  # no addresses: /memx/models shows this to anyone
                "clients": len({origin.get("client") for origin in http})}
    return dict(run.requests[0].origin)


def _install(desk):
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    if desk.events is not STATE.events:
        if desk.events is not None:
            desk.events.unsubscribe(_on_event)
        desk.events = STATE.events
        desk.events.subscribe(_on_event)


def _uninstall(desk):
    if _on_gc in gc.callbacks:
        gc.callbacks.remove(_on_gc)
    if desk.events is not None:
        desk.events.unsubscribe(_on_event)
        desk.events = None


def prompt_running(prompt_queue):
    """True when ComfyUI's prompt worker is executing a prompt (the flags wait for it)."""
    return bool(getattr(prompt_queue, "currently_running", None))


def unload_now(queue, origin, timeout):
    """Ask ComfyUI's worker to unload its models (``unload_models`` only: its caches stay), wait for its run, and
    return the receipt (``origin`` becomes the unloads' ``requested_by``): the idle unload's and a hand-off's.

    A prompt queued before the worker read the flags wins: the request is withdrawn (nothing a prompt is about to
    use is unloaded for us), and the receipt says ``withdrawn``.
    """
    ticket = submit(queue, unload_models=True, free_memory=False, origin=origin)
    try:
        deadline = time.monotonic() + timeout
        while not ticket.wait(0.5) and time.monotonic() < deadline:
            if ticket.run is None and queue_busy(queue):
                break
            nudge(ticket)
    finally:
        end(ticket)
    return receipt(ticket, search_holders=False, trim=ticket.done)


# -- the receipt -----------------------------------------------------------------------------------------------------

class Survey:
    """What a receipt knows before any release: what ComfyUI still has loaded, what was freed, and the survivors as
    ``(row, ledger record)`` pairs (records hold their model by weakref only)."""

    def __init__(self, request, loaded, freed, survivors):
        self.request, self.loaded, self.freed, self.survivors = request, loaded, freed, survivors

    def releasable(self):
        """The survivors whose holder is known (their row's ``holders``): what a release may act on."""
        return [(row, record) for row, record in self.survivors if row.get("holders")]


def receipt(request, model_management=None, search_holders=True, trim=False, release=False, release_wait_s=60.0):
    """The receipt of ``request``: freed, still_loaded, survivors (with holder chains when ``search_holders`` is
    True; a string instead says why they were not searched).

    Survivors are taken among the models alive when the request began (the ledger knows every model ComfyUI built,
    loaded or not: a loader's output no sampler used is among them), plus every leaked model.  When the run that
    served the request reset ComfyUI's caches (``free_memory``, ours or another client's in the same run), any of
    them still alive is kept by something else; after an unload only, a model counts when ComfyUI warned about it
    or no ModelPatcher refers to it any more.  Before the worker is done only the leaked ones are known, and no
    search runs.  ``memory`` tells allocator retention from held bytes (``surface.retention``); ``trim`` runs
    ``malloc_trim(0)`` first (the route does once the worker is done).  ``release`` releases each survivor whose
    holder is known, through the release desk (on ComfyUI's prompt worker between prompts, waiting at most
    ``release_wait_s`` for it), before the memory is read: ``releases`` (the bytes of every model that died with
    their cut entries: ``release_bytes``); the survivors listed are those the releases did not free.
    Blocking: the route runs the same steps with its waits on the event loop.
    """
    survey = take_survey(request, model_management, search_holders, release=release)
    releases, note, state = [], None, RELEASE_DONE if release else None
    if release:
        job = queue_releases(survey)
        if job is not None and not job.wait(release_wait_s) and leaks.withdraw_release(job):
            note, state = RELEASE_WITHDRAWN, WITHDRAWN
        elif job is not None:
            job.wait(None)
            releases = job.result or []
    return write_receipt(survey, releases, trim, release_note=note, release_state=state)


RELEASE_DONE, WITHDRAWN, NOT_RUN = "done", "withdrawn", "not_run"   # a receipt's release_state
RELEASE_WITHDRAWN = ("not released: a prompt was running and did not end before the timeout; nothing was cut "
                     "(releases run on ComfyUI's prompt worker between prompts: ask again when it is idle)")


def take_survey(request, model_management=None, search_holders=True, release=False):
    """Freed, still loaded and the survivors of ``request``, searched (``search_holders``: see :func:`receipt`) and,
    once the worker is done, recorded as leaks where their holder makes them one.  With ``release`` the leaks
    recorded here queue no ``auto`` release (the caller releases them itself).  Blocking: never on the event loop."""
    if model_management is None:
        model_management = sys.modules.get("comfy.model_management")
    loaded = still_loaded(model_management)
    loaded_ids = {row["model_id"] for row in loaded}
    freed = _freed(request)
    survivors = _survivors(request, loaded_ids, model_management)
    if search_holders is True:
        _search_survivors(request, survivors, known_first=release)
    elif search_holders:  # a reason why they are not searched
        for survivor, _ in survivors:
            survivor["search"] = {"note": str(search_holders)}
    if request.done:
        with leaks.releasing_here() if release else contextlib.nullcontext():
            _record_leaks(survivors, model_management)
    for survivor, record in survivors:
        survivor["leak"] = leaks.public_state(record.leak)
        if release and survivor["holders"] is None and search_holders is True:
            _known_holders(survivor, record)   # the never-warned check just now named them: releasable too
    return Survey(request, loaded, freed, survivors)


def queue_releases(survey):
    """Queue one release job (``leaks.release``'s desk: ComfyUI's prompt worker runs it between prompts) that releases
    every survivor of ``survey`` whose holder is known, in order; returns the job, or None when there is none."""
    pairs = survey.releasable()
    if not pairs:
        return None
    return leaks.submit_release(functools.partial(release_survivors, pairs), "free")


def release_survivors(pairs):
    """Release each ``(survivor row, record)`` (``leaks.release`` with the row's holders): the receipts, in order.
    A survivor that died with an entry cut for an earlier one (the CLIP and VAE of a pack's ``(model, clip, vae)``
    entry) gets no receipt of its own: it is in that receipt's ``models``.  Blocking; run by the release desk,
    between prompts."""
    receipts, taken = [], set()
    for row, record in pairs:
        if record.model_id in taken:
            continue
        receipt = leaks.release(record, "free", referrers=row["holders"])
        receipts.append(receipt)
        taken.update(model["model_id"] for model in receipt.get("models") or () if model.get("died"))
    return receipts


def write_receipt(survey, releases, trim, release_note=None, release_state=None):
    """The receipt of a survey and its releases (see :func:`receipt`): the survivors listed are those its releases
    did not free (a model that died with a cut entry is not listed), and the memory is read after them.
    ``release_state`` (only when a release was asked): ``done``, ``withdrawn`` (a prompt ran past the timeout:
    nothing was cut) or ``not_run`` (the worker had not finished freeing)."""
    request = survey.request
    gone = {model["model_id"] for release in releases
            for model in (release.get("models") or [release]) if model["died"]}   # every model a cut entry took
    rows = [row for row, _record in survey.survivors if row["model_id"] not in gone]
    memory = _memory(request, trim)
    run = request.run
    finished = run.finished if run is not None and run.finished else time.time()
    answer = {"status": "done" if request.done else "pending", "worker": request.state,
              "waited_s": round(finished - request.began, 3),
              "request": {"unload_models": request.unload_models, "free_memory": request.free_memory},
              "run": {"unload_models": run.unload_models, "free_memory": run.free_memory,
                      "requests": len(run.requests)} if run is not None else None,
              "freed": survey.freed, "freed_bytes": sum(row["unloaded_bytes"] for row in survey.freed),
              "released_bytes": sum(row["bytes"] for row in survey.freed if row["released"]),
              "still_loaded": survey.loaded, "survivors": rows,
              "survivor_bytes": sum(row["bytes"] for row in rows), "releases": releases,
              "release_bytes": sum(row.get("released_bytes", row["bytes"] if row["died"] else 0) for row in releases),
              "memory": memory}
    if release_note is not None:
        answer["release_note"] = release_note
    if release_state is not None:
        answer["release_state"] = release_state
    return answer


def _search_survivors(request, survivors, known_first=False):
    """Name every survivor's holders through the search gate, one search at a time in the process, within
    ``COMFY_MEMX_SEARCH_CPU``; once the gate refuses, the rest say why.  With ``known_first`` (a free that releases
    them), a survivor whose leak report already named its holders (its record's referrers and the steps to walk them
    again) needs no search: the release walks them again anyway.

    With more than one survivor to search, one gated pass of forward probes names the shortest holder of each it
    reaches (``leaks.gated_first_paths``: milliseconds a model); only the others get a full search (it lists every
    holder, and costs up to ``COMFY_MEMX_LEAK_BUDGET`` each), so a free after which a pack keeps twenty models names
    all twenty instead of the few that one minute of search budget pays for."""
    refused = None
    pending = [(survivor, record) for survivor, record in survivors
               if not (known_first and _known_holders(survivor, record))]
    if len(pending) > 1:
        try:
            answers = leaks.gated_first_paths([record for _, record in pending], ignore=[request, survivors],
                                              wait_s=RECEIPT_WAIT_S)
        except leaks.Busy:
            answers = {}
        except Exception as exc:  # the full searches below still run
            answers = {}
            internal_error("holder probe for /memx/free", exc, answered=True)
        for survivor, record in pending:
            if record.model_id in answers:
                survivor.update(answers[record.model_id])
        pending = [(survivor, record) for survivor, record in pending if record.model_id not in answers]
    for survivor, record in pending:
        if refused is not None:
            survivor["search"] = refused
            continue
        try:
            survivor.update(leaks.gated_search(record, ignore=[request, survivors], wait_s=RECEIPT_WAIT_S))
        except leaks.Busy as busy:
            refused = {"note": f"not searched: {busy.why.replace('_', ' ')}", "retry_after": busy.retry_after}
            survivor["search"] = refused
        except Exception as exc:  # a failed search leaves the survivor listed, with the error
            survivor["search"] = {"error": f"{type(exc).__name__}: {exc}"}
            internal_error("holder search for /memx/free", exc, answered=True)


def _known_holders(survivor, record):
    """Fill a survivor's ``holders`` from its leak report when that named them with the steps to walk them again
    (no new search); returns True when it did."""
    leak = record.leak or {}
    if leak.get("stage") != "rooted" or not leak.get("referrers") or not record.holder_steps:
        return False
    survivor["holders"] = list(leak["referrers"])
    survivor["holder"] = leak.get("holder")
    survivor["search"] = dict(leak.get("search") or {}, note="the holders its leak report named (POST "
                              "/memx/models/{model_id}/search searches again)")
    return True


def _record_leaks(survivors, model_management):
    """After the worker's collection: record as leaks the survivors whose search named a holder that makes one
    (ComfyUI never warns about a model it unloaded), then look at the other models unloaded since the last check
    (``leaks.unwarned``: an idle unload's receipt searches nothing itself)."""
    try:
        for survivor, record in survivors:
            if survivor.get("holders"):
                leaks.record_searched(record, survivor, model_management)
        leaks.check_unloaded(model_management)
    except Exception as exc:   # the receipt is answered all the same
        internal_error("leaks found after a free", exc)


def _memory(request, trim):
    memory = {"rss_before": request.rss_before, "rss_after": retention.rss_bytes()}
    if trim:
        memory["trim"] = retention.trim()
    else:
        memory["trim"] = {"skipped": "the worker had not finished freeing"}
    memory["rss_after_trim"] = memory["trim"].pop("rss_after_trim", None)
    memory["held_bytes"] = retention.held_bytes(readmodel.model_rows())
    return memory


def record_free(request, receipt_data):
    """Write the ``free`` event of a finished request: what was freed, survivors, and the memory figures (an event
    caused by a request: rate-limited by ``COMFY_MEMX_EVENT_RATE``).  Blocking file I/O: never on the event loop."""
    run = request.run
    STATE.events.emit_request("free", status=receipt_data["status"], origin=request.origin,
                      request=receipt_data["request"], run=receipt_data["run"],
                      freed=len(receipt_data["freed"]), freed_bytes=receipt_data["freed_bytes"],
                      released_bytes=receipt_data["released_bytes"], survivors=len(receipt_data["survivors"]),
                      releases=[{key: row[key] for key in ("model_id", "outcome", "package", "cut")}
                                for row in receipt_data.get("releases", ())],
                      release_bytes=receipt_data.get("release_bytes", 0),
                      survivor_bytes=receipt_data["survivor_bytes"], memory=receipt_data["memory"],
                      survivor_packages=survivor_packages(receipt_data["survivors"]),
                      seconds=round((run.finished or time.time()) - request.began, 3) if run is not None else None)


def survivor_packages(rows):
    """``[{"package", "loader_package"}]``, one per survivor row of a receipt: the package that holds it (its leak
    record's, else its search's first holder chain's; ``unknown`` when neither named one) and the one that loaded
    it, so that fleets see who keeps what a free could not release."""
    found = []
    for row in rows:
        holder = (row.get("leak") or {}).get("holder_package")
        if not holder:
            holder = next((chain.get("holder_package") for chain in row.get("holders") or ()
                           if isinstance(chain, dict) and chain.get("holder_package")), None)
        found.append({"package": holder or "unknown", "loader_package": (row.get("owner") or {}).get("package") or "?"})
    return found


def _freed(request):
    run = request.run
    by_id = {}
    for unload in list(run.unloads) if run is not None else ():
        row = by_id.setdefault(unload["model_id"], {"model": unload["model"], "model_id": unload["model_id"],
                                                    "unloaded_bytes": 0, "device": unload["device"]})
        row["unloaded_bytes"] += int(unload["bytes"] or 0)
    if request.done:
        for model_id, record in request.before.items():
            if not record.alive and model_id not in by_id:
                by_id[model_id] = {"model": record.model, "model_id": model_id, "unloaded_bytes": 0,
                                   "device": record.device}
    rows = []
    for model_id, row in by_id.items():
        record = request.before.get(model_id)
        row["bytes"] = record.model_bytes if record is not None else 0
        row["released"] = record is not None and not record.alive
        row["owner"] = record.owner._asdict() if record is not None else None
        rows.append(row)
    return rows


def _survivors(request, loaded_ids, model_management=None):
    candidates = dict(request.before) if request.done else {}
    for record in STATE.ledger.records():
        if record.leak is not None:
            candidates.setdefault(record.model_id, record)
    caches_reset = request.run is not None and request.run.free_memory
    found = []
    for model_id, record in candidates.items():
        if model_id in loaded_ids or not record.alive or readmodel.in_use(record, model_management):
            continue   # a model a running prompt loaded again is in use, no survivor
        why = _why_alive(record)
        if why == "kept" and not (request.done and caches_reset):
            continue
        module = record.module_ref()
        resident = int(getattr(module, "model_loaded_weight_memory", 0) or 0) if module is not None else 0
        del module
        found.append(({"model": record.model, "model_id": model_id, "owner": record.owner._asdict(),
                       "created_by": readmodel.created_by(record), "bytes": record.model_bytes,
                       "resident_bytes": resident, "reason": why, "leak": None, "holders": None, "search": None},
                      record))
    return found


def _why_alive(record):
    if record.leak is not None:
        return "leaked"
    if record.live_patchers() == 0:
        return "orphaned"
    return "kept"
