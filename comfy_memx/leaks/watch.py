"""Answers ComfyUI's leak warnings: who loaded the leaked model, which package holds it, and (strict) the chains.

ComfyUI's ``cleanup_models_gc`` logs "Potential memory leak detected with model X" (INFO) when a LoadedModel's
patcher is gone but its torch module is alive, runs ``gc.collect()``, then logs "WARNING, memory leak with model X"
for every module still alive, and it does so again at every load for as long as the module lives.  The wrapper
around it calls :func:`suspects` first (a scan of the few entries of ``current_loaded_models``, no heap work), and
only when there is a suspect does anything more.

Work is proportional to new leaks, not to prompts served:

* a model seen for the first time is probed once, in every leak mode, before ComfyUI's collect: the forward probe
  walks from the custom-node packages and stops at the first path to the model (no heap scan; a few ms).  When it
  finds one, the model is held from a root and the collect cannot free it: that chain names the holding package
  (``holder_package``), in report mode too, and no cycle is captured.  Only when the probe finds nothing does strict
  mode capture the reference cycle (the collect may destroy it) and, if the model survives, run the backward
  search;
* later sightings of a known leak only update counters on its ledger record (``sightings``, ``last_prompt``,
  ``last_seen``) and write one small ``leak_seen`` event per prompt: no heap search, no log line;
* a known leak is searched again when its last search was deferred or incomplete (at most :data:`MAX_TRIES`
  searches that ran out), when its holders may have changed (its reference count moved since the last search;
  checked at most after 1, 2, 4, 8 ... sightings), or when a user asks (:func:`search_now`, used by the
  ``/memx/models/{model_id}/search`` route and the ``/memx/free`` receipt);
* strict-mode work in one prompt shares one allowance of CPU time, ``COMFY_MEMX_LEAK_BUDGET`` (time spent waiting
  for a core or for the GIL does not count, so the answer does not change with the machine's load); a search
  that would start with less than :data:`MIN_SEARCH_S` left, or while another search of ours runs, is deferred to
  a later prompt instead, and deferred or incomplete searches go first in the next prompt;
* one holder search runs at a time in the process (:class:`SearchDesk`), and concurrent requests for the same
  model share one run, so no search ever meets another one's objects.

Every search result says what it is (``search.result``): ``found``, ``not_found`` after a complete search (only
then is the holder said to be out of the search's sight, naming what it cannot see), or ``incomplete`` (what was
searched, why it stopped, and whether it will be tried again).

The leak state lives in the leaked model's ledger record (``record.leak``), so it disappears with the model and the
bookkeeping is bounded by the number of leaked models.  Suspects are held through their weakrefs only; a strong
reference here would itself cause the leak it reports.
"""

import itertools
import logging
import os
import sys
import threading
import time
from urllib.parse import quote

from comfy_memx.core.errors import internal_error
from comfy_memx.core.refs import OWN_REFS
from comfy_memx.core.state import STATE
from comfy_memx.leaks import gate, patterns
from comfy_memx.ledger import api as ledger

log = logging.getLogger("comfy_memx")

PROBE_CPU_S = 0.5    # the forward probe of a new leak, in every mode (it usually takes a few ms)
MIN_SEARCH_S = 0.25  # CPU seconds: with less than this left in the prompt a search is deferred, never started
MAX_TRIES = 4        # searches of one leak that may run out before it is reported as incomplete for good
WAIT_FOR_SEARCH_S = 2.0  # how long a prompt's search waits for a requested search of ours to finish
FOUND_BY_WARNING = "comfyui_warning"  # ``found_by`` of a leak ComfyUI warned about (``leaks.unwarned``: the others)


class SearchDesk:
    """The holder searches of this process (a part of the process state): one runs at a time (``running``), and
    concurrent requests for the same model share one run (``flights``: model_id -> :class:`Flight`)."""

    def __init__(self):
        self.running = threading.Lock()
        self.lock = threading.Lock()   # guards ``flights`` only; held for a dict operation, never across a search
        self.flights = {}
        self.runs = 0


class Flight:
    """One requested search that later callers for the same model wait for."""
    __slots__ = ("done", "result")

    def __init__(self):
        self.done = threading.Event()
        self.result = None


def desk():
    """This process's :class:`SearchDesk`."""
    return STATE.part(SearchDesk)


