"""Answers ComfyUI's leak warnings: who loaded the leaked model (report mode) and what holds it (strict mode).

ComfyUI's ``cleanup_models_gc`` logs "Potential memory leak detected with model X" (INFO) when a LoadedModel's
patcher is gone but its torch module is alive, runs ``gc.collect()``, then logs "WARNING, memory leak with model X"
for every module still alive, and it does so again at every load for as long as the module lives.  The wrapper
around it calls :func:`suspects` first (a scan of the few entries of ``current_loaded_models``, no heap work), and
only when there is a suspect does anything more.

Work is proportional to new leaks, not to prompts served:

* a model seen for the first time is investigated once: in strict mode its reference cycle is captured before
  ComfyUI's collect destroys it, and after the call it is reported as stage ``cycle`` (the collect freed it) or
  ``rooted`` (still alive: a real leak) with its holder chains;
* later sightings of a known leak only update counters on its ledger record (``sightings``, ``last_prompt``,
  ``last_seen``) and write one small ``leak_seen`` event per prompt: no heap search, no log line;
* a known leak is searched again only when its holders may have changed (its reference count moved since the last
  search; checked at most after 1, 2, 4, 8 ... sightings) or when a user asks (:func:`search_now`, used by the
  ``/memx/models/{model_id}/search`` route and the ``/memx/free`` receipt);
* all strict-mode work in one prompt shares one time cap, ``COMFY_MEMX_LEAK_BUDGET``; a new leak that finds the
  cap spent is reported at once with ``search: {"deferred": true}`` and searched in a later prompt.

The leak state lives in the leaked model's ledger record (``record.leak``), so it disappears with the model and the
bookkeeping is bounded by the number of leaked models.  Suspects are held through their weakrefs only; a strong
reference here would itself cause the leak it reports.
"""

import itertools
import logging
import sys
import time

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.leaks import patterns
from comfy_memx.ledger import attribution

log = logging.getLogger("comfy_memx")

_OWN_REFS = 2  # getrefcount's argument and the caller's local


class LeakBook:
    """Strict-mode time spent in the current prompt, and the leaks found in this process (a part of the process
    state).  Bounded by the number of leaked models."""

    def __init__(self):
        self.prompt_id = None
        self.spent_s = 0.0
        self.calls = itertools.count()  # numbers the cleanup calls made outside any prompt
        self.rooted_leaks = set()  # model_ids of rooted leaks found in this process (for COMFY_MEMX_LEAK_FAIL)

    def remaining(self, window):
        """Seconds of strict-mode work left in ``window`` (a prompt, or one cleanup call outside prompts) under
        ``COMFY_MEMX_LEAK_BUDGET``."""
        if window != self.prompt_id:
            self.prompt_id, self.spent_s = window, 0.0
        return max(0.0, STATE.config.leak_budget - self.spent_s)

    def spend(self, seconds):
        """Count ``seconds`` of strict-mode work against the current prompt."""
        self.spent_s += seconds


def book():
    """This process's :class:`LeakBook`."""
    return STATE.part(LeakBook)


def rooted_leaks():
    """The model_ids of the models found leaked with a rooted holder in this process."""
    return set(book().rooted_leaks)


class Suspect:
    """A LoadedModel entry whose patcher is gone while its module lives; keeps the module by weakref."""
    __slots__ = ("module_ref", "record", "cycle", "new")

    def __init__(self, module_ref, record):
        self.module_ref, self.record, self.cycle = module_ref, record, None
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
        prompt_id = attribution.current_prompt_id()
        found.window = prompt_id if prompt_id is not None else ("call", next(book().calls))
    return found


def before_collect(found):
    """Strict mode: capture the reference cycle of each new suspect while it still exists (once per model)."""
    if STATE.config.leak_mode != "strict":
        return
    leaks = book()
    window = found.window
    for suspect in found:
        if not suspect.new:
            continue
        budget = leaks.remaining(window)
        module = suspect.module_ref()
        if module is None or budget <= 0:
            continue
        from comfy_memx.leaks import holders
        try:
            suspect.cycle = holders.capture_cycle(module, budget_s=budget, ignore=_ignored(found))
            leaks.spend(suspect.cycle.seconds)
        except Exception as exc:
            internal_error("leak cycle capture", exc)
        del module


