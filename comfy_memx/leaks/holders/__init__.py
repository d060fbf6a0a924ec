"""Strict leak mode's engine: name who keeps a leaked model alive, as reference chains from roots.

# COMFY: ``comfy.model_management.cleanup_models_gc`` (0.3.64 :704, 0.27.0 :962) finds a ``LoadedModel`` whose
ModelPatcher is gone while its torch module is alive.  It logs INFO "Potential memory leak detected ... doing a
full garbage collect" and runs ``gc.collect()``; a module still alive afterwards gets the WARNING "memory
leak with model ...".  The two stages need different evidence:

* before the collect, :func:`capture_cycle` records the reference cycle that holds the module (the collect
  destroys it); if the collect then frees the module, that is the report (stage ``cycle``);
* after the collect, :func:`find_holders` names the roots that keep the module alive (module globals, class
  attributes, live threads' local variables, objects only C code holds) and writes each chain as an access
  path with the custom-node package that owns the root (stage ``rooted``).  It first probes *forward* from the
  suspects, the custom-node packages and ComfyUI's long-lived objects (:mod:`~comfy_memx.leaks.holders.probe`,
  no heap scan); the backward search from the module runs only for the holders the probe could not name (seeded
  with what the probe found), or from scratch when the probe did not reach the module.  Each chain says which
  stage found it (``HolderChain.stage``), and ``HolderReport.stages`` has the figures of both.

:func:`investigate` runs both around a collect.  The search is bounded by time and depth, runs
``gc.get_referrers`` once per level (never ``gc.collect``), holds models only while it runs, and never calls a
holder's ``__getattr__``, ``__eq__`` or ``__repr__`` (only ``repr`` of dict keys, contained by
:func:`safe_repr`).  torch and ComfyUI are never imported.

Example::

    >>> report = find_holders(model)                      # doctest: +SKIP
    >>> print(report)                                      # doctest: +SKIP
    torch.nn.modules.linear.Linear is held by 1 chain(s); search complete, 9 objects, 4 heap scans, 310 ms
      [some_pack] some_pack.model.QwenImageModel._cache['qwen_2512.safetensors_1024']  (class_attribute)

.. versionadded:: 0.1
"""

import sys
import time
import traceback
import types

from comfy_memx.core.errors import MemxError, internal_error
from comfy_memx.leaks.holders.budget import Budget
from comfy_memx.leaks.holders.containers import is_mapping_class, torch_kinds
from comfy_memx.leaks.holders.cycles import describe_cycle, find_cycle
from comfy_memx.leaks.holders.labels import (attr_text, class_module, describe, dict_keys_of, function_name,
                                       render_labels, safe_repr, type_name)
from comfy_memx.leaks.holders.packages import (custom_node_package_of_module, display_module_name, module_namespace,
                                               package_of)
from comfy_memx.leaks.holders.probe import STAGE_BACKWARD, STAGE_PROBE, GraphChanged, Probe, core_watch_types
from comfy_memx.leaks.holders.reports import (NOT_SEEN, RESULT_FOUND, RESULT_INCOMPLETE, RESULT_NOT_FOUND,
                                              CycleReport, HolderChain, HolderReport, to_dot)
from comfy_memx.leaks.holders.steps import chain_steps
from comfy_memx.leaks.holders.search import (ROOT_C_REGISTRY, ROOT_CLASS_ATTRIBUTE, ROOT_MODULE_GLOBAL,
                                       ROOT_THREAD_FRAME, Search, ThreadLocals, _module_dicts, frames_to_skip)

__all__ = [
    "find_holders", "capture_cycle", "investigate", "safe_repr", "package_of", "to_dot",
    "HolderReport", "HolderChain", "CycleReport",
    "ROOT_MODULE_GLOBAL", "ROOT_CLASS_ATTRIBUTE", "ROOT_THREAD_FRAME", "ROOT_C_REGISTRY",
    "RESULT_FOUND", "RESULT_NOT_FOUND", "RESULT_INCOMPLETE", "NOT_SEEN",
]

DEFAULT_BUDGET_S = 2.0
DEFAULT_MAX_DEPTH = 20
DEFAULT_MAX_CHAINS = 10
DEFAULT_PROBE_BUDGET_S = 0.5  # CPU seconds of the probe's own, never more than the search's budget

_NO_HOLDER_NOTE = ("no gc-visible holder: the target is referenced only by the skipped calling frames, by "
                   "ignored objects, or from C code")