class LeakBook:
    """Strict-mode CPU time spent in the current prompt, and the leaks found in this process (a part of the process
    state).  Bounded by the number of leaked models."""

    def __init__(self):
        self.prompt_id = None
        self.spent_s = 0.0
        self.calls = itertools.count()  # numbers the cleanup calls made outside any prompt
        self.rooted_leaks = set()  # model_ids of rooted leaks found in this process (for COMFY_MEMX_LEAK_FAIL)
        self.graph_warned = False  # a leak graph that could not be written was logged (once per process)

    def remaining(self, window):
        """CPU seconds of strict-mode work left in ``window`` under ``COMFY_MEMX_LEAK_BUDGET``: a prompt's own
        allowance; outside prompts (a cleanup call during a free, say: no prompt pays) what the search gate's
        ``COMFY_MEMX_SEARCH_CPU`` bucket holds, so that no caller buys a fresh allowance per call."""
        if _outside_prompts(window):
            return min(float(STATE.config.leak_budget), gate.gate().cpu_left())
        if window != self.prompt_id:
            self.prompt_id, self.spent_s = window, 0.0
        return max(0.0, STATE.config.leak_budget - self.spent_s)

    def spend(self, window, seconds):
        """Count ``seconds`` of strict-mode CPU time against ``window`` (outside prompts: the search gate's)."""
        if _outside_prompts(window):
            gate.gate().charge(seconds)
            return
        self.remaining(window)
        self.spent_s += seconds


def _outside_prompts(window):
    return isinstance(window, tuple)


def book():
    """This process's :class:`LeakBook`."""
    return STATE.part(LeakBook)


def rooted_leaks():
    """The model_ids of the models found leaked with a rooted holder in this process."""
    return set(book().rooted_leaks)


class Suspect:
    """A LoadedModel entry whose patcher is gone while its module lives; keeps the module by weakref.

    ``probe`` is the forward probe's report of a new suspect (before the collect), ``cycle`` its captured cycle
    (strict mode, only when the probe found no holder)."""
    __slots__ = ("module_ref", "record", "cycle", "probe", "new")

    def __init__(self, module_ref, record):
        self.module_ref, self.record, self.cycle, self.probe = module_ref, record, None, None
        self.new = record.leak is None


class Suspects(list):
    """The suspects of one ``cleanup_models_gc`` call, with its ``window``: the prompt it runs in, or the call
    itself outside any prompt (one sighting per window; one strict-mode time cap per window)."""
    __slots__ = ("window",)


def suspects(model_management):
    """The entries ComfyUI is about to warn about, as :class:`Suspect` objects (empty list in the common case)."""
    found = Suspects()
    for entry in list(model_management.current_loaded_models):
        module_ref = entry.real_model
        if module_ref is None:
            continue
        module = module_ref()
        if module is not None and entry.model is None:
            found.append(Suspect(module_ref, STATE.ledger.record_for(module)))
        del module
    if found:
        prompt_id = ledger.current_prompt_id()
        found.window = prompt_id if prompt_id is not None else ("call", next(book().calls))
    return found


def before_collect(found):
    """Probe each new suspect once (every mode) and, in strict mode, capture the cycle of those it found no holder
    for, while the cycle still exists."""
    mode = STATE.config.leak_mode
    if mode == "off":
        return
    leaks = book()
    window = found.window
    searches = desk()
    from comfy_memx.leaks import holders
    for suspect in found:
        if not suspect.new:
            continue
        module = suspect.module_ref()
        if module is None:
            continue
        if _outside_prompts(window) and leaks.remaining(window) < gate.MIN_SEARCH_S:
            del module
            continue   # outside prompts the search gate pays, and its budget is spent: not probed now
        if not searches.running.acquire(timeout=WAIT_FOR_SEARCH_S):
            del module
            continue   # a requested search of ours holds the desk: reported as deferred after the collect
        try:
            suspect.probe = holders.find_holders(module, budget_s=PROBE_CPU_S, ignore=_ignored(found),
                                                 first_path=True, backward=False)
            if mode == "strict" or _outside_prompts(window):
                leaks.spend(window, suspect.probe.cpu_seconds)
            if mode == "strict":
                budget = leaks.remaining(window)
                if suspect.probe.result != holders.RESULT_FOUND and budget >= MIN_SEARCH_S:
                    # held by no root the probe sees: it may be a cycle that the collect is about to free
                    suspect.cycle = holders.capture_cycle(module, budget_s=budget, ignore=_ignored(found))
                    leaks.spend(window, suspect.cycle.cpu_seconds)
        except Exception as exc:
            internal_error("leak probe", exc)
        finally:
            searches.running.release()
            del module


