"""Answers ComfyUI's leak warnings: who loaded the leaked model (report mode) and what holds it (strict mode).

ComfyUI's ``cleanup_models_gc`` logs "Potential memory leak detected with model X" (INFO) when a LoadedModel's
patcher is gone but its torch module is alive, runs ``gc.collect()``, then logs "WARNING, memory leak with model X"
for every module still alive.  The wrapper around it calls :func:`suspects` first (a scan of the few entries of
``current_loaded_models``, no heap work), and only when there is a suspect does anything more: in strict mode the
reference cycle is captured before ComfyUI's collect destroys it, and after the call each suspect is reported once
per prompt as stage ``cycle`` (the collect freed it) or ``rooted`` (still alive: a real leak).
Suspects are held through their weakrefs only; a strong reference here would itself cause the leak it reports.
"""

import logging
import sys
import time

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.ledger import attribution

log = logging.getLogger("comfy_memx")


class LeakBook:
    """What this process reported (a part of the process state)."""

    def __init__(self):
        self.reported = set()      # (model_id, prompt_id) already reported
        self.rooted_leaks = set()  # model_ids of rooted leaks found in this process (for COMFY_MEMX_LEAK_FAIL)


def book():
    """This process's :class:`LeakBook`."""
    return STATE.part(LeakBook)


def rooted_leaks():
    """The model_ids of the models found leaked with a rooted holder in this process."""
    return set(book().rooted_leaks)


class Suspect:
    """A LoadedModel entry whose patcher is gone while its module lives; keeps the module by weakref."""
    __slots__ = ("module_ref", "record", "cycle")

    def __init__(self, module_ref, record):
        self.module_ref, self.record, self.cycle = module_ref, record, None


def suspects(model_management):
    """The entries ComfyUI is about to warn about, as :class:`Suspect` objects (empty list in the common case)."""
    found = []
    for entry in list(model_management.current_loaded_models):
        module_ref = entry.real_model
        if module_ref is None:
            continue
        module = module_ref()
        if module is not None and entry.model is None:
            found.append(Suspect(module_ref, STATE.ledger.record_for(module)))
        del module
    return found


def before_collect(found):
    """Strict mode: capture each suspect's reference cycle while it still exists."""
    if STATE.config.leak_mode != "strict":
        return
    from comfy_memx.leaks import holders
    for suspect in found:
        module = suspect.module_ref()
        if module is None:
            continue
        try:
            suspect.cycle = holders.capture_cycle(module, budget_s=STATE.config.leak_budget,
                                                  ignore=_ignored(found))
        except Exception as exc:
            internal_error("leak cycle capture", exc)
        del module


def after_collect(found):
    """Report each suspect once per prompt: ``cycle`` if ComfyUI's collect freed it, else ``rooted``."""
    prompt_id = attribution.current_prompt_id()
    for suspect in found:
        record = suspect.record
        key = (record.model_id, prompt_id)
        leaks = book()
        if key in leaks.reported:
            continue
        leaks.reported.add(key)
        module = suspect.module_ref()
        stage = "cycle" if module is None else "rooted"
        referrers, search, report = [], None, None
        if stage == "rooted":
            leaks.rooted_leaks.add(record.model_id)
            if STATE.config.leak_mode == "strict":
                report = _search_holders(module, found, sys._getframe())
                referrers, search = _rooted_referrers(report)
        elif suspect.cycle is not None:
            report = suspect.cycle
            referrers, search = _cycle_referrers(report)
        del module
        if report is not None and STATE.config.leak_graph:
            _write_graph(record, stage, report)
        record.leak = {"stage": stage, "prompt_id": prompt_id, "time": round(time.time(), 6)}
        _log(record, stage, referrers, search)
        STATE.events.emit("leak", model=record.model, model_id=record.model_id, owner=record.owner._asdict(),
                            stage=stage, referrers=referrers, search=search)


def _ignored(found):
    return [found, *STATE.ledger.containers()]


def _search_holders(module, found, reporting_frame):
    from comfy_memx.leaks import holders
    return holders.find_holders(module, budget_s=STATE.config.leak_budget, ignore=_ignored(found),
                                ignore_frames_up_to=reporting_frame)


def _search_summary(report):
    return {"seconds": round(report.seconds, 4), "objects_visited": report.objects_visited,
            "complete": report.complete}


def _rooted_referrers(report):
    return ([{"path": c.path, "package": c.package, "root_kind": c.root_kind} for c in report.chains],
            _search_summary(report))


def _cycle_referrers(cycle):
    return [{"path": cycle.text, "package": None, "root_kind": "cycle"}], _search_summary(cycle)


def _write_graph(record, stage, report):
    """COMFY_MEMX_LEAK_GRAPH: one Graphviz file per leak, and a PNG when a ``dot`` binary exists."""
    import os
    import shutil
    import subprocess
    from comfy_memx.leaks import holders
    try:
        os.makedirs(STATE.config.leak_graph, exist_ok=True)
        base = os.path.join(STATE.config.leak_graph, f"{record.model_id.replace('#', '-')}-{stage}-{os.getpid()}")
        with open(base + ".dot", "w", encoding="utf-8") as f:
            f.write(holders.to_dot(report))
        dot = shutil.which("dot")
        if dot:
            subprocess.run([dot, "-Tpng", "-o", base + ".png", base + ".dot"], timeout=20, check=False,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("comfy_memx: cannot write the leak graph to %s (%s)", STATE.config.leak_graph, exc)


def _log(record, stage, referrers, search):
    who = f"{record.model} ({record.model_id}), loaded by {record.owner.describe()}"
    if stage == "cycle":
        log.info("comfy_memx: %s was held only by a reference cycle; ComfyUI's garbage collection freed it", who)
        for ref in referrers:
            log.info("comfy_memx:   cycle: %s", ref["path"])
        return
    if STATE.config.leak_mode != "strict":
        log.warning("comfy_memx: leaked model %s; run with COMFY_MEMX_LEAK_MODE=strict to name what holds it", who)
        return
    log.warning("comfy_memx: leaked model %s is held by %d reference chain(s)%s", who, len(referrers),
                "" if not search or search["complete"] else " (search incomplete: budget or depth ran out)")
    for ref in referrers:
        log.warning("comfy_memx:   %s  [package %s, %s]", ref["path"], ref["package"], ref["root_kind"])
    if not referrers:
        log.warning("comfy_memx:   no holder reachable by the garbage collector: it is held from C code or by an "
                    "object the search skips")