def find_holders(target, *, budget_s=DEFAULT_BUDGET_S, max_depth=DEFAULT_MAX_DEPTH,
                 max_chains=DEFAULT_MAX_CHAINS, ignore=(), comfy_root=None, ignore_frames_up_to=1, probe=True,
                 probe_budget_s=None, first_path=False, backward=True):
    """Find the reference chains that keep ``target`` alive, each from a root, shortest first.

    ``budget_s`` bounds the CPU time of the calling thread that the search may use, with a wall-clock safety cap
    (:mod:`~comfy_memx.leaks.holders.budget`), so that the answer does not depend on how busy the machine is; a
    search that runs out reports what it found with ``complete=False``.  ``max_depth`` bounds the number of
    references per chain and ``max_chains`` the number of chains.  ``ignore`` lists objects whose references
    do not count (comfy_memx's ledger containers, say); they are compared by identity and not kept.
    ``comfy_root`` is ComfyUI's directory for the ``core`` package (default: guessed, see
    :func:`~comfy_memx.leaks.holders.packages.default_comfy_root`).

    ``ignore_frames_up_to`` says which frames of the calling thread are not roots: a number of caller frames
    (default 1: the direct caller, which holds ``target`` to pass it in) or a frame object (every frame from
    this call out to that one).  Frames further out are searched like other threads' frames, because a real
    holder can sit there (a prompt worker's local variable); so the caller should hold only the target.
    comfy_memx's own frames, on any thread, are never holders.

    ``probe`` (default True) runs the forward probe first (see :mod:`comfy_memx.leaks.holders.probe`) with a CPU
    budget of its own, ``probe_budget_s`` (default :data:`DEFAULT_PROBE_BUDGET_S`, never more than ``budget_s``);
    ``probe=False`` is the backward search alone.  ``first_path`` stops the probe at the first (shortest) path to
    the target and, when it found one, skips the backward search (``stopped_by="first_path"``): the cheap answer
    to "who holds it" that a prompt can afford.  ``backward=False`` runs the probe alone (``stopped_by="probe_only"``
    when it found nothing).  The chains are the same either way; each says which stage found it.

    Returns a :class:`HolderReport`; ``result`` says whether a holder was found, not found after a complete
    search, or not found by an incomplete one.  The search keeps no reference to anything it visited.

    Example::

        >>> find_holders(model).chains[0].path              # doctest: +SKIP
        "some_pack.HOOKS['preview'].__self__"

    .. versionadded:: 0.1
    .. versionchanged:: 0.2 the forward probe (``probe``, ``probe_budget_s``; ``HolderChain.stage``).
    .. versionchanged:: 0.3 CPU-time budgets, ``first_path``, ``backward``, ``HolderReport.result``.
    """
    skipped = frames_to_skip(sys._getframe(), ignore_frames_up_to)
    if not probe:
        probe_budget_s = 0.0
    elif probe_budget_s is None:
        probe_budget_s = DEFAULT_PROBE_BUDGET_S
    options = _Options(max_depth, max_chains, ignore, comfy_root, first_path, backward)
    return _find_holders(target, skipped, budget_s, probe_budget_s, options)


class _Options:
    __slots__ = ("max_depth", "max_chains", "ignore", "comfy_root", "first_path", "backward")

    def __init__(self, max_depth, max_chains, ignore, comfy_root, first_path=False, backward=True):
        self.max_depth, self.max_chains, self.ignore, self.comfy_root = max_depth, max_chains, ignore, comfy_root
        self.first_path, self.backward = bool(first_path), bool(backward)


def capture_cycle(target, *, budget_s=DEFAULT_BUDGET_S, max_depth=DEFAULT_MAX_DEPTH, ignore=(), comfy_root=None,
                  ignore_frames_up_to=1):
    """Record the reference cycle that holds ``target``, before a full collect destroys it.

    Walks back from ``target`` through every holder (stopping at roots, within ``budget_s`` and
    ``max_depth``), finds the strongly connected group of holders nearest to the target, and describes its
    shortest cycle and the path from it to the target.  Arguments are as for :func:`find_holders`.  If roots
    hold the target as well, their chains are listed in ``CycleReport.chains``.

    Example::

        >>> capture_cycle(model).text                       # doctest: +SKIP
        "some_pack.Node#1 --.peer--> some_pack.Node#2 --.peer--> some_pack.Node#1 (cycle); ..."

    .. versionadded:: 0.1
    """
    skipped = frames_to_skip(sys._getframe(), ignore_frames_up_to)
    return _capture_cycle(target, skipped, budget_s, max_depth, ignore, comfy_root)


