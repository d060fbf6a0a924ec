"""The forward probe: look for the leaked model from the suspects first, before scanning the heap.

The leaks users meet are almost always rooted in a custom-node package (a class-level cache, a module-level registry,
a closure kept by a hook), and those roots are known before any search: the modules loaded from ``custom_nodes``
directories.  The probe walks *forward* from them with ``gc.get_referents`` (breadth first, a visited set, a small
time budget), then from ComfyUI's long-lived objects (:data:`CORE_CLASSES`, :data:`CORE_GLOBALS`, the executor in
its worker thread's frame).  It costs what the packages own, not what the heap holds.

The walk follows the graph the backward search climbs, with the same boundaries: a module ``__dict__`` or a class
is a root and is never walked through (a class defined in a custom-node package becomes a root of its own, any
other class or module is not entered); objects the search ignores, frames running on a thread, tensors and their
storages, and comfy_memx's own objects and functions are not entered either.  Only gc-tracked referents are
followed (an untracked object cannot be a referrer the backward search would see).

When the target was reached, :meth:`Probe.settle` rebuilds what the backward search would have found in the part
of the graph the probe walked: each object's distance to the target (a breadth-first pass over the recorded
references, backwards from the target), every ``(root, first object)`` pair and every thread-frame root of those
objects, and for each the chain that follows, at every step, the first referent one step closer to the target,
which is how the backward search's ``child`` links run.  Every reference of every chain is then checked again with
``gc.get_referents`` (a chain is a real reference path or it is not reported).

Whether the backward search is still needed is decided by counting references, not by scanning.  For every object
connected to the target, ``sys.getrefcount`` minus the probe's own references is compared with the references the
probe can name: those it recorded from objects it expanded, the local variables of live frames
(:attr:`~comfy_memx.leaks.holders.search.ThreadLocals.direct`) and the objects the caller asked to ignore.  An
object with more references than that has a holder the probe did not see (an object outside the packages, a
reference from C code, a value on an interpreter stack); the backward search is then seeded with the connected
objects and climbs only from those (:meth:`Probe.seeds`).  When every reference is named, the chains are all the
backward search could report and no heap scan runs.  Unnamed references only ever cost a scan, never a missed
holder; where the interpreter counts differently (:func:`refcount_calibrated`: CPython 3.10) every connected
object is searched backwards as well.

Nothing found is kept after :meth:`Probe.release`; the probe never calls a holder's own code (``type()``, ``id()``,
``gc.get_referents`` and ``type``'s own descriptors only).
"""

import collections
import gc
import itertools
import operator
import sys
import time
import types

from comfy_memx.core.errors import MemxError
from comfy_memx.leaks.holders.budget import Budget
from comfy_memx.leaks.holders.labels import _TYPE_MRO, class_module
from comfy_memx.leaks.holders.packages import custom_node_modules, module_namespace
from comfy_memx.leaks.holders.search import ROOT_CLASS_ATTRIBUTE, ROOT_MODULE_GLOBAL, ROOT_THREAD_FRAME

STAGE_PROBE = "probe"
STAGE_BACKWARD = "backward"
PHASE_PACKAGES = "packages"
PHASE_CORE = "core"

#: ComfyUI classes probed after the packages, as (module, class): the whole class (``PromptServer.instance``).
CORE_CLASSES = (("server", "PromptServer"),)
#: ComfyUI module globals probed after the packages, as (module, global): only these entries of the module.
CORE_GLOBALS = (
    ("comfy.model_management", "current_loaded_models"),
    ("comfy_execution.progress", "global_progress_registry"),
)
#: Classes whose instances are probed when a live thread's frame holds one (ComfyUI's prompt worker holds the
#: executor and its output caches only in a local variable of ``main.prompt_worker``).
CORE_THREAD_LOCALS = (("execution", "PromptExecutor"),)

_WALK, _SKIP, _CLASS, _FUNCTION = "walk", "skip", "class", "function"
# Referents of one object looked at one by one (a wider container is searched for the target at C speed, and its
# other referents are left to the backward search: their references stay unnamed, which only costs a scan).
_WIDE = 10_000
_OWN_MODULE = __name__.split(".", 1)[0]
_CHECK_EVERY = 256       # objects expanded between two reads of the (CPU-time) clock
MAX_EXPANDED = 400_000   # objects one probe may expand, whatever its time allows