def after_collect(found):
    """Report each new suspect once, count the sightings of known ones, and search again where it is due."""
    prompt_id = attribution.current_prompt_id()
    window = found.window
    now = round(time.time(), 6)
    here = sys._getframe()  # the outermost frame of ours that holds a module: the searches skip it
    for suspect in found:
        module = suspect.module_ref()
        # Measured here, with this frame's local as the only reference of ours (as search_now measures it), so
        # that two readings differ only when something else took or dropped a reference.
        refs = sys.getrefcount(module) - _OWN_REFS if module is not None else None
        if suspect.new:
            _first_sighting(suspect, module, found, prompt_id, now, (window, here, refs))
        elif module is not None:
            _later_sighting(suspect.record, module, found, prompt_id, now, (window, here, refs))
        del module


def _first_sighting(suspect, module, found, prompt_id, now, context):
    record = suspect.record
    stage = "cycle" if module is None else "rooted"
    record.leak = {"stage": stage, "prompt_id": prompt_id, "time": now, "last_prompt": prompt_id, "last_seen": now,
                   "sightings": 1, "referrers": [], "search": None, "searches": 0, "next_check": 1, "refs": None,
                   "window": context[0]}
    report = None
    if stage == "rooted":
        book().rooted_leaks.add(record.model_id)
        if STATE.config.leak_mode == "strict":
            report = _search(record, module, found, context, reason="new")
    elif suspect.cycle is not None:
        report = suspect.cycle
        record.leak["referrers"] = [classified({"path": report.text, "package": None, "root_kind": "cycle"})]
        record.leak["search"] = _search_summary(report)
    if report is not None and STATE.config.leak_graph:
        _write_graph(record, stage, report)
    _log(record)
    _emit_leak(record, reason="new")


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
        _search(record, module, found, context,
                reason="deferred" if (leak["search"] or {}).get("deferred") else "holders_changed")
        _log(record)
        _emit_leak(record, reason=leak["search"].get("reason") if leak["search"] else "holders_changed")
        return
    STATE.events.emit("leak_seen", model=record.model, model_id=record.model_id, owner=record.owner._asdict(),
                      stage=leak["stage"], sightings=leak["sightings"], prompt_id=prompt_id)


def _search_due(leak, refs):
    """A new search is due when the last one was deferred, or when the module's reference count moved since the
    last search (its holders may have changed), checked at most after 1, 2, 4, 8 ... sightings."""
    search = leak["search"] or {}
    if search.get("deferred"):
        return True
    if leak["sightings"] < leak["next_check"]:
        return False
    leak["next_check"] = leak["sightings"] * 2
    return leak["refs"] is not None and refs != leak["refs"]


def _search(record, module, found, context, reason):
    """Run a strict holder search of ``module`` within what is left of the prompt's cap; store it on the record.

    ``context`` is ``(budget window, reporting frame, reference count)``: the frames from the search out to the
    reporting frame hold the module only to pass it on and are not reported as holders; the reference count, read
    by ``after_collect``, is what a later sighting compares with.
    """
    window, reporting_frame, refs = context
    leaks = book()
    budget = leaks.remaining(window)
    leak = record.leak
    if budget <= 0:
        leak["search"] = {"deferred": True, "reason": reason,
                          "note": "COMFY_MEMX_LEAK_BUDGET of this prompt is spent; searched in a later prompt"}
        return None
    from comfy_memx.leaks import holders
    report = holders.find_holders(module, budget_s=budget, ignore=_ignored(found),
                                  ignore_frames_up_to=reporting_frame)
    leaks.spend(report.seconds)
    leak["referrers"] = [referrer_of(chain) for chain in report.chains]
    leak["search"] = dict(_search_summary(report), reason=reason)
    leak["searches"] += 1
    leak["refs"] = refs
    return report


def search_now(record, ignore=(), budget_s=None):
    """Search the holders of a leaked model now (a user asked); returns its referrers and search summary.

    Runs on the caller's thread with its own budget (``COMFY_MEMX_LEAK_BUDGET`` unless given), outside any prompt's
    cap; updates the record's leak state when the model is a known leak.
    """
    module = record.module_ref()
    if module is None:
        return {"holders": [], "search": {"note": "freed before the search"}}
    from comfy_memx.leaks import holders
    try:
        report = holders.find_holders(module, budget_s=budget_s or STATE.config.leak_budget,
                                      ignore=[*ignore, *STATE.ledger.containers()],
                                      ignore_frames_up_to=sys._getframe())
        refs = sys.getrefcount(module) - _OWN_REFS
    finally:
        del module
    referrers = [referrer_of(chain) for chain in report.chains]
    summary = dict(_search_summary(report), reason="requested", note=report.note or None)
    if record.leak is not None and record.leak["stage"] == "rooted":
        record.leak.update(referrers=referrers, search=summary, refs=refs)
        record.leak["searches"] += 1
    return {"holders": referrers, "search": summary}