def investigate(target_refs, collect, *, budget_s=DEFAULT_BUDGET_S, max_depth=DEFAULT_MAX_DEPTH,
                max_chains=DEFAULT_MAX_CHAINS, ignore=(), comfy_root=None, ignore_frames_up_to=1):
    """Run the two leak stages around ``collect()`` for targets given by weak reference.

    For each live ``weakref.ref`` in ``target_refs`` a :func:`capture_cycle` runs first; then ``collect()``
    runs once (ComfyUI's original ``cleanup_models_gc``, or ``gc.collect``); then each target that the
    collect freed yields its :class:`CycleReport` (``collected=True``, stage ``cycle``) and each survivor a
    fresh :func:`find_holders` report (stage ``rooted``).  No strong reference to a target is held while
    ``collect()`` runs.  ``budget_s`` applies to each search.

    Returns the reports in the order of ``target_refs`` (dead references are skipped).

    .. versionadded:: 0.1
    """
    skipped = frames_to_skip(sys._getframe(), ignore_frames_up_to)
    options = _Options(max_depth, max_chains, ignore, comfy_root)
    captured = []
    for ref in target_refs:
        target = ref()
        if target is not None:
            captured.append((ref, _capture_cycle(target, skipped, budget_s, max_depth, ignore, comfy_root)))
        del target
    collect()
    reports = []
    for ref, cycle in captured:
        target = ref()
        if target is None:
            cycle.collected = True
            reports.append(cycle)
        else:
            reports.append(_find_holders(target, skipped, budget_s, DEFAULT_PROBE_BUDGET_S, options))
        del target
    return reports


def _ids(objects):
    return {id(obj) for obj in objects}


def _find_holders(target, skipped, budget_s, probe_budget_s, options):
    """The probe, then the backward search for what it left (or from scratch); see the module docstring.

    The target is held by this frame and by :func:`_probe`'s while the probe runs (the two references it is told
    are the search's own, ``held_by_caller=2``) and in the stages' own containers, all emptied before returning.
    A change here that holds the target in one more local, or passes it down one more call, must change that
    number (tests/unit/test_holders.py fails loudly: every probe then falls back to the backward search).  The
    helpers below never see the target, so they add no reference to it and no frame to the searches.
    """
    started = time.perf_counter()
    budget = Budget(budget_s)
    search, prober, chains, target_text = None, None, [], type_name(type(target))
    stages, mode, stopped_by = {}, "full", None
    try:
        ignore_ids = _ids(options.ignore)
        module_dicts = _module_dicts()
        threads = ThreadLocals(skipped, options.comfy_root, core_watch_types() if probe_budget_s > 0 else ())
        if probe_budget_s > 0:
            prober = _probe(target, threads, module_dicts, ignore_ids, options.ignore, options,
                            min(probe_budget_s, max(0.0, float(budget_s))))
            prober, mode, stopped_by = _after_probe(prober, stages, options)
        threads.watched.clear()
        threads.pack_held.clear()
        if mode != "skipped" and not options.backward:
            mode, stopped_by = "skipped", "probe_only"
        elif mode != "skipped":
            mode = "full" if prober is None else "remaining"
            search = _backward_search(budget, options, prober, ignore_ids, skipped, threads, module_dicts)
            if prober is None:
                search.run(target)
            else:
                search.run(target, prober.seeds())
        chains, stopped_by = _merged_chains(prober, search, mode, stopped_by, module_dicts, options)
        target_text = describe(target)
    except Exception as exc:
        _report_internal("holders.find", exc)
        stopped_by = "error"
    finally:
        del target
        if prober is not None:
            prober.release()
        if search is not None:
            search.release()
    return _holder_report(target_text, chains, started, budget, search, stages, mode, stopped_by)


def _after_probe(prober, stages, options):
    """What the probe leaves to do: ``(prober, mode, stopped_by)``, the prober None when it found nothing.

    ``mode`` is ``"skipped"`` when the probe's chains are the answer (it saw every holder, found ``max_chains`` or
    was asked for the first path only) and ``"full"`` when the backward search is still to run.
    """
    if prober is None:
        return None, "full", None
    stages[STAGE_PROBE] = prober.stats()
    if not prober.reached or not prober.entries:
        prober.release()   # nothing to build on: the backward search starts from the target
        return None, "full", None
    if prober.complete or len(prober.entries) >= options.max_chains:
        return prober, "skipped", None
    if options.first_path:
        return prober, "skipped", "first_path"
    return prober, "full", None


