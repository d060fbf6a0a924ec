"""Leaks ComfyUI never warns about: models that left ComfyUI's loaded list and stay alive.

ComfyUI's ``cleanup_models_gc`` warns (``leaks.watch``) only about entries still in ``current_loaded_models`` whose
ModelPatcher is gone.  A model that ``free_memory``, ``unload_all_models`` (a ``/memx/free``, an idle unload, an
unload node, memory pressure) fully unloaded has left that list, so ComfyUI never looks at it again: a pack that
keeps its torch module, or hoards its ModelPatcher, leaks it silently.  This module finds those leaks and records
them exactly as a warned one is recorded (``record.leak``, a ``leak`` event, the log line, ``rooted_leaks``), with
``found_by`` saying how it was found (``after_free``, ``after_unload``; a warned leak says ``comfyui_warning``).

Work proportional to news, nothing kept alive:

* the suspect set (:class:`UnloadedModels`) holds weak references to the models of the last :data:`MAX_WATCHED` full
  unloads, with the number of full collections the process had run at the unload.  An entry leaves when its model
  dies or is back in ComfyUI's loaded list (looked at lazily, at the next check), when it is recorded as a leak or
  was searched, or when newer unloads push it out;
* it is looked at only where a collection already ran: after ComfyUI's ``cleanup_models_gc`` (the leak watch's
  ``collect_ended``) and after a free's own collection (its receipt), and a suspect counts only once a full
  (generation 2) collection ran since its unload, so a model that waits for the collector is never searched;
* a suspect that ComfyUI itself uses (:func:`comfy_memx.leaks.release.engine.in_comfyui_use`: its loaded list, or
  the running prompt that loaded it) waits for a later check; the others get the forward probe once (at most
  :data:`MAX_PROBED` per check, under the process's search desk and within the leak watch's probe budget; strict
  mode adds the backward search within the prompt's ``COMFY_MEMX_LEAK_BUDGET`` for a model no ModelPatcher holds);
* a free's receipt already searched its survivors through the search gate: :func:`record_searched` records those
  without a second search;
* a model recorded so that ComfyUI loads again (a hoarded ModelPatcher given back to a node) is in use: its leak is
  over (:func:`loaded_again`), and its next unload watches it again.

Which survivors are leaks (:func:`leak_holder`): a model no live ModelPatcher refers to, held from a root other than
ComfyUI's own output cache; and a model a live ModelPatcher refers to (the hoarded-patcher case) only when a
custom-node package's own module or class holds it: ComfyUI's output cache (or a node output it keeps) keeping a
node's MODEL is no leak, nor a running node's frame (a model a load in progress is loading is not even probed).
"""

import collections
import functools
import gc
import logging
import sys
import time
import weakref

from comfy_memx.core.state import STATE
from comfy_memx.leaks import gate, watch
from comfy_memx.leaks.release.engine import in_comfyui_use, release_automatically
from comfy_memx.ledger import api as ledger

log = logging.getLogger("comfy_memx")

MAX_WATCHED = 64   # full unloads remembered (by weakref) until a collection shows whether their model survived
MAX_PROBED = 4     # suspects probed per check: the rest wait for the next collection point
GATE_WAIT_S = 0.5  # outside a prompt, how long a probe waits for the search gate; then the suspect waits
AFTER_FREE, AFTER_UNLOAD = "after_free", "after_unload"
THREAD_FRAME = "thread_frame"   # a holder chain's root_kind (leaks.holders.ROOT_THREAD_FRAME)


class Unloaded:
    """One suspect: a weak reference to the model and the full collections counted at its unload."""
    __slots__ = ("module_ref", "collections")

    def __init__(self, module_ref, collections_at_unload):
        self.module_ref, self.collections = module_ref, collections_at_unload


class UnloadedModels:
    """The suspect set of this process (a part of the process state): ``id(module) -> Unloaded``, oldest first,
    at most :data:`MAX_WATCHED`.  Holds weak references only."""

    def __init__(self):
        self.watched = collections.OrderedDict()

    def close(self):
        """Forget every suspect (reset of the process state)."""
        self.watched.clear()


def book():
    """This process's :class:`UnloadedModels`."""
    return STATE.part(UnloadedModels)


def full_collections():
    """How many generation-2 (full) collections this process has run."""
    return gc.get_stats()[2]["collections"]


