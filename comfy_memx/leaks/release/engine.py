"""Release one leaked model: cut the pack's cache entry that holds it, let ComfyUI collect, and write the receipt.

:func:`release` is what the route, ``/memx/free`` with ``release`` and the ``auto`` policy call.  In order it:

1. takes the model's holders from its last search (``record.leak["referrers"]`` and ``record.holder_steps``) and
   picks the one to cut (:func:`~comfy_memx.leaks.release.plan.choose`): a refusal says why and what the pack's fix
   is, and nothing is touched;
2. refuses a model that ComfyUI uses: its loaded list holds it, or the prompt that loaded it is still running;
3. under the process's search desk (no holder search runs meanwhile, so none of its lists keeps the model), walks
   the chain again and checks every object on it (:mod:`~comfy_memx.leaks.release.walk`): a changed container is
   answered ``changed`` with nothing cut;
4. picks the entry to cut (:mod:`~comfy_memx.leaks.release.entries`: the first from the pack's root that holds only
   the models of this model's node run, else the deepest) and refuses when ComfyUI still reaches the model other
   than through that entry (:func:`in_use`: its output caches, ``PromptServer.instance``, the loaded list; a
   ModelPatcher that only the pack keeps is part of the cut, not a user);
5. cuts, drops every reference of its own, runs a full collection only if a model the entry held is still alive,
   empties torch's device cache (ComfyUI's ``soft_empty_cache``), hands the C allocator's free pages back to the
   kernel (``malloc_trim``, unless ``COMFY_MEMX_TRIM=0``), and reads RSS, VRAM and pinned bytes before and after;
6. reads the weakrefs: the asked-for model dead is ``released``, alive is ``survivor`` (searched again through the
   search gate, ``leaks.gate``, within ``COMFY_MEMX_SEARCH_CPU`` whoever asked, so that the receipt names the next
   holder); ``models`` lists every ledger model the entry held or that died with the cut (``bytes``, ``died``) and
   ``released_bytes`` the bytes of those that died.

When: every caller runs it through the release desk (``leaks.release.desk``), on ComfyUI's prompt worker between
prompts; :func:`release_automatically` only queues jobs there.

Each receipt is a ``release`` event, kept in the :class:`ReleaseBook` (the last :data:`KEPT`), and counted in the
metrics.  Nothing here holds a model beyond one call; the receipt holds names and numbers only.
"""

import collections
import functools
import gc
import logging
import sys
import time

from comfy_memx.core.comfyui import running_prompt_ids
from comfy_memx.core.process import memory_snapshot, trim
from comfy_memx.core.state import STATE
from comfy_memx.leaks import patterns, watch
from comfy_memx.leaks.release import desk, entries, reach, walk
from comfy_memx.leaks.release import plan as plans

log = logging.getLogger("comfy_memx")

KEPT = 64
NEXT_HOLDER_WAIT_S = 0.5   # how long a release (on the prompt worker) waits for the search gate; then no search
RELEASED, SURVIVOR, REFUSED, CHANGED, IN_USE, FAILED, BUSY, GONE = (
    "released", "survivor", "refused", "changed", "in_use", "failed", "busy", "gone")
RETRIED = (IN_USE, CHANGED, BUSY)   # outcomes after which ``auto`` tries the model again at its next warning


class ReleaseBook:
    """The releases of this process (a part of the process state): the last :data:`KEPT` receipts."""

    def __init__(self):
        self.receipts = collections.deque(maxlen=KEPT)


def book():
    """This process's :class:`ReleaseBook`."""
    return STATE.part(ReleaseBook)


def release(record, trigger, path=None, referrers=None, model_management=None):
    """Cut the holder of leaked model ``record`` (the one at ``path``, default the releasable one its last search
    found; ``referrers``: the holders of a search whose result the record does not keep, a model ComfyUI never warned
    about); returns the receipt (``outcome`` says what happened; see the module docstring)."""
    mm = model_management if model_management is not None else sys.modules.get("comfy.model_management")
    receipt = _blank(record, trigger)
    if referrers is None:
        referrers = (record.leak or {}).get("referrers") or ()
    decision = plans.choose(list(referrers), dict(record.holder_steps), path)
    if decision is None:
        return _finish(record, receipt, REFUSED, reason=("no holder at that path (see the model's leak.referrers)"
                                                         if path is not None else "no holder known: search it first"))
    referrer = decision.referrer
    receipt.update(package=referrer.get("holder_package") or referrer.get("package"),
                   pattern=referrer.get("pattern"), path=referrer.get("path"))
    if isinstance(decision, plans.Refusal):
        return _finish(record, receipt, REFUSED, reason=decision.why, fix=decision.fix)
    searches = watch.desk()
    if not searches.running.acquire(timeout=watch.WAIT_FOR_SEARCH_S):
        return _finish(record, receipt, BUSY, reason="a holder search of comfy_memx is running; try again shortly")
    try:
        outcome = _cut(record, decision, mm, receipt)
    finally:
        searches.running.release()
    if outcome == SURVIVOR:   # through the search gate: within COMFY_MEMX_SEARCH_CPU, whoever asked
        found = watch.search_or_say_why(record, NEXT_HOLDER_WAIT_S)
        refused = found["search"].get("result") == "deferred"
        receipt["next_holder"] = found.get("holder") or ({"path": None, "note": found["search"]["note"]} if refused
                                                         else None)
    return _finish(record, receipt, outcome)