def _backward_search(budget, options, prober, ignore_ids, skipped, threads, module_dicts):
    """The backward search for what the probe left (all of it when there was no probe), in the budget left."""
    search = Search(budget_s=budget.sub(budget.left()), max_depth=options.max_depth,
                    max_chains=options.max_chains + (len(prober.entries) if prober is not None else 0),
                    ignore_ids=ignore_ids, skipped_frame_ids=skipped, record_edges=False,
                    comfy_root=options.comfy_root, threads=threads, module_dicts=module_dicts)
    if prober is not None:
        search.own_ids.add(id(prober.seen))
    return search


def _merged_chains(prober, search, mode, stopped_by, module_dicts, options):
    """The probe's chains, then the backward search's new ones, shortest first and at most ``max_chains``.

    Returns ``(chains, stopped_by)``: why the search stopped short, None when it saw every holder."""
    max_chains, chains = options.max_chains, []
    if prober is not None:
        chains = _probe_chains(prober, module_dicts, options.comfy_root)
        if len(prober.entries) >= max_chains and mode == "skipped" and stopped_by is None:
            stopped_by = "max_chains"
        elif prober.dropped_deep and mode == "skipped" and stopped_by is None:
            stopped_by = "depth"
    if search is not None:
        known = {chain.path for chain in chains}
        chains += [chain for chain in _chains(search, options.comfy_root) if chain.path not in known]
        stopped_by = search.stopped_by
    chains.sort(key=lambda chain: chain.depth)
    if len(chains) > max_chains:
        del chains[max_chains:]
        stopped_by = stopped_by or "max_chains"
    return chains, stopped_by


def _holder_report(target_text, chains, started, budget, search, stages, mode, stopped_by):
    """The :class:`HolderReport` of one search, with each stage's figures."""
    backward = {"mode": mode, "chains": sum(chain.stage == STAGE_BACKWARD for chain in chains)}
    if search is not None:
        backward.update(seconds=round(time.perf_counter() - search.started, 6),
                        cpu_seconds=round(search.budget.cpu_spent(), 6), scans=search.scans,
                        objects_visited=len(search.level), stopped_by=search.stopped_by)
    stages[STAGE_BACKWARD] = backward
    if STAGE_PROBE in stages:
        stages[STAGE_PROBE]["chains"] = sum(chain.stage == STAGE_PROBE for chain in chains)
    visited = stages.get(STAGE_PROBE, {}).get("objects_visited", 0) + backward.get("objects_visited", 0)
    complete = stopped_by is None
    return HolderReport(
        target=target_text, chains=chains, seconds=time.perf_counter() - started, objects_visited=visited,
        scans=backward.get("scans", 0), complete=complete, stopped_by=stopped_by,
        note="" if chains or not complete else _NO_HOLDER_NOTE, stages=stages, cpu_seconds=budget.cpu_spent())


def _probe(target, threads, module_dicts, ignore_ids, ignore, options, budget_s):
    """Run the forward probe; ``None`` when it failed (a bug of ours, or the graph changed under it)."""
    prober = Probe(threads=threads, module_dicts=module_dicts, ignore_ids=ignore_ids, max_depth=options.max_depth)
    try:
        # While it runs, the target is held by this frame's argument and by _find_holders's.
        prober.run(target, budget_s=budget_s, ignore=ignore, held_by_caller=2, first_path=options.first_path)
    except GraphChanged:
        prober.release()
        return None
    except Exception as exc:
        prober.release()
        _report_internal("holders.probe", exc)
        return None
    finally:
        del target
    return prober


def _probe_chains(prober, module_dicts, comfy_root):
    """Label the probe's chains exactly as :func:`_chains` labels the backward search's."""
    chains, paths = [], set()
    for depth, kind, root_id, start_id, prefix, package in prober.entries:
        objs = prober.objects(prober.chain_ids(root_id, start_id))
        try:
            shape, steps = _shape(objs, comfy_root), chain_steps(objs, kind, root_id, module_dicts)
            for path, owner in _paths(module_dicts, kind, root_id, objs, prefix, package, comfy_root):
                if path not in paths:
                    paths.add(path)
                    chains.append(HolderChain(path=path, package=owner or "?", root_kind=kind, depth=depth,
                                              stage=STAGE_PROBE, kinds=shape[0], inner_package=shape[1],
                                              steps=steps, mappings=shape[2]))
        except Exception as exc:
            _report_internal("holders.label", exc)
        finally:
            objs.clear()
    return chains