def note_unloaded(module_ref):
    """ComfyUI fully unloaded the model behind ``module_ref`` (its entry's ``real_model``, read before the unload):
    it left the loaded list, so ComfyUI will never warn about it; watch it until the next collection point."""
    module = module_ref() if module_ref is not None else None
    if module is None:
        return
    key = id(module)
    watched = book().watched
    watched.pop(key, None)
    watched[key] = Unloaded(weakref.ref(module), full_collections())
    del module
    while len(watched) > MAX_WATCHED:
        watched.popitem(last=False)


def loaded_again(entry):
    """ComfyUI loaded ``entry``'s model (``model_load``): in use again, so a leak recorded after its unload (a
    hoarded ModelPatcher a node was given back) is over; the next unload watches it again.  One dict lookup."""
    patcher = entry.model
    record = STATE.ledger.find(patcher.model) if patcher is not None else None
    del patcher
    if record is not None and record.leak is not None and record.leak.get("found_by") in (AFTER_FREE, AFTER_UNLOAD):
        record.leak = None


def check(model_management, found_by=None):
    """Look at the suspects after a collection point: drop the dead, the reloaded and the known leaks; probe the
    ones that survived a full collection since their unload and that ComfyUI does not use; record those held.
    ``found_by`` names the check (default: from the model's last unload, ``after_free`` for a free request's)."""
    watched = STATE.existing_part(UnloadedModels)
    if watched is None or not watched.watched or STATE.config.leak_mode == "off":
        return
    watched = watched.watched
    collected = full_collections()
    listed = _listed(model_management)
    loading = ledger.modules_loading()   # a node of a running prompt is about to use these: they wait
    probed = 0
    for key, suspect in list(watched.items()):
        module = suspect.module_ref()
        if module is None or id(module) in listed:
            watched.pop(key, None)
            continue
        record = STATE.ledger.find(module)
        if record is None or record.leak is not None:
            watched.pop(key, None)
        elif (collected > suspect.collections and probed < MAX_PROBED and id(module) not in loading
              and in_comfyui_use(record, module, model_management) is None):
            probed += 1
            watched.pop(key, None)   # searched once per unload: a later unload watches it again
            if not _probe(record, model_management, found_by):
                watched[key] = suspect   # the search gate refused: it and the rest wait for a later point
                break
        del module


def _listed(model_management):
    listed = set()
    for entry in list(getattr(model_management, "current_loaded_models", ()) or ()):
        ref = getattr(entry, "real_model", None)
        module = ref() if ref is not None else None
        if module is not None:
            listed.add(id(module))
        del module
    return listed


def _probe(record, model_management, found_by):
    """The forward probe of one suspect (strict mode: the backward search after it, for a model no ModelPatcher
    holds); records the leak when it names a holder that makes one.  Inside a prompt it spends that prompt's
    allowance; outside one (a free's receipt, an idle unload, a hand-off: no prompt pays) it goes through the search
    gate (``leaks.gate``), within ``COMFY_MEMX_SEARCH_CPU``.  Returns False when the gate refused (nothing ran)."""
    if ledger.current_prompt_id() is not None:
        _probe_now(record, model_management, found_by, None)
        return True
    try:
        gate.gate().run(functools.partial(_probe_now, record, model_management, found_by), GATE_WAIT_S)
    except gate.Busy:
        return False
    return True


def _probe_now(record, model_management, found_by, budget_s):
    """The probe itself, within ``budget_s`` CPU seconds (None: the probe's own budget, then the prompt's
    allowance), under the process's search desk, so that a receipt recording the same model at the same time
    (:func:`record_searched`) counts it once."""
    searches = watch.desk()
    if not searches.running.acquire(timeout=watch.WAIT_FOR_SEARCH_S):
        return
    from comfy_memx.leaks import holders
    module = record.module_ref()
    try:
        if record.leak is not None or module is None:
            return
        probe_s = watch.PROBE_CPU_S if budget_s is None else min(watch.PROBE_CPU_S, budget_s)
        report = holders.find_holders(module, budget_s=probe_s, ignore=_ignored(),
                                      ignore_frames_up_to=sys._getframe(), first_path=True, backward=False)
        if not report.chains and STATE.config.leak_mode == "strict" and not record.live_patchers():
            left = None if budget_s is None else budget_s - report.cpu_seconds
            report = _strict_search(module, report, holders, left)
        referrers = [watch.referrer_of(chain) for chain in report.chains]
        holder = leak_holder(record, referrers)
        if holder is not None:
            record.holder_steps = watch.steps_of(report)
            _record(record, (referrers, holder), dict(watch.search_summary(report), reason="new"),
                    found_by or _found_by(record))
    finally:
        del module
        searches.running.release()