def _refs_outside(seen, obj_id):
    """References to ``seen[obj_id]`` other than ``seen``'s own (the argument on the stack is taken off)."""
    return sys.getrefcount(seen[obj_id]) - 2


def _refs_in_callee(obj):
    return sys.getrefcount(obj)


def refcount_calibrated():
    """True when reference counts can name every holder on this interpreter (checked on a fresh list).

    :func:`_refs_outside` must count as the probe expects, and a call of a Python function must move its
    arguments into the callee's frame (CPython >= 3.11).  CPython 3.10 leaves a reference on the caller's value
    stack for every argument passed down, which no frame reading sees: there every object the probe connected to
    the target is searched backwards as well (the chains are the same, the heap scans are not saved).
    """
    sample = []
    seen = {id(sample): sample}
    try:
        # in the callee: seen's reference, this local, the callee's argument, getrefcount's argument
        return _refs_outside(seen, id(sample)) == 1 and _refs_in_callee(sample) == 4
    finally:
        seen.clear()


def _holds(holder, child):
    """Whether ``holder`` references ``child`` right now (identity, through the gc's view of ``holder``)."""
    return any(map(operator.is_, gc.get_referents(holder), itertools.repeat(child)))


def _leaf_type_ids():
    """Ids of the base classes whose instances are never entered: torch tensors and storages (if torch is loaded)."""
    torch = sys.modules.get("torch")
    if not isinstance(torch, types.ModuleType):
        return set()
    names = module_namespace(torch)
    bases = [names.get("UntypedStorage"), names.get("TypedStorage")]
    c_module = names.get("_C")
    if isinstance(c_module, types.ModuleType):
        c_names = module_namespace(c_module)
        bases += [c_names.get("TensorBase"), c_names.get("_TensorBase")]
    return {id(base) for base in bases if issubclass(type(base), type)}


def _module_attribute(module_name, name):
    module = sys.modules.get(module_name)
    if not isinstance(module, types.ModuleType):
        return None, None
    namespace = module_namespace(module)
    try:
        return namespace, dict.get(namespace, name)
    except TypeError:
        return namespace, None


def core_watch_types():
    """The classes of :data:`CORE_THREAD_LOCALS` that are loaded (for ``ThreadLocals(watch_types=...)``)."""
    found = []
    for module_name, name in CORE_THREAD_LOCALS:
        _, cls = _module_attribute(module_name, name)
        if issubclass(type(cls), type):
            found.append(cls)
    return tuple(found)


class GraphChanged(MemxError):
    """A reference the probe recorded is gone (another thread changed the graph): its chains are not reported."""