def after_collect(found):
    """Report each new suspect once, count the sightings of known ones, and search again where it is due.

    Known leaks whose search is waiting (deferred or incomplete) are served before new ones, so that a search
    put off once is not put off again by the next prompt's new leaks."""
    prompt_id = ledger.current_prompt_id()
    window = found.window
    now = round(time.time(), 6)
    here = sys._getframe()  # the outermost frame of ours that holds a module: the searches skip it
    for suspect in sorted(found, key=lambda suspect: suspect.new):
        module = suspect.module_ref()
        # Measured here, with this frame's local as the only reference of ours (as search_now measures it), so
        # that two readings differ only when something else took or dropped a reference.
        refs = sys.getrefcount(module) - OWN_REFS if module is not None else None
        if suspect.new:
            _first_sighting(suspect, module, found, prompt_id, now, (window, here, refs))
        elif module is not None:
            _later_sighting(suspect.record, module, found, prompt_id, now, (window, here, refs))
        del module


def _first_sighting(suspect, module, found, prompt_id, now, context):
    record = suspect.record
    stage = "cycle" if module is None else "rooted"
    record.leak = {"stage": stage, "prompt_id": prompt_id, "time": now, "last_prompt": prompt_id, "last_seen": now,
                   "sightings": 1, "referrers": [], "search": None, "searches": 0, "tries": 0, "next_check": 1,
                   "refs": None, "window": context[0], "holder": None,
                   "found_by": FOUND_BY_WARNING}
    report = None
    if stage == "rooted":
        book().rooted_leaks.add(record.model_id)
        probe = suspect.probe
        if probe is not None and probe.chains:
            report = probe
            _store(record, probe, reason="new", refs=context[2])
        elif STATE.config.leak_mode == "strict":
            report = _search(record, module, found, context, reason="new")
        else:
            record.leak["search"] = _probe_only_summary(probe)
    elif suspect.cycle is not None:
        report = suspect.cycle
        record.leak["referrers"] = [classified({"path": report.text, "package": None, "root_kind": "cycle"})]
        record.leak["search"] = search_summary(report)
    if report is not None and STATE.config.leak_graph and _has_chain(report):
        _write_graph(record, stage, report)
    _log(record)
    emit_leak(record, reason="new")


def _later_sighting(record, module, found, prompt_id, now, context):
    leak = record.leak
    if prompt_id is None:
        leak["last_seen"] = now  # outside prompts (a /free, an embedding program): seen, but not a prompt's sighting
        return
    if leak["window"] == context[0]:
        return  # ComfyUI warns at every load; one sighting per prompt is enough
    leak["sightings"] += 1
    leak["last_prompt"], leak["last_seen"], leak["window"] = prompt_id, now, context[0]
    if STATE.config.leak_mode == "strict" and leak["stage"] == "rooted" and _search_due(leak, context[2]):
        waiting = (leak["search"] or {}).get("result") in ("deferred", "incomplete")
        report = _search(record, module, found, context, reason="deferred" if waiting else "holders_changed")
        if report is not None and STATE.config.leak_graph and _has_chain(report):
            _write_graph(record, "rooted", report)
        _log(record)
        emit_leak(record, reason=leak["search"].get("reason") if leak["search"] else "holders_changed")
        return
    STATE.events.emit("leak_seen", model=record.model, model_id=record.model_id, owner=record.owner._asdict(),
                      holder_package=_holder_package(leak), stage=leak["stage"], sightings=leak["sightings"],
                      prompt_id=prompt_id)


def _search_due(leak, refs):
    """A new search is due when the last one was deferred, or ran out with nothing found and fewer than
    :data:`MAX_TRIES` searches ran out so far, or when the module's reference count moved since the last search
    (its holders may have changed), checked at most after 1, 2, 4, 8 ... sightings."""
    search = leak["search"] or {}
    if search.get("result") == "deferred":
        return True
    if search.get("result") == "incomplete" and leak["tries"] < MAX_TRIES:
        return True
    if leak["sightings"] < leak["next_check"]:
        return False
    leak["next_check"] = leak["sightings"] * 2
    return leak["refs"] is not None and refs != leak["refs"]