def public_state(leak):
    """The leak state of a record as the surfaces show it (None when the model is not a known leak)."""
    if leak is None:
        return None
    return {key: leak[key] for key in ("stage", "prompt_id", "time", "last_prompt", "last_seen", "sightings",
                                       "searches", "referrers", "search")}


def referrer_of(chain):
    """The JSON form of one holder chain, as every surface shows it, with its pattern and the usual fix."""
    return classified({"path": chain.path, "package": chain.package, "root_kind": chain.root_kind,
                       "stage": getattr(chain, "stage", "backward")})


def classified(referrer):
    """``referrer`` with ``pattern`` and ``suggestion`` added (``leaks.patterns``)."""
    referrer["pattern"], referrer["suggestion"] = patterns.classify(referrer)
    return referrer


def _ignored(found):
    return [found, *STATE.ledger.containers()]


def _search_summary(report):
    if hasattr(report, "search_summary"):  # a HolderReport: scans, found_by (probe/backward), the stages' figures
        return report.search_summary()
    return {"seconds": round(report.seconds, 4), "objects_visited": report.objects_visited,
            "complete": report.complete}


def _emit_leak(record, reason):
    leak = record.leak
    STATE.events.emit("leak", model=record.model, model_id=record.model_id, owner=record.owner._asdict(),
                      stage=leak["stage"], referrers=leak["referrers"], search=leak["search"],
                      sightings=leak["sightings"], reason=reason)


def _write_graph(record, stage, report):
    """COMFY_MEMX_LEAK_GRAPH: one Graphviz file per leak, and a PNG when a ``dot`` binary exists."""
    import os
    import shutil
    import subprocess
    from comfy_memx.leaks import holders
    try:
        base = os.path.join(STATE.config.leak_graph, f"{record.model_id.replace('#', '-')}-{stage}-{os.getpid()}")
        with open(base + ".dot", "w", encoding="utf-8") as f:
            f.write(holders.to_dot(report))
        dot = shutil.which("dot")
        if dot:
            subprocess.run([dot, "-Tpng", "-o", base + ".png", base + ".dot"], timeout=20, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("comfy_memx: cannot write the leak graph to %s (%s)", STATE.config.leak_graph, exc)


def _log(record):
    leak = record.leak
    who = f"{record.model} ({record.model_id}), loaded by {record.owner.describe()}"
    referrers, search = leak["referrers"], leak["search"]
    if leak["stage"] == "cycle":
        log.info("comfy_memx: %s was held only by a reference cycle; ComfyUI's garbage collection freed it", who)
        for ref in referrers:
            log.info("comfy_memx:   cycle: %s", ref["path"])
            log.info("comfy_memx:     fix (%s): %s", ref["pattern"], ref["suggestion"])
        return
    if STATE.config.leak_mode != "strict":
        log.warning("comfy_memx: leaked model %s; run with COMFY_MEMX_LEAK_MODE=strict to name what holds it", who)
        return
    if search is not None and search.get("deferred"):
        log.warning("comfy_memx: leaked model %s; its holder search waits for a later prompt (%s)", who,
                    search["note"])
        return
    again = " (searched again: its holders changed)" if leak["searches"] > 1 else ""
    log.warning("comfy_memx: leaked model %s is held by %d reference chain(s)%s%s", who, len(referrers),
                "" if not search or search.get("complete") else " (search incomplete: budget or depth ran out)", again)
    for ref in referrers:
        log.warning("comfy_memx:   %s  [package %s, %s]", ref["path"], ref["package"], ref["root_kind"])
        log.warning("comfy_memx:     fix (%s): %s", ref["pattern"], ref["suggestion"])
    if not referrers:
        log.warning("comfy_memx:   no holder reachable by the garbage collector: it is held from C code or by an "
                    "object the search skips")