class Probe:
    """One bounded forward walk towards ``target``; see the module docstring.

    ``seen`` maps the id of every object met to the object (kept alive so that ids stay unique while the probe
    runs), ``out`` the id of every expanded object to the ids of its gc-tracked referents in ``gc.get_referents``
    order (repeats kept), ``parents`` the id of every object met to the ids of the expanded objects that reference
    it (once per reference).  ``roots`` maps root ids to their kind.  After :meth:`settle`: ``dist`` (distance to
    the target of every object connected to it), ``entries`` (the chains, as ids) and ``unexplained`` (ids of the
    connected objects with a holder the probe did not see).
    """

    __slots__ = ("seen", "out", "parents", "roots", "queue", "dist", "order", "at_dist", "entries", "unexplained",
                 "target_id", "threads", "module_dicts", "skip_ids", "max_depth", "verdicts", "leaf_type_ids",
                 "own_dict_ids", "root_modules", "phases_run", "stopped_by", "seconds", "calibrated",
                 "ignored_refs", "dropped_deep", "held_by_caller", "cpu_seconds")

    def __init__(self, *, threads, module_dicts, ignore_ids, max_depth):
        self.seen = {}
        self.out = {}
        self.parents = {}
        self.roots = {}
        self.queue = collections.deque()
        self.dist = {}
        self.order = []
        self.at_dist = {}
        self.entries = []
        self.unexplained = []
        self.target_id = None
        self.threads = threads
        self.module_dicts = module_dicts
        self.max_depth = int(max_depth)
        self.verdicts = {}
        self.leaf_type_ids = _leaf_type_ids()
        self.own_dict_ids = {dict_id for dict_id, name in module_dicts.items()
                             if name == _OWN_MODULE or name.startswith(_OWN_MODULE + ".")}
        self.root_modules = set()
        self.phases_run = []
        self.stopped_by = None
        self.seconds = 0.0
        self.cpu_seconds = 0.0
        self.calibrated = refcount_calibrated()
        self.ignored_refs = {}
        self.dropped_deep = False
        self.held_by_caller = 0
        self.skip_ids = set(ignore_ids) | threads.frame_ids | threads.snapshot_ids
        self.skip_ids.update(map(id, (self, self.seen, self.out, self.parents, self.roots, self.queue)))

    @property
    def reached(self):
        """True when the walk met the target, or a live thread's frame holds it in a local variable."""
        return self.target_id in self.parents or self.target_id in self.threads.by_object

    @property
    def complete(self):
        """True when the chains found are all the backward search could report (no heap scan is needed)."""
        return self.reached and bool(self.entries) and not self.unexplained and self.calibrated

    # -- the walk ------------------------------------------------------------------------------------------------

    def run(self, target, *, budget_s, ignore=(), held_by_caller=0, phases=(PHASE_PACKAGES, PHASE_CORE),
            first_path=False, max_expanded=MAX_EXPANDED):
        """Walk from the package modules, then from ComfyUI's long-lived objects, until the target's holders are
        all named (or, with ``first_path``, until the first path to it is found), the walk is exhausted or the
        budget is spent; then :meth:`settle` what was found.

        ``budget_s`` is CPU time of this thread (:class:`~comfy_memx.leaks.holders.budget.Budget`); it starts
        after the first phase's set-up (the walk of ``sys.modules`` that finds the packages), so that a slow
        set-up never leaves the walk itself with nothing.  ``max_expanded`` bounds the objects expanded, a
        measure of work that does not depend on the machine's load at all.

        ``held_by_caller`` is the number of references to ``target`` that the search's own frames hold while this
        runs (arguments of the functions between the public entry point and here, this one's not counted): they
        are not holders, and no frame reading sees them.
        """
        started = time.perf_counter()
        self.held_by_caller = int(held_by_caller)
        self.target_id = id(target)
        self.seen[self.target_id] = target
        del target
        budget = None
        try:
            for phase in phases:
                if budget is not None and budget.stop_reason():
                    self.stopped_by = budget.stop_reason()
                    break
                self.phases_run.append(phase)
                if phase == PHASE_PACKAGES:
                    self._add_package_roots()
                else:
                    self._add_core_sources()
                if budget is None:
                    budget = Budget(budget_s)
                if not (first_path and self.reached):
                    self._walk(budget, first_path, max_expanded)
                if self.reached:
                    self.settle(ignore)
                    if first_path or self.complete or self.stopped_by:
                        break
        finally:
            self.queue.clear()
            self.seconds = time.perf_counter() - started
            self.cpu_seconds = budget.cpu_spent() if budget is not None else 0.0

    def _add_root(self, obj, kind, only=None):
        obj_id = id(obj)
        if obj_id in self.out or obj_id in self.roots or obj_id in self.skip_ids:
            return
        self.seen[obj_id] = obj
        self.roots[obj_id] = kind
        self.queue.append((obj, obj_id, 0, only))

    def _add_package_roots(self):
        for name, module, _ in custom_node_modules():
            namespace = module_namespace(module)
            self.root_modules.add(name)
            own_name = namespace.get("__name__")
            if type(own_name) is str:
                self.root_modules.add(own_name)
            if id(namespace) in self.module_dicts:
                self._add_root(namespace, ROOT_MODULE_GLOBAL)
        held = self.threads.pack_held
        for value in held:  # local variables of the packs' own frames (a pack's thread holding a model)
            value_id = id(value)
            if value_id not in self.out and value_id not in self.skip_ids and value_id not in self.seen:
                self.seen[value_id] = value
                self.queue.append((value, value_id, 1, None))
        held.clear()

    def _add_core_sources(self):
        for module_name, name in CORE_CLASSES:
            _, cls = _module_attribute(module_name, name)
            if issubclass(type(cls), type):
                self._add_root(cls, ROOT_CLASS_ATTRIBUTE)
        for module_name, name in CORE_GLOBALS:
            namespace, value = _module_attribute(module_name, name)
            if value is not None and gc.is_tracked(value) and id(namespace) in self.module_dicts:
                self._add_root(namespace, ROOT_MODULE_GLOBAL, only=[value])
        watched = self.threads.watched
        for value in watched:
            value_id = id(value)
            if value_id not in self.out and value_id not in self.skip_ids:
                self.seen[value_id] = value
                self.queue.append((value, value_id, 1, None))
        watched.clear()

    def _walk(self, budget, first_path, max_expanded):
        """Expand queued objects breadth first; sets ``stopped_by`` when the budget or ``max_expanded`` ran out.

        With ``first_path`` the walk ends as soon as an expanded object holds the target: breadth first, that is
        a shortest path from the roots, and nothing beyond it is visited.
        """
        queue, seen, parents, out = self.queue, self.seen, self.parents, self.out
        max_depth, target_id = self.max_depth, self.target_id
        target = seen[target_id]
        is_tracked = gc.is_tracked
        until_check = 0
        while queue:
            if until_check <= 0:
                reason = budget.stop_reason()
                if reason is None and len(out) >= max_expanded:
                    reason = "objects"
                if reason is not None:
                    self.stopped_by = reason
                    break
                until_check = _CHECK_EVERY
            until_check -= 1
            obj, obj_id, level, only = queue.popleft()
            if obj_id in out:
                continue
            refs = list(filter(is_tracked, gc.get_referents(obj) if only is None else only))
            del obj
            wide = len(refs) > _WIDE
            if wide:
                beyond = sum(map(operator.is_, itertools.islice(refs, _WIDE, None), itertools.repeat(target)))
                del refs[_WIDE:]
                ids = list(map(id, refs))
                ids.extend([target_id] * beyond)
            else:
                ids = list(map(id, refs))
            out[obj_id] = ids
            for ref, ref_id in zip(refs, ids):
                holders = parents.get(ref_id)
                if holders is None:
                    parents[ref_id] = [obj_id]
                else:
                    holders.append(obj_id)
                if ref_id in seen:
                    continue
                seen[ref_id] = ref
                verdict = self._verdict(ref, ref_id)
                if verdict is _WALK:
                    if level + 1 < max_depth:
                        queue.append((ref, ref_id, level + 1, None))
                elif verdict is _CLASS:
                    self.roots[ref_id] = ROOT_CLASS_ATTRIBUTE
                    queue.append((ref, ref_id, 0, None))
            if wide and ids[len(refs):]:
                parents.setdefault(target_id, []).extend([obj_id] * (len(ids) - len(refs)))
            refs.clear()
            ref = None
            if first_path and target_id in parents:
                break
        target = None

    def _verdict(self, obj, obj_id):
        """Whether to walk into ``obj``, make it a class root, or leave it alone (by type; no user code runs)."""
        if obj_id == self.target_id or obj_id in self.skip_ids:
            return _SKIP
        cls = type(obj)
        if cls is dict:
            return _SKIP if obj_id in self.module_dicts else _WALK
        cached = self.verdicts.get(id(cls))
        if cached is None:
            cached = self.verdicts[id(cls)] = (cls, self._type_verdict(cls))
        verdict = cached[1]
        if verdict is _CLASS:
            module = class_module(obj)
            return _CLASS if type(module) is str and module in self.root_modules else _SKIP
        if verdict is _FUNCTION:
            namespace = obj.__globals__
            return _SKIP if id(namespace) in self.own_dict_ids else _WALK
        return verdict

    def _type_verdict(self, cls):
        if issubclass(cls, types.ModuleType):
            return _SKIP
        if issubclass(cls, type):
            return _CLASS
        if cls is types.FunctionType:
            return _FUNCTION
        try:
            mro = _TYPE_MRO.__get__(cls)
        except Exception:
            mro = (cls,)
        if self.leaf_type_ids and any(id(base) in self.leaf_type_ids for base in mro):
            return _SKIP
        module = class_module(cls)
        if type(module) is str and (module == _OWN_MODULE or module.startswith(_OWN_MODULE + ".")):
            return _SKIP
        return _WALK

    # -- what the walk found -------------------------------------------------------------------------------------

    def settle(self, ignore=()):
        """Distances to the target, the chains (as ids), each checked reference by reference, and the objects with
        a holder the probe did not see.  Raises :class:`GraphChanged` when a recorded reference is gone."""
        self._distances()
        self._entries()
        self._check_edges()
        self._account(ignore)

    def _distances(self):
        target_id = self.target_id
        dist = {target_id: 0}
        order = [target_id]
        parents, roots, out = self.parents, self.roots, self.out
        for obj_id in order:  # grows while it is read: a breadth-first pass backwards from the target
            below = dist[obj_id] + 1
            for holder_id in parents.get(obj_id, ()):
                if holder_id not in dist and holder_id not in roots and holder_id in out:
                    dist[holder_id] = below
                    order.append(holder_id)
        at_dist = {}
        for obj_id, level in dist.items():
            at_dist.setdefault(level, set()).add(obj_id)
        self.dist, self.order, self.at_dist = dist, order, at_dist

    def _entries(self):
        """``(depth, kind, root_id, start_id, prefix, package)`` for every root pair and thread root, by depth."""
        dist, roots, by_thread = self.dist, self.roots, self.threads.by_object
        entries, pairs = [], set()
        for obj_id in self.order:
            for holder_id in self.parents.get(obj_id, ()):
                if holder_id in roots and (holder_id, obj_id) not in pairs:
                    pairs.add((holder_id, obj_id))
                    entries.append((dist[obj_id] + 1, roots[holder_id], holder_id, obj_id, None, None))
            for prefix, package in by_thread.get(obj_id, ()):
                entries.append((dist[obj_id], ROOT_THREAD_FRAME, None, obj_id, prefix, package))
        entries.sort(key=operator.itemgetter(0))
        kept = [entry for entry in entries if entry[0] <= self.max_depth]
        self.dropped_deep = len(kept) < len(entries)
        self.entries = kept

    def chain_ids(self, root_id, start_id):
        """Ids from the root (if any) through ``start_id`` to the target, each step to the first referent that is
        one step closer (the backward search's ``child`` link)."""
        ids = [] if root_id is None else [root_id]
        ids.append(start_id)
        current = start_id
        while current != self.target_id:
            current = self.next_id(current)
            ids.append(current)
        return ids

    def next_id(self, obj_id):
        """The id the chain from ``obj_id`` continues with (``None`` for the target)."""
        if obj_id == self.target_id:
            return None
        closer = self.at_dist[self.dist[obj_id] - 1]
        ids = self.out[obj_id]
        return next(itertools.compress(ids, map(closer.__contains__, ids)))

    def _check_edges(self):
        checked = set()
        seen = self.seen
        for _, _, root_id, start_id, _, _ in self.entries:
            ids = self.chain_ids(root_id, start_id)
            for pair in zip(ids, ids[1:]):
                if pair not in checked:
                    if not _holds(seen[pair[0]], seen[pair[1]]):
                        raise GraphChanged(f"a recorded reference of {len(ids) - 1} is gone")
                    checked.add(pair)

    def _account(self, ignore):
        """Fill ``unexplained``: connected objects with more references than the probe can name."""
        dist, seen, parents, direct = self.dist, self.seen, self.parents, self.threads.direct
        ignored = self.ignored_refs
        ignored.clear()
        for obj in ignore:
            for ref_id in map(id, gc.get_referents(obj)):
                if ref_id in dist:
                    ignored[ref_id] = ignored.get(ref_id, 0) + 1
        obj = None
        unexplained = []
        for obj_id in self.order:
            named = len(parents.get(obj_id, ())) + direct.get(obj_id, 0) + ignored.get(obj_id, 0)
            outside = _refs_outside(seen, obj_id) - (self.held_by_caller if obj_id == self.target_id else 0)
            if outside > named or not self.calibrated:
                unexplained.append(obj_id)
        self.unexplained = unexplained

    def seeds(self):
        """``(known, resume)`` for :meth:`~comfy_memx.leaks.holders.search.Search.run` (see there)."""
        known = [(self.seen[obj_id], self.dist[obj_id], self.next_id(obj_id))
                 for obj_id in self.order if obj_id != self.target_id]
        resume = [self.seen[obj_id] for obj_id in self.unexplained]
        return known, resume

    def objects(self, ids):
        """The objects of a list of ids (for labelling a chain while the probe still holds them)."""
        return [self.seen[obj_id] for obj_id in ids]

    def stats(self):
        """Plain numbers about the walk, for the report."""
        return {"seconds": round(self.seconds, 6), "cpu_seconds": round(self.cpu_seconds, 6), "objects_visited": len(self.seen), "expanded": len(self.out),
                "roots": len(self.roots), "phases": list(self.phases_run), "reached": self.reached,
                "chains": len(self.entries), "unexplained": len(self.unexplained), "stopped_by": self.stopped_by}

    def release(self):
        """Drop every reference to objects met (the target included)."""
        self.queue.clear()
        self.seen.clear()
        self.threads.watched.clear()
        self.threads.pack_held.clear()