def _search(record, module, found, context, reason):
    """Run a strict holder search of ``module`` within what is left of the prompt's CPU allowance; store it on the
    record.  Deferred (nothing run) when less than :data:`MIN_SEARCH_S` is left or another search of ours runs.

    ``context`` is ``(budget window, reporting frame, reference count)``: the frames from the search out to the
    reporting frame hold the module only to pass it on and are not reported as holders; the reference count, read
    by ``after_collect``, is what a later sighting compares with.
    """
    window, reporting_frame, refs = context
    leaks = book()
    budget = leaks.remaining(window)
    least = min(MIN_SEARCH_S, STATE.config.leak_budget)
    if (budget < least or budget <= 0) and _outside_prompts(window):
        _defer(record, reason, f"outside prompts searches are paid by COMFY_MEMX_SEARCH_CPU "
                               f"({STATE.config.search_cpu:g} s of CPU time per minute), spent now; searched in the "
                               "next prompt")
        return None
    if budget < least or budget <= 0:
        _defer(record, reason, f"less than {least:g} s of this prompt's COMFY_MEMX_LEAK_BUDGET "
                               f"({STATE.config.leak_budget:g} s of CPU time) is left; searched in the next prompt")
        return None
    searches = desk()
    if not searches.running.acquire(timeout=WAIT_FOR_SEARCH_S):
        _defer(record, reason, "another holder search of comfy_memx was running; searched in the next prompt")
        return None
    from comfy_memx.leaks import holders
    try:
        searches.runs += 1
        # a new (or put off) leak needs its holder named; a changed one is searched in full, to show the new holder
        report = holders.find_holders(module, budget_s=budget, ignore=_ignored(found),
                                      ignore_frames_up_to=reporting_frame, first_path=reason != "holders_changed")
    finally:
        searches.running.release()
    leaks.spend(window, report.cpu_seconds)
    _store(record, report, reason=reason, refs=refs)
    return report


def _defer(record, reason, note):
    record.leak["search"] = {"result": "deferred", "deferred": True, "reason": reason, "note": note}


def _store(record, report, reason, refs):
    """Put a search's chains, holder and summary on the leak record."""
    leak = record.leak
    referrers = [referrer_of(chain) for chain in report.chains]
    summary = dict(search_summary(report), reason=reason)
    leak["searches"] += 1
    if summary["result"] == "incomplete":
        leak["tries"] += 1
        summary["tries"] = leak["tries"]
        summary["retry"] = leak["tries"] < MAX_TRIES
    if referrers or summary["result"] != "incomplete" or not leak["referrers"]:
        leak["referrers"] = referrers
        leak["holder"] = holder_of(referrers)
        record.holder_steps = steps_of(report)
    leak["search"] = summary
    leak["refs"] = refs


def steps_of(report):
    """``{path: steps}`` of a report's chains that can be walked again (what a release cuts along)."""
    return {chain.path: chain.steps for chain in report.chains if getattr(chain, "steps", ())}


def holder_of(referrers):
    """The holder a user acts on: the shortest chain rooted in a custom-node package, else the shortest chain."""
    if not referrers:
        return None
    named = [ref for ref in referrers if ref.get("holder_package") not in (None, "core")] or referrers
    best = named[0]
    holder = {key: best.get(key) for key in ("path", "root_kind", "pattern", "suggestion", "stage")}
    holder["package"] = best.get("holder_package", best.get("package"))
    return holder


def _holder_package(leak):
    holder = leak.get("holder") if leak else None
    return holder.get("package") if holder else None


def _probe_only_summary(probe):
    """Report mode, when the forward probe found no holder: what was searched and how to get the chain."""
    summary = search_summary(probe) if probe is not None else {"result": "incomplete", "stopped_by": "not_run"}
    summary.update(result="incomplete", reason="new",
                   note="report mode probes only from the custom-node packages; run with COMFY_MEMX_LEAK_MODE="
                        "strict, or POST /memx/models/{model_id}/search, for the full holder search")
    return summary