def _cut(record, decision, mm, receipt):
    """Steps 2 to 6 of the module docstring under the search desk; returns the outcome."""
    module = record.module_ref()
    if module is None:
        receipt["reason"] = "the model was freed before the release"
        return GONE
    try:
        busy = in_comfyui_use(record, module, mm)
        if busy is not None:
            receipt["reason"] = busy
            return IN_USE
        try:
            chain = walk.follow(decision.steps, module)
        except walk.Changed as exc:
            receipt["reason"] = f"the container changed since the search ({exc}); nothing was cut"
            return CHANGED
        try:
            outcome, alive, held_ids = _cut_entry(record, module, chain, mm, receipt)
        finally:
            chain.drop()
    finally:
        del module
    if outcome == REFUSED:
        receipt["fix"] = patterns.SUGGESTIONS.get(receipt["pattern"] or "unknown")
    if outcome is not None:
        return outcome
    if any(other.module_ref() is not None for other in alive if other.model_id in held_ids):
        gc.collect()
    _empty_device_cache(mm)
    returned = trim()   # the allocator keeps freed pages for reuse unless told: what it gave back is shown
    receipt["memory"]["trim_returned_bytes"] = returned.get("returned_bytes")
    receipt["memory"]["after"] = memory_snapshot()
    receipt["died"] = record.module_ref() is None
    receipt["models"] = [_model_row(other) for other in alive
                         if other.model_id in held_ids or other.module_ref() is None]
    receipt["released_bytes"] = sum(row["bytes"] for row in receipt["models"] if row["died"])
    for other in alive:   # a leak that died with this cut is released, not tried again by an auto job of its own
        if other is not record and other.leak is not None and other.module_ref() is None:
            other.leak["release"] = RELEASED
    return RELEASED if receipt["died"] else SURVIVOR


def _cut_entry(record, module, chain, mm, receipt):
    """Pick the entry (:mod:`~comfy_memx.leaks.release.entries`), refuse a model ComfyUI still reaches, and cut.

    Returns ``(outcome, alive, held_ids)``: the outcome is None when the entry was cut; ``alive`` the ledger
    records of the models alive before the cut (the asked-for one first: every one that dies with the cut is
    reported, found by the walk or not) and ``held_ids`` the model_ids of those the entry held."""
    group_ids = {id(other.module_ref()) for other in entries.node_run(record)} - {id(None)}
    choice = entries.choose(chain, entries.candidates(chain), group_ids)
    if choice is None:
        receipt["reason"] = ("the chain reaches the model through an object that is not a container before any entry "
                             "comfy_memx can cut; nothing was cut")
        return REFUSED, (), set()
    busy = in_use(record, module, mm, leave_out=[id(obj) for obj in chain.objects[:choice.index]])
    if busy is not None:
        receipt["reason"] = busy
        return IN_USE, (), set()
    alive = [record, *(other for other in STATE.ledger.records() if other is not record)]
    held_ids = {other.model_id for other in alive if id(other.module_ref()) in choice.contents.models}
    receipt["memory"] = {"before": memory_snapshot()}
    receipt["cut"] = plans.cut_text(chain.steps, choice.index)
    try:
        receipt.update(walk.remove(chain, choice.index))
    except walk.CutFailed as exc:
        receipt.update(reason=f"{exc}; nothing was cut", cut=None, memory=None)
        return FAILED, (), set()
    return None, alive, held_ids


def _model_row(record):
    return {"model": record.model, "model_id": record.model_id, "bytes": int(record.model_bytes or 0),
            "died": record.module_ref() is None}