def _strict_search(module, probe, holders, budget_s=None):
    """The backward search after a probe that found nothing, within ``budget_s`` (None: what is left of the running
    prompt's ``COMFY_MEMX_LEAK_BUDGET`` allowance)."""
    window = ledger.current_prompt_id()
    budget = watch.book().remaining(window) if budget_s is None else budget_s
    if budget < min(watch.MIN_SEARCH_S, STATE.config.leak_budget):
        return probe
    report = holders.find_holders(module, budget_s=budget, ignore=_ignored(), ignore_frames_up_to=sys._getframe(),
                                  first_path=True)
    if budget_s is None:
        watch.book().spend(window, report.cpu_seconds)
    return report


def _ignored():
    return [book(), *STATE.ledger.containers()]


def record_searched(record, result, model_management, found_by=AFTER_FREE):
    """Record ``record``'s model as a leak from a search already run (a free receipt's survivor: ``result`` is
    ``leaks.search_now``'s answer) when the model is alive, not a known leak, not in ComfyUI's use, and its holders
    make it a leak (:func:`leak_holder`); returns True when it did.  A model it cannot decide now (another search
    holds the desk) stays watched for the next collection point."""
    if record.leak is not None or not result or not result.get("holders"):
        return False
    searches = watch.desk()
    if not searches.running.acquire(timeout=watch.WAIT_FOR_SEARCH_S):
        return False
    try:
        module = record.module_ref()
        if module is None or record.leak is not None or id(module) in _listed(model_management):
            return False
        holder = None if in_comfyui_use(record, module, model_management) else leak_holder(record, result["holders"])
        if holder is None:
            return False
        suspects = STATE.existing_part(UnloadedModels)
        if suspects is not None:
            suspects.watched.pop(id(module), None)
        del module
        _record(record, (list(result["holders"]), holder), dict(result.get("search") or {}, reason="new"), found_by)
        return True
    finally:
        searches.running.release()


def leak_holder(record, referrers):
    """The holder that makes a model ComfyUI let go of a leak, or None: any root but ComfyUI's output cache when no
    live ModelPatcher refers to the model; when one does (a hoarded ModelPatcher), a chain rooted in a custom-node
    package's module or class: ComfyUI's own objects (its output cache, a node output or node instance it keeps) and
    running code (a node's frame, about to use it) hold a node's MODEL legitimately until they let go of it."""
    referrers = list(referrers)
    if record.live_patchers():
        packs = custom_node_packages()
        referrers = [ref for ref in referrers if ref.get("package") in packs and ref.get("root_kind") != THREAD_FRAME]
    holder = watch.holder_of(referrers)
    if holder is None or holder.get("pattern") == "comfyui_cache":
        return None
    return holder


def custom_node_packages():
    """The names of the custom-node packages loaded in this process (as the holder search names them:
    ``leaks.holders.packages.custom_node_packages``, kept until ``sys.modules`` changes)."""
    from comfy_memx.leaks.holders.packages import custom_node_packages as loaded
    return loaded()


def _found_by(record):
    last = record.unloads[-1] if record.unloads else {}
    return AFTER_FREE if last.get("reason") == "free_request" else AFTER_UNLOAD


def _record(record, found, summary, found_by):
    """Record the leak with the shape of a warned one (``leaks.watch``), so that every surface shows it as one;
    ``found`` is ``(referrers, the holder that makes it a leak)``."""
    referrers, holder = found
    prompt_id = ledger.current_prompt_id()
    now = round(time.time(), 6)
    record.leak = {"stage": "rooted", "prompt_id": prompt_id, "time": now, "last_prompt": prompt_id,
                   "last_seen": now, "sightings": 1, "referrers": referrers, "search": summary, "searches": 1,
                   "tries": 0, "next_check": 1, "refs": None, "window": None, "holder": holder,
                   "found_by": found_by}
    watch.book().rooted_leaks.add(record.model_id)
    _log(record)
    watch.emit_leak(record, reason="new")
    if STATE.config.release == "auto":
        release_automatically([record])   # queued: ComfyUI's prompt worker runs it between prompts


def _log(record):
    leak = record.leak
    holder = leak["holder"]
    after = "a free" if leak["found_by"] == AFTER_FREE else "an unload"
    log.warning("comfy_memx: leaked model %s (%s) is held by package %s (%s) after %s (ComfyUI no longer holds it "
                "and never warns about it), loaded by %s", record.model, record.model_id, holder["package"],
                holder["path"], after, record.owner.describe())
    log.warning("comfy_memx:   fix (%s): %s", holder["pattern"], holder["suggestion"])