def search_now(record, ignore=(), budget_s=None):
    """Search the holders of a leaked model now (a user asked); returns its referrers and search summary.

    Runs on the caller's thread with its own CPU budget (``COMFY_MEMX_LEAK_BUDGET`` unless given), outside any
    prompt's allowance, once the process's running search (if any) is done; a caller that asks while a search of
    the same model runs waits for that run and gets its answer.  Updates the record's leak state when the model
    is a known leak.
    """
    searches = desk()
    with searches.lock:
        flight = searches.flights.get(record.model_id)
        leader = flight is None
        if leader:
            flight = searches.flights[record.model_id] = Flight()
    if not leader:
        wait_s = (budget_s or STATE.config.leak_budget) * 5 + 5
        if flight.done.wait(wait_s) and flight.result is not None:
            return flight.result
        return {"holders": [], "search": {"result": "incomplete", "reason": "requested",
                                          "note": "the search of this model that was running did not answer"}}
    try:
        with searches.running:
            searches.runs += 1
            flight.result = _search_now(record, ignore, budget_s)
        return flight.result
    finally:
        with searches.lock:
            searches.flights.pop(record.model_id, None)
        flight.done.set()


def gated_search(record, ignore=(), wait_s=gate.QUEUE_S):
    """:func:`search_now` through the search gate (``leaks.gate``: one at a time, within ``COMFY_MEMX_SEARCH_CPU``),
    remembered as the model's last gated search; raises ``gate.Busy`` when it cannot run within ``wait_s``."""
    searches = gate.gate()
    found = searches.run(lambda budget: search_now(record, ignore=ignore, budget_s=budget), wait_s)
    searches.remember(record, found)
    return found


def first_paths(records, ignore=(), budget_s=None):
    """The shortest holder of each live model of ``records`` by the forward probe alone (from the custom-node
    packages and ComfyUI's long-lived objects; a few ms a model), within ``budget_s`` CPU seconds for all of them
    (default ``COMFY_MEMX_LEAK_BUDGET``) and :data:`PROBE_CPU_S` each.

    Returns ``{model_id: answer}`` (answers as :func:`search_now`'s, one chain each) for the models it found a holder
    of, and sets their ``holder_steps`` so that a release can walk that chain again.  A free with many survivors
    names them all this way before any heap search (one full search each would spend the search gate's minute on
    the first few); a model the probe does not reach is left for :func:`gated_search`."""
    from comfy_memx.leaks import holders
    budget_s = STATE.config.leak_budget if budget_s is None else budget_s
    searches = desk()
    answers = {}
    if not searches.running.acquire(timeout=WAIT_FOR_SEARCH_S):
        return answers
    started = time.thread_time()
    try:
        searches.runs += 1
        for record in records:
            left = budget_s - (time.thread_time() - started)
            if left < gate.MIN_SEARCH_S:
                break
            module = record.module_ref()
            if module is None:
                continue
            try:
                report = holders.find_holders(module, budget_s=min(PROBE_CPU_S, left),
                                              ignore=[*ignore, *STATE.ledger.containers()],
                                              ignore_frames_up_to=sys._getframe(), first_path=True, backward=False)
            finally:
                del module
            if not report.chains:
                continue
            referrers = [referrer_of(chain) for chain in report.chains]
            record.holder_steps = steps_of(report)
            summary = dict(search_summary(report), reason="requested",
                           note="the shortest holder, found by the forward probe (POST /memx/models/{model_id}/search "
                                "lists every holder)")
            answers[record.model_id] = {"holders": referrers, "holder": holder_of(referrers), "search": summary}
    finally:
        searches.running.release()
    return answers


def gated_first_paths(records, ignore=(), wait_s=gate.QUEUE_S):
    """:func:`first_paths` through the search gate, as one gated search; each answer is remembered as its model's
    last gated search.  Raises ``gate.Busy`` when it cannot run within ``wait_s``."""
    searches = gate.gate()
    answers = searches.run(lambda budget: first_paths(records, ignore=ignore, budget_s=budget), wait_s)
    for record in records:
        if record.model_id in answers:
            searches.remember(record, answers[record.model_id])
    return answers


def search_or_say_why(record, wait_s, ignore=()):
    """:func:`gated_search`, or, when the gate refuses, the answer of a search that did not run: no holders, and
    ``search`` saying why (``result`` ``deferred``, ``note`` ``not searched: cpu budget``)."""
    try:
        return gated_search(record, ignore=ignore, wait_s=wait_s)
    except gate.Busy as busy:
        return {"holders": [], "holder": None, "search": {"result": "deferred", "retry_after": busy.retry_after,
                                                          "note": f"not searched: {busy.why.replace('_', ' ')}"}}