def _capture_cycle(target, skipped, budget_s, max_depth, ignore, comfy_root):
    started = time.perf_counter()
    search, target_text = None, type_name(type(target))
    members, edges, text, chains = [], [], "", []
    try:
        search = Search(budget_s=budget_s, max_depth=max_depth, max_chains=1 << 30, ignore_ids=_ids(ignore),
                        skipped_frame_ids=skipped, record_edges=True, comfy_root=comfy_root)
        search.run(target)
        target_text = describe(target)
        found = find_cycle(search)
        if found is None:
            text = f"no reference cycle among the {len(search.seen) - 1} objects that reach the target"
        else:
            members, edges, text = describe_cycle(search, *found)
        chains = _chains(search, comfy_root)
    except Exception as exc:
        _report_internal("holders.cycle", exc)
        if search is not None:
            search.stopped_by = "error"
    finally:
        del target
        if search is not None:
            search.release()
    if search is None:
        return CycleReport(target=target_text, members=[], edges=[], text="capture failed", ancestors=0,
                           seconds=time.perf_counter() - started, objects_visited=0, scans=0, complete=False,
                           stopped_by="error")
    return CycleReport(
        target=target_text, members=members, edges=edges, text=text, ancestors=len(search.level) - 1,
        seconds=time.perf_counter() - started, objects_visited=len(search.level), scans=search.scans,
        complete=search.complete, stopped_by=search.stopped_by, chains=chains, cpu_seconds=search.budget.cpu_spent())


def _report_internal(kind, exc):
    """Hand a bug of ours to :func:`internal_error` without the traceback's frames (they hold the objects)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    internal_error(kind, MemxError(f"{kind} failed:\n{text}"))


def _chains(search, comfy_root):
    """Label every root the search recorded, shortest first, without duplicates."""
    chains, paths = [], set()
    for kind, root_id, start_id, prefix, package in search.roots:
        objs = search.chain_objects(root_id, start_id)
        try:
            shape, steps = _shape(objs, comfy_root), chain_steps(objs, kind, root_id, search.module_dicts)
            for path, owner in _paths(search.module_dicts, kind, root_id, objs, prefix, package, comfy_root):
                if path not in paths:
                    paths.add(path)
                    chains.append(HolderChain(path=path, package=owner or "?", root_kind=kind,
                                              depth=len(objs) - 1, stage=STAGE_BACKWARD, kinds=shape[0],
                                              inner_package=shape[1], steps=steps,
                                              mappings=shape[2]))
        except Exception as exc:
            _report_internal("holders.label", exc)
        finally:
            objs.clear()
    return chains


def _shape(objs, comfy_root):
    """``(kinds, inner_package, mappings)`` of a chain's objects (see :class:`HolderChain`), from their types only."""
    kinds = tuple(type_name(type(obj)) for obj in objs)
    inner = None
    for obj in reversed(objs[:-1]):
        module = class_module(type(obj))
        inner = custom_node_package_of_module(module) if module not in ("?", "builtins") else None
        if inner is not None:
            break
    torch_module = torch_kinds()[0]
    mappings = tuple(sorted({kind for kind, obj in zip(kinds, objs[:-1])
                             if is_mapping_class(type(obj), torch_module)}))
    return kinds, inner, mappings


def _paths(module_dicts, kind, root_id, objs, prefix, package, comfy_root):
    """The access path(s) of one chain (one per key when a module holds the object under several names)."""
    first = objs[0]
    if kind == ROOT_THREAD_FRAME:
        return [(prefix + render_labels(objs), package)]
    if kind == ROOT_MODULE_GLOBAL:
        name = module_dicts.get(root_id)
        if name is None:
            name = module_namespace(first).get("__name__")
            return [(display_module_name(name) + render_labels(objs), package_of(first, comfy_root))]
        package = package_of(sys.modules.get(name) or name, comfy_root)
        rest = render_labels(objs[1:])
        heads = [attr_text(key) for key in dict_keys_of(first, objs[1])] or [" -> (module global)"]
        return [(display_module_name(name) + head + rest, package) for head in heads]
    if kind == ROOT_CLASS_ATTRIBUTE:
        module = class_module(first)
        return [(type_name(first) + render_labels(objs), package_of(sys.modules.get(module) or module, comfy_root))]
    if type(first) is types.FunctionType:
        module = first.__globals__.get("__name__")
        head = function_name(first)
    else:
        module = class_module(type(first))
        head = f"<C-held {describe(first)}>"
    return [(head + render_labels(objs), package_of(sys.modules.get(module) or module or "?", comfy_root))]