def in_use(record, module, mm, leave_out=()):
    """Why ``module`` must not be cut now (a sentence), or None.  In use is what ComfyUI still reaches: its loaded list
    holds it with a live patcher, the prompt that loaded it runs (:func:`in_comfyui_use`), or ComfyUI's prompt
    executor (its output caches), ``PromptServer.instance`` or the loaded list reach it through containers and
    ComfyUI's own objects, leaving out the objects in ``leave_out`` (the pack's chain down to the entry being cut).
    A ModelPatcher that only the pack keeps is part of the cut, not a user of the model.  A walk that cannot tell
    within its bound answers in use (nothing is cut)."""
    busy = in_comfyui_use(record, module, mm)
    if busy is not None:
        return busy
    walked = reach.comfyui_reach(reach.comfyui_roots(mm), {id(module)}, leave_out)
    if walked.found is not None:
        return f"{walked.found} still reaches it (a node's output or a loaded model uses it)"
    if not walked.complete:
        return (f"comfy_memx could not tell within its bound ({walked.stopped_by}) whether ComfyUI still reaches it; "
                "nothing was cut")
    return None


def in_comfyui_use(record, module, mm):
    """Why ComfyUI itself uses ``module`` now (a sentence), or None: its loaded list holds it with a live patcher,
    or the prompt that loaded it is running (a leak found after an unload waits for both to end)."""
    for entry in list(getattr(mm, "current_loaded_models", ())):
        ref = getattr(entry, "real_model", None)
        if ref is not None and ref() is module and getattr(entry, "model", None) is not None:
            return "ComfyUI's loaded list uses it"
    prompt_id = record.owner.prompt_id
    if prompt_id is not None and prompt_id in running_prompt_ids():
        return f"prompt {prompt_id}, which loaded it, is still running"
    return None


def release_automatically(records):
    """The ``auto`` policy, after ComfyUI's leak warning and when a leak it never warns about is recorded
    (``leaks.unwarned``): queue the release of each rooted leak whose holder package is in
    ``COMFY_MEMX_RELEASE_PACKAGES`` on the release desk (ComfyUI's prompt worker runs it between prompts; nobody
    waits), once (a model that was in use, or whose container changed, is tried again at its next warning; a changed
    one is searched again first, through the search gate).  Nothing is queued inside a free that releases its
    survivors itself (``desk.releasing_here``)."""
    if desk.auto_held():
        return
    for record in records:
        if _auto_wanted(record):
            desk.submit(functools.partial(_release_automatically, record), "auto", key=record.model_id)


def _auto_wanted(record):
    leak = record.leak
    if leak is None or leak.get("stage") != "rooted" or leak.get("release") not in (None, *RETRIED):
        return False
    wanted = STATE.config.release_packages
    package = (leak.get("holder") or {}).get("package")
    return package is not None and (wanted == ("*",) or package in wanted)


def _release_automatically(record):
    """One ``auto`` job, between prompts: the leak may have ended or been released since it was queued."""
    if not _auto_wanted(record):
        return None
    if record.leak.get("release") == CHANGED:
        found = watch.search_or_say_why(record, NEXT_HOLDER_WAIT_S)
        if found["search"].get("result") == "deferred":
            return None   # the gate refused: tried again at the next warning
    return release(record, "auto")


def _blank(record, trigger):
    return {"model": record.model, "model_id": record.model_id, "trigger": trigger, "outcome": None, "package": None,
            "pattern": None, "path": None, "cut": None, "method": None, "other_entries_dropped": 0,
            "bytes": int(record.model_bytes or 0), "memory": None, "died": False, "next_holder": None,
            "reason": None, "fix": None, "time": round(time.time(), 6), "models": [], "released_bytes": 0}


def _finish(record, receipt, outcome, reason=None, fix=None):
    receipt["outcome"] = outcome
    if record.leak is not None:
        record.leak["release"] = outcome   # what the read-model shows, and what ``auto`` tries again
    if reason is not None:
        receipt["reason"] = reason
    if fix is not None:
        receipt["fix"] = fix
    book().receipts.append(receipt)
    emit = STATE.events.emit if receipt["trigger"] == "auto" else STATE.events.emit_request   # requests: rate-limited
    emit("release", **receipt)
    _log(receipt)
    return receipt


def _log(receipt):
    name = f"{receipt['model']} ({receipt['model_id']})"
    if receipt["outcome"] in (RELEASED, SURVIVOR):
        log.warning("comfy_memx: released leaked model %s: cut %s (package %s, %s)%s", name, receipt["cut"],
                    receipt["package"], receipt["pattern"],
                    "" if receipt["died"] else f"; still held by {(receipt['next_holder'] or {}).get('path', '?')}")
    else:
        log.info("comfy_memx: did not release %s (%s): %s", name, receipt["outcome"], receipt["reason"])


def _empty_device_cache(mm):
    soft_empty_cache = getattr(mm, "soft_empty_cache", None)
    if soft_empty_cache is None:
        return
    try:
        soft_empty_cache()
    except Exception as exc:   # ComfyUI's own function: what it raises is not ours to report as a bug
        log.warning("comfy_memx: soft_empty_cache after a release raised %s: %s", type(exc).__name__, exc)