def _search_now(record, ignore, budget_s):
    module = record.module_ref()
    if module is None:
        return {"holders": [], "search": {"result": "freed", "note": "freed before the search"}}
    from comfy_memx.leaks import holders
    try:
        report = holders.find_holders(module, budget_s=budget_s or STATE.config.leak_budget,
                                      ignore=[*ignore, *STATE.ledger.containers()],
                                      ignore_frames_up_to=sys._getframe())
        refs = sys.getrefcount(module) - OWN_REFS
    finally:
        del module
    referrers = [referrer_of(chain) for chain in report.chains]
    record.holder_steps = steps_of(report)
    summary = dict(search_summary(report), reason="requested", note=report.note or None)
    if record.leak is not None and record.leak["stage"] == "rooted":
        record.leak.update(referrers=referrers, search=summary, refs=refs, holder=holder_of(referrers))
        record.leak["searches"] += 1
    return {"holders": referrers, "holder": holder_of(referrers), "search": summary}


def public_state(leak):
    """The leak state of a record as the surfaces show it (None when the model is not a known leak)."""
    if leak is None:
        return None
    state = {key: leak.get(key) for key in ("stage", "prompt_id", "time", "last_prompt", "last_seen", "sightings",
                                            "searches", "tries", "referrers", "search", "holder")}
    state["holder_package"] = _holder_package(leak)
    state["found_by"] = leak.get("found_by", FOUND_BY_WARNING)
    return state


def referrer_of(chain):
    """The JSON form of one holder chain, as every surface shows it, with its pattern, the usual fix and the
    package that holds the model (``holder_package``: the root's package, or the pack whose object on a chain from
    ComfyUI's own objects holds it)."""
    referrer = {"path": chain.path, "package": chain.package, "root_kind": chain.root_kind,
                "stage": getattr(chain, "stage", "backward")}
    inner = getattr(chain, "inner_package", None)
    kinds = getattr(chain, "kinds", ())
    referrer["pattern"], referrer["suggestion"] = patterns.classify(
        dict(referrer, kinds=kinds, inner_package=inner, mappings=getattr(chain, "mappings", ())))
    root_package = chain.package if chain.package not in ("?", None) else None
    referrer["holder_package"] = inner if inner and root_package in ("core", None) else root_package
    return referrer


def classified(referrer):
    """``referrer`` with ``pattern`` and ``suggestion`` added (``leaks.patterns``)."""
    referrer["pattern"], referrer["suggestion"] = patterns.classify(referrer)
    return referrer


def _ignored(found):
    return [found, *STATE.ledger.containers()]


def search_summary(report):
    """The JSON summary of a search report (a ``HolderReport``'s own, or the figures of a captured cycle)."""
    if hasattr(report, "search_summary"):  # a HolderReport: scans, found_by (probe/backward), the stages' figures
        return report.search_summary()
    return {"result": "found" if report.members else ("not_found" if report.complete else "incomplete"),
            "seconds": round(report.seconds, 4), "objects_visited": report.objects_visited,
            "complete": report.complete}


def _has_chain(report):
    """True when a report has something to draw: a chain, or a captured cycle."""
    return bool(getattr(report, "chains", None) or getattr(report, "members", None))


def emit_leak(record, reason):
    """The ``leak`` event of ``record``'s leak state (``reason``: ``new``, ``holders_changed``, ``deferred``)."""
    leak = record.leak
    STATE.events.emit("leak", model=record.model, model_id=record.model_id, owner=record.owner._asdict(),
                      holder_package=_holder_package(leak), holder=leak.get("holder"), stage=leak["stage"],
                      referrers=leak["referrers"], search=leak["search"], sightings=leak["sightings"], reason=reason,
                      found_by=leak.get("found_by", FOUND_BY_WARNING))


