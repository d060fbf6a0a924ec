"""Strict leak mode's engine: name who keeps a leaked model alive, as reference chains from roots.

# COMFY: ``comfy.model_management.cleanup_models_gc`` (0.3.64 :704, 0.27.0 :962) finds a ``LoadedModel`` whose
ModelPatcher is gone while its torch module is alive.  It logs INFO "Potential memory leak detected ... doing a
full garbage collect" and runs ``gc.collect()``; a module still alive afterwards gets the WARNING "memory
leak with model ...".  The two stages need different evidence:

* before the collect, :func:`capture_cycle` records the reference cycle that holds the module (the collect
  destroys it); if the collect then frees the module, that is the report (stage ``cycle``);
* after the collect, :func:`find_holders` walks from the module back to its roots (module globals, class
  attributes, live threads' local variables, objects only C code holds) and writes each chain as an access
  path with the custom-node package that owns the root (stage ``rooted``).

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
from comfy_memx.leaks.holders.cycles import describe_cycle, find_cycle
from comfy_memx.leaks.holders.labels import (attr_text, class_module, describe, dict_keys_of, function_name,
                                       render_labels, safe_repr, type_name)
from comfy_memx.leaks.holders.packages import display_module_name, module_namespace, package_of
from comfy_memx.leaks.holders.reports import CycleReport, HolderChain, HolderReport, to_dot
from comfy_memx.leaks.holders.search import (ROOT_C_REGISTRY, ROOT_CLASS_ATTRIBUTE, ROOT_MODULE_GLOBAL,
                                       ROOT_THREAD_FRAME, Search, frames_to_skip)

__all__ = [
    "find_holders", "capture_cycle", "investigate", "safe_repr", "package_of", "to_dot",
    "HolderReport", "HolderChain", "CycleReport",
    "ROOT_MODULE_GLOBAL", "ROOT_CLASS_ATTRIBUTE", "ROOT_THREAD_FRAME", "ROOT_C_REGISTRY",
]

DEFAULT_BUDGET_S = 2.0
DEFAULT_MAX_DEPTH = 20
DEFAULT_MAX_CHAINS = 10

_NO_HOLDER_NOTE = ("no gc-visible holder: the target is referenced only by the skipped calling frames, by "
                   "ignored objects, or from C code")


def find_holders(target, *, budget_s=DEFAULT_BUDGET_S, max_depth=DEFAULT_MAX_DEPTH,
                 max_chains=DEFAULT_MAX_CHAINS, ignore=(), comfy_root=None, ignore_frames_up_to=1):
    """Find the reference chains that keep ``target`` alive, each from a root, shortest first.

    ``budget_s`` bounds the time (a search that runs out reports what it found with ``complete=False``;
    it may overrun by the error of its estimate of one heap scan).  ``max_depth`` bounds the number of
    references per chain and ``max_chains`` the number of chains.  ``ignore`` lists objects whose references
    do not count (comfy_memx's ledger containers, say); they are compared by identity and not kept.
    ``comfy_root`` is ComfyUI's directory for the ``core`` package (default: guessed, see
    :func:`~comfy_memx.leaks.holders.packages.default_comfy_root`).

    ``ignore_frames_up_to`` says which frames of the calling thread are not roots: a number of caller frames
    (default 1: the direct caller, which holds ``target`` to pass it in) or a frame object (every frame from
    this call out to that one).  Frames further out are searched like other threads' frames, because a real
    holder can sit there (a prompt worker's local variable); so the caller should hold only the target.

    Returns a :class:`HolderReport`; the search keeps no reference to anything it visited.

    Example::

        >>> find_holders(model).chains[0].path              # doctest: +SKIP
        "some_pack.HOOKS['preview'].__self__"

    .. versionadded:: 0.1
    """
    skipped = frames_to_skip(sys._getframe(), ignore_frames_up_to)
    return _find_holders(target, skipped, budget_s, max_depth, max_chains, ignore, comfy_root)


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
            reports.append(_find_holders(target, skipped, budget_s, max_depth, max_chains, ignore, comfy_root))
        del target
    return reports


def _ids(objects):
    return {id(obj) for obj in objects}


def _find_holders(target, skipped, budget_s, max_depth, max_chains, ignore, comfy_root):
    started = time.perf_counter()
    search, chains, target_text = None, [], type_name(type(target))
    try:
        search = Search(budget_s=budget_s, max_depth=max_depth, max_chains=max_chains, ignore_ids=_ids(ignore),
                        skipped_frame_ids=skipped, record_edges=False, comfy_root=comfy_root)
        search.run(target)
        chains = _chains(search, comfy_root)
        target_text = describe(target)
    except Exception as exc:
        _report_internal("holders.find", exc)
        if search is not None:
            search.stopped_by = "error"
    finally:
        del target
        if search is not None:
            search.release()
    if search is None:
        return HolderReport(target=target_text, chains=[], seconds=time.perf_counter() - started,
                            objects_visited=0, scans=0, complete=False, stopped_by="error")
    return HolderReport(
        target=target_text, chains=chains, seconds=time.perf_counter() - started,
        objects_visited=len(search.level), scans=search.scans, complete=search.complete,
        stopped_by=search.stopped_by, note="" if chains or not search.complete else _NO_HOLDER_NOTE)


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
        complete=search.complete, stopped_by=search.stopped_by, chains=chains)


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
            for path, owner in _paths(search, kind, root_id, objs, prefix, package, comfy_root):
                if path not in paths:
                    paths.add(path)
                    chains.append(HolderChain(path=path, package=owner or "?", root_kind=kind,
                                              depth=len(objs) - 1))
        except Exception as exc:
            _report_internal("holders.label", exc)
        finally:
            objs.clear()
    return chains


def _paths(search, kind, root_id, objs, prefix, package, comfy_root):
    """The access path(s) of one chain (one per key when a module holds the object under several names)."""
    first = objs[0]
    if kind == ROOT_THREAD_FRAME:
        return [(prefix + render_labels(objs), package)]
    if kind == ROOT_MODULE_GLOBAL:
        name = search.module_dicts.get(root_id)
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