def _write_graph(record, stage, report):
    """COMFY_MEMX_LEAK_GRAPH: one Graphviz file per leak, and a PNG when a ``dot`` binary exists.  Both are new 0600
    files under one unguessable name (``core.private``: ``O_EXCL``, no link followed); ``dot`` reads the graph on its
    stdin and writes the PNG to its stdout, so neither file is opened again by name.  A refusal or failure is logged
    once per process."""
    import shutil
    import subprocess
    from comfy_memx.core import private
    from comfy_memx.leaks import holders
    folder = STATE.config.leak_graph
    stem = "".join(c if c.isalnum() or c in "._" else "-" for c in f"{record.model_id}-{stage}-{os.getpid()}")
    name = private.unguessable(stem)
    try:
        text = holders.to_dot(report)
        with private.open_folder(folder) as place:
            with place.create(name + ".dot") as f:
                f.write(text)
            dot = shutil.which("dot")
            if dot:
                drawn = subprocess.run([dot, "-Tpng"], input=text.encode("utf-8"), timeout=20, check=False,
                                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                if drawn.returncode == 0 and drawn.stdout:
                    with place.create(name + ".png", binary=True) as png:
                        png.write(drawn.stdout)
    except (OSError, subprocess.SubprocessError) as exc:
        if not book().graph_warned:
            book().graph_warned = True
            log.warning("comfy_memx: cannot write the leak graph %s to %s (%s); later failures are not logged "
                        "(check COMFY_MEMX_LEAK_GRAPH / --leak-graph)", name, folder, exc)


def search_path(model_id):
    """The path of the search route of one model, ready to paste (``#`` in a model_id is ``%23`` in a URL)."""
    return f"/memx/models/{quote(model_id, safe='')}/search"


def _log(record):
    leak = record.leak
    loaded = f"loaded by {record.owner.describe()}"
    name = f"{record.model} ({record.model_id})"
    referrers, search = leak["referrers"], leak["search"] or {}
    if leak["stage"] == "cycle":
        log.info("comfy_memx: %s, %s, was held only by a reference cycle; ComfyUI's garbage collection freed it",
                 name, loaded)
        for ref in referrers:
            log.info("comfy_memx:   cycle: %s", ref["path"])
            log.info("comfy_memx:     fix (%s): %s", ref["pattern"], ref["suggestion"])
        return
    holder = leak.get("holder")
    if STATE.config.leak_mode != "strict":
        if holder is not None:
            log.warning("comfy_memx: leaked model %s is held by package %s (%s), %s", name, holder["package"],
                        holder["path"], loaded)
            log.warning("comfy_memx:   fix (%s): %s", holder["pattern"], holder["suggestion"])
        else:
            log.warning("comfy_memx: leaked model %s, %s; the quick probe from the custom-node packages found no "
                        "holder: run with COMFY_MEMX_LEAK_MODE=strict or POST %s for the chain",
                        name, loaded, search_path(record.model_id))
        return
    result = search.get("result")
    if result == "deferred":
        log.warning("comfy_memx: leaked model %s, %s; its holder search waits for a later prompt (%s)", name,
                    loaded, search.get("note"))
        return
    if result == "found":
        again = " (searched again: its holders changed)" if leak["searches"] > 1 else ""
        held = f"held by package {holder['package']}, " if holder else ""
        more = (f" (the first found; POST {search_path(record.model_id)} lists every holder)"
                if search.get("stopped_by") == "first_path" else
                "" if search.get("complete") else f" (search stopped by {search.get('stopped_by')}: there may be more)")
        log.warning("comfy_memx: leaked model %s, %s%s, is held by %d reference chain(s)%s%s", name, held, loaded,
                    len(referrers), more, again)
        for ref in referrers:
            log.warning("comfy_memx:   %s  [package %s, %s]", ref["path"], ref["package"], ref["root_kind"])
            log.warning("comfy_memx:     fix (%s): %s", ref["pattern"], ref["suggestion"])
        return
    searched = (f"{search.get('objects_visited', 0)} objects, {search.get('scans', 0)} heap scans, "
                f"{search.get('cpu_seconds', 0):.2f} s of CPU time")
    if result == "not_found":
        from comfy_memx.leaks.holders import NOT_SEEN
        log.warning("comfy_memx: leaked model %s, %s: a complete search (%s) found no holder the garbage collector "
                    "can see; it is held by one of: %s", name, loaded, searched, "; ".join(NOT_SEEN))
        return
    if search.get("retry"):
        when = f"searching again in the next prompt (try {leak['tries'] + 1} of {MAX_TRIES})"
    else:
        when = (f"not searched again automatically after {leak['tries']} tries; POST "
                f"{search_path(record.model_id)} or raise COMFY_MEMX_LEAK_BUDGET")
    log.warning("comfy_memx: leaked model %s, %s: no holder found within the budget (searched %s; stopped by %s); "
                "%s", name, loaded, searched, search.get("stopped_by"), when)
