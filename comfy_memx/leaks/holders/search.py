"""The level-batched backward search: from one object to the roots that keep it alive.

Each level costs one ``gc.get_referrers(*frontier)`` call, i.e. one pass over the GC-tracked heap, instead of
one pass per object (objgraph) or a Python reverse index of the whole heap (seconds and hundreds of MB).
``gc.get_referrers`` compares every reference it visits against every object it was given (measured: one scan
of a 1e6-object heap for 1000 objects costs about 50 single scans), so a level too wide for half the time left
is scanned in part; the rest waits in a backlog until the search has climbed from that part.  A frontier object
that only module globals (and live frames' local variables) hold is not scanned: its roots are named by counting
its references (:mod:`comfy_memx.leaks.holders.module_globals`), which saves the last scan below a module global.

The search keeps every object it met alive (``Search.seen``) so that ``id()`` values stay unique while it
runs; :meth:`Search.release` drops them all, and the public functions always call it.  No container of ours
that holds a found object may exist while ``gc.get_referrers`` runs, except the ones whose ids are in
``Search.own_ids`` (the ``seen`` dict, the frontier lists and backlog, the search itself); everything else
the search records is ids and strings.

After a forward probe (:mod:`comfy_memx.leaks.holders.probe`) that reached the target, the search can be *seeded*
(:meth:`Search.run` with ``seeds``): the objects the probe already connected to the target are known, with their
level and the reference that leads on, and the search climbs only from those that still have a holder the probe
did not see.
"""

import gc
import sys
import threading
import time
import types

from comfy_memx.leaks.holders.budget import STOP_BUDGET, Budget
from comfy_memx.leaks.holders.module_globals import COUNTS_AS_EXPECTED, ModuleGlobals, refs_beyond_search
from comfy_memx.leaks.holders.packages import (custom_node_dirs, custom_node_package_of_file, display_module_name,
                                               module_namespace, package_of)

ROOT_MODULE_GLOBAL = "module_global"
ROOT_CLASS_ATTRIBUTE = "class_attribute"
ROOT_THREAD_FRAME = "thread_frame"
ROOT_C_REGISTRY = "c_registry"

_CO_OPTIMIZED = 0x1  # inspect.CO_OPTIMIZED: a function frame; module and class bodies use a real namespace dict
# inspect.CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR: the frame's locals belong to a
# generator object, whose gc traversal shows them as well (they must not be counted twice).
_CO_OWNED_BY_GENERATOR = 0x20 | 0x80 | 0x100 | 0x200
_SIMPLE = frozenset({str, int, float, bool, bytes, complex, type(None)})
_FIRST_PER_ITEM = 0.06  # extra cost of one more object in a get_referrers call, in single scans


def frames_to_skip(here, up_to):
    """Ids of the calling thread's frames from ``here`` (the public entry point) outwards to ``up_to``.

    ``up_to`` is a number of caller frames (0: only ``here``; 1: ``here`` and its caller) or a frame object on
    the stack; a frame that is not on the stack skips only ``here``.
    """
    frames = []
    frame = here
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    if isinstance(up_to, types.FrameType):
        stop = next((index for index, frame in enumerate(frames) if frame is up_to), 0)
    else:
        stop = min(max(int(up_to), 0), len(frames) - 1)
    skipped = {id(frame) for frame in frames[:stop + 1]}
    frames.clear()
    return skipped


def _frame_label(thread_name, frame):
    code = frame.f_code
    namespace = frame.f_globals
    module = namespace.get("__name__") if type(namespace) is dict else None
    qualname = getattr(code, "co_qualname", code.co_name)
    return f"thread {thread_name!r} frame {display_module_name(module)}.{qualname}", module


class ThreadLocals:
    """Which objects the function frames of live threads hold in local variables.

    CPython >= 3.11 does not show a running frame's locals to the gc, so ``gc.get_referrers`` never returns the
    frame; the frames are read directly instead.  On the calling thread, the search's own frames are not read,
    the frames in ``skipped_ids`` (the caller's, see ``find_holders(ignore_frames_up_to=...)``) are read only
    to know what they hold (``caller_held``: never reported, and never mistaken for C-held), and the frames
    further out are read like every other thread's frames.  comfy_memx's own frames on every thread (a search or a
    receipt running on another thread, a wrapper of ours around a ComfyUI call) and every frame of a thread of ours
    (named ``comfy_memx...``) are read like the skipped ones: known, never reported, so that no search names
    another search of ours as a holder.

    Reading ``frame.f_locals`` on CPython 3.11/3.12 stores a snapshot dict in the frame that lives until the
    frame returns or its locals are read again (3.13+ returns a view and stores nothing).  On the calling
    thread the snapshot is emptied at once when nothing else holds it: those frames are suspended in the call
    to us, so no tracer can be between its own snapshot read and write-back.  Another thread's frame may be in
    exactly that window under a debugger, so its snapshot is left alone and its id is recorded in
    ``snapshot_ids`` for the search to skip; it keeps that frame's values of the moment alive until that
    frame's locals are read again or it returns.

    ``direct`` counts, per object, the strong references that live frames hold and the gc cannot see: one per
    plain local variable of a frame that is not a generator's (a closure variable is held by its cell, a
    generator's locals by the generator, both visible to the gc), plus one per entry of a snapshot left in place.
    The forward probe uses it to tell whether it has seen every holder of an object.  ``watched`` collects the
    local values whose exact type is in ``watch_types`` (ComfyUI's executor, which lives only in a worker
    thread's frame); ``pack_held`` the local values of frames whose code lives in a custom-node package (a pack's
    own thread holding a model), which the forward probe starts from; whoever reads either must clear it before a
    heap scan.
    """

    def __init__(self, skipped_ids, comfy_root, watch_types=()):
        self.by_object = {}      # id(value) -> [(root prefix, package), ...]
        self.caller_held = set()
        self.snapshot_ids = set()
        self.frame_ids = set()   # every frame on a live thread's stack
        self.direct = {}         # id(value) -> strong references from live frames that the gc does not show
        self.watched = []
        self.pack_held = []
        self._pack_dirs = custom_node_dirs()
        self._watch_ids = {id(cls) for cls in watch_types}
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        me = threading.get_ident()
        frames = sys._current_frames()
        try:
            for ident in list(frames):
                self._read_stack(names.get(ident, f"<thread {ident}>"), frames[ident], ident == me, skipped_ids,
                                 comfy_root)
        finally:
            # The dict holds this very frame: keeping it (or a local bound to it) past return would make a
            # frame -> frame cycle that holds every caller's locals, the target included, until a collect.
            frames.clear()

    def _read_stack(self, thread_name, frame, calling_thread, skipped_ids, comfy_root):
        # On the calling thread every frame inside the first skipped one (the search's own) is not read.
        inside_search = calling_thread
        own_thread = isinstance(thread_name, str) and thread_name.startswith(OWN_THREAD_PREFIX)
        while frame is not None:
            frame_id = id(frame)
            self.frame_ids.add(frame_id)
            if frame.f_code.co_flags & _CO_OPTIMIZED:
                if frame_id in skipped_ids:
                    inside_search = False
                    self._read_frame(thread_name, frame, comfy_root, calling_thread, skipped=True)
                elif not inside_search:
                    self._read_frame(thread_name, frame, comfy_root, calling_thread,
                                     skipped=own_thread or is_own_frame(frame))
            elif frame_id in skipped_ids:
                inside_search = False
            frame = frame.f_back

    def _read_frame(self, thread_name, frame, comfy_root, calling_thread, skipped):
        try:
            local_vars = frame.f_locals
        except Exception:
            return
        try:
            values = list(local_vars.items())
        except Exception:
            values = []
        self._count_direct(frame.f_code, values)
        if skipped:
            self.caller_held.update(id(value) for _, value in values)
        else:
            label, module = _frame_label(thread_name, frame)
            package = None
            in_pack = custom_node_package_of_file(frame.f_code.co_filename, self._pack_dirs) is not None
            for name, value in values:
                if type(value) in _SIMPLE:
                    continue
                if package is None:
                    package = package_of(sys.modules.get(module) or frame.f_code.co_filename, comfy_root)
                self.by_object.setdefault(id(value), []).append((f"{label} local {name!r}", package))
                if self._watch_ids and id(type(value)) in self._watch_ids:
                    self.watched.append(value)
                if in_pack:
                    self.pack_held.append(value)
        if type(local_vars) is dict and sys.version_info < (3, 13):
            # frame slot + our local + getrefcount's argument: nobody else uses this snapshot.
            if calling_thread and sys.getrefcount(local_vars) <= 3:
                local_vars.clear()
            else:
                self.snapshot_ids.add(id(local_vars))
                for _, value in values:  # the snapshot stays and holds one more reference per entry
                    self.direct[id(value)] = self.direct.get(id(value), 0) + 1
        values.clear()

    def _count_direct(self, code, values):
        if code.co_flags & _CO_OWNED_BY_GENERATOR:
            return
        in_cells = frozenset(code.co_cellvars) | frozenset(code.co_freevars)
        for name, value in values:
            if name not in in_cells and type(value) not in _SIMPLE:
                self.direct[id(value)] = self.direct.get(id(value), 0) + 1


OWN_THREAD_PREFIX = "comfy_memx"
_OWN_PACKAGE = __name__.split(".", 1)[0]


def is_own_frame(frame):
    """True for a frame of comfy_memx's own code (a search, a receipt, a wrapper of ours)."""
    namespace = frame.f_globals
    name = namespace.get("__name__") if type(namespace) is dict else None
    return isinstance(name, str) and (name == _OWN_PACKAGE or name.startswith(_OWN_PACKAGE + "."))


def _is_search_frame(obj):
    """A frame of this package (CPython 3.10 shows running frames to the gc; 3.11+ never returns them)."""
    if type(obj) is not types.FrameType:
        return False
    namespace = obj.f_globals
    name = namespace.get("__name__") if type(namespace) is dict else None
    return isinstance(name, str) and name.startswith(__name__.rpartition(".")[0])


def _module_dicts():
    """``{id(module.__dict__): module name}`` for every module in ``sys.modules`` (no module object is kept).

    A module registered under several names (``__main__`` is also ``__mp_main__`` once multiprocessing is
    imported) is named by its own ``__name__``.
    """
    found = {}
    for name, module in list(sys.modules.items()):
        if issubclass(type(module), types.ModuleType):
            namespace = module_namespace(module)
            if id(namespace) not in found or namespace.get("__name__") == name:
                found[id(namespace)] = name
    return found


class Search:
    """One bounded backward search from ``target``; see the module docstring.

    After :meth:`run`: ``roots`` is a list of ``(kind, root_id, start_id, prefix, package)``.  ``root_id`` is
    the root object (a module dict or module, a class) or ``None`` when the root is outside the heap (a
    thread's local variable: ``prefix`` names it; an object with no gc-visible holder); ``start_id`` is the
    first object below the root, and ``child[id]`` leads from it to the target.  A root is recorded once per
    object it holds, so two globals of one module give two chains.  ``edges`` (if recorded) holds every
    ``(holder_id, held_id)`` reference met.
    """

    __slots__ = ("seen", "child", "level", "edges", "roots", "frontier", "upcoming", "backlog", "has_holder",
                 "ignored_hit", "own_ids", "ignored_ids", "module_dicts", "threads", "started", "budget",
                 "max_depth", "max_chains", "record_edges", "scans", "single_scan_s", "per_item", "stopped_by",
                 "depth", "target_id", "module_globals")

    def __init__(self, *, budget_s, max_depth, max_chains, ignore_ids, skipped_frame_ids, record_edges,
                 comfy_root, threads=None, module_dicts=None):
        self.started = time.perf_counter()
        self.budget = budget_s if isinstance(budget_s, Budget) else Budget(budget_s)
        self.max_depth = int(max_depth)
        self.max_chains = int(max_chains)
        self.record_edges = bool(record_edges)
        self.seen = {}
        self.child = {}
        self.level = {}
        self.edges = []
        self.roots = []
        self.frontier = []
        self.upcoming = []
        self.backlog = []
        self.has_holder = set()
        self.ignored_hit = set()
        self.scans = 0
        self.single_scan_s = None
        self.per_item = _FIRST_PER_ITEM
        self.stopped_by = None
        self.depth = 0
        self.target_id = None
        self.module_dicts = _module_dicts() if module_dicts is None else module_dicts
        self.threads = ThreadLocals(skipped_frame_ids, comfy_root) if threads is None else threads
        # A cycle capture needs every edge a scan meets, so it never settles objects by counting.
        counting = COUNTS_AS_EXPECTED and not self.record_edges
        self.module_globals = ModuleGlobals(self.module_dicts) if counting else None
        self.threads.pack_held.clear()   # the forward probe's starting points: never alive during a heap scan
        self.threads.watched.clear()
        self.own_ids = {id(self), id(self.seen), id(self.frontier), id(self.upcoming), id(self.backlog)}
        self.own_ids.update(self.threads.snapshot_ids)
        # Frames on a live stack are reported through ThreadLocals (or skipped); on CPython 3.10 the gc also
        # returns them as holders, so they are ignored here.
        self.ignored_ids = set(ignore_ids) | self.threads.frame_ids

    @property
    def complete(self):
        """True when every holder path ended at a root or an ignored object within the limits."""
        return self.stopped_by is None

    def run(self, target, seeds=None):
        """Search until nothing is left to expand or a limit (time, depth, number of chains) is reached.

        ``seeds`` (from a forward probe that reached the target) is ``(known, resume)``: ``known`` a list of
        ``(object, level, child_id)`` for the objects already connected to the target (not searched again, their
        thread roots already reported), ``resume`` the objects (among them, or the target) whose holders are still
        to be found.  Both lists are emptied here, before the first heap scan, so that they hold nothing then.
        """
        self.target_id = id(target)
        self.seen[self.target_id] = target
        self.level[self.target_id] = 0
        if seeds is None:
            self._note_thread_roots(self.target_id)
            self.frontier.append(target)
        else:
            known, resume = seeds
            for obj, level, child_id in known:
                obj_id = id(obj)
                self.seen[obj_id] = obj
                self.level[obj_id] = level
                self.child[obj_id] = child_id
            obj = None
            known.clear()
            self.backlog.extend(resume)
            resume.clear()
        del target, seeds
        while self.frontier or self._resume_backlog():
            if self.depth >= self.max_depth:
                self._stop("depth")
                self.frontier.clear()
                continue
            if not self._expand_level():
                break
            self.frontier, self.upcoming = self.upcoming, self.frontier
            self.upcoming.clear()
            self.depth += 1

    def chain_objects(self, root_id, start_id):
        """The objects from the root (if any) through ``start_id`` to the target, following ``child``."""
        objs = [] if root_id is None else [self.seen[root_id]]
        objs.append(self.seen[start_id])
        current = start_id
        while current != self.target_id:
            current = self.child[current]
            objs.append(self.seen[current])
        return objs

    def release(self):
        """Drop every reference to found objects (the target included)."""
        self.frontier.clear()
        self.upcoming.clear()
        self.backlog.clear()
        self.seen.clear()
        self.threads.watched.clear()

    def _stop(self, reason):
        if self.stopped_by is None:
            self.stopped_by = reason

    def _expand_level(self):
        """Scan the frontier in one call; a frontier too wide for half the time left is partly deferred.

        Deferring keeps the search climbing from the part it could afford (a wide fan-in usually has few roots
        above it) instead of spending the whole budget on one level and reporting no chain at all.
        """
        frontier = self.frontier
        if self.module_globals is not None and self.budget.left() > 0:
            self._settle_module_held()
        if frontier:
            count = self._affordable(len(frontier))
            if count == 0:
                self._stop(self.budget.stop_reason() or STOP_BUDGET)
                return False
            if count < len(frontier):
                self.backlog.extend(frontier[count:])
                del frontier[count:]
            self._scan(tuple(frontier))
        if len(self.roots) >= self.max_chains:
            self._stop("max_chains")
            return False
        return True

    def _settle_module_held(self):
        """Take off the frontier every object that only module globals (and frames' locals) hold, with its roots.

        What a scan would have recorded for it is recorded from :class:`ModuleGlobals` instead (see
        :mod:`comfy_memx.leaks.holders.module_globals`); the others stay for the scan.
        """
        index, seen, kept = self.module_globals, self.seen, []
        for obj_id in [id(obj) for obj in self.frontier]:
            if obj_id != self.target_id and index.may_hold(obj_id):
                # read first: the search holds the object in seen and in the frontier only, as counted there
                outside = refs_beyond_search(seen, obj_id)
                if self._record_module_roots(obj_id, outside, index.holders(seen[obj_id])):
                    continue
            kept.append(obj_id)
        self.frontier[:] = [seen[obj_id] for obj_id in kept]

    def _record_module_roots(self, obj_id, outside, holders):
        """Record ``holders`` (module dicts) as the roots of ``obj_id`` if they and live frames name every reference."""
        try:
            named = sum(count for _, count in holders) + self.threads.direct.get(obj_id, 0)
            if not holders or named != outside or any(id(namespace) in self.ignored_ids for namespace, _ in holders):
                return False
            self.has_holder.add(obj_id)
            for namespace, _ in holders:
                namespace_id = id(namespace)
                self.seen.setdefault(namespace_id, namespace)
                self.level.setdefault(namespace_id, self.depth + 1)
                self.roots.append((ROOT_MODULE_GLOBAL, namespace_id, obj_id, None, None))
            return True
        finally:
            holders.clear()

    def _resume_backlog(self):
        """Move the deferred objects of the lowest level back into the frontier; False if there are none."""
        if not self.backlog:
            return False
        lowest = min(self.level[id(obj)] for obj in self.backlog)
        keep = []
        for obj in self.backlog:
            (self.frontier if self.level[id(obj)] == lowest else keep).append(obj)
        self.backlog[:] = keep
        keep.clear()
        self.depth = lowest
        return True

    def _affordable(self, waiting):
        """How many frontier objects the next get_referrers call may take: half the CPU time left if some wait."""
        left = self.budget.left()
        if left <= 0:
            return 0
        if self.single_scan_s is None:
            return 1
        if left < self.single_scan_s:
            return 0
        usable = left if waiting == 1 else left / 2
        count = 1 + int((usable / self.single_scan_s - 1) / self.per_item)
        return max(1, min(count, waiting))

    def _scan(self, chunk):
        chunk_ids = set(map(id, chunk))
        single = (id(chunk[0]),) if len(chunk) == 1 else None
        started = time.thread_time()
        holders = gc.get_referrers(*chunk)
        self._learn_cost(time.thread_time() - started, len(chunk))
        for holder in holders:
            holder_id = id(holder)
            if holder_id in self.own_ids or holder is chunk or _is_search_frame(holder):
                continue
            held = single if single is not None else self._held_by(holder, chunk_ids)
            if not held:
                continue
            if holder_id in self.ignored_ids:
                self.ignored_hit.update(held)
                continue
            self.has_holder.update(held)
            if self.record_edges:
                self.edges.extend((holder_id, held_id) for held_id in held)
            root_kind = self._root_kind(holder, holder_id)
            if root_kind is not None:
                self.seen.setdefault(holder_id, holder)
                self.level.setdefault(holder_id, self.depth + 1)
                self.roots.extend((root_kind, holder_id, held_id, None, None) for held_id in held)
            elif holder_id not in self.seen:
                self.seen[holder_id] = holder
                self.child[holder_id] = held[0]
                self.level[holder_id] = self.depth + 1
                self.upcoming.append(holder)
                self._note_thread_roots(holder_id)
        for obj_id in chunk_ids:
            if (obj_id not in self.has_holder and obj_id not in self.ignored_hit and obj_id != self.target_id
                    and obj_id not in self.threads.by_object and obj_id not in self.threads.caller_held):
                self.roots.append((ROOT_C_REGISTRY, None, obj_id, None, None))

    def _learn_cost(self, seconds, count):
        self.scans += 1
        seconds = max(seconds, 1e-6)
        if count == 1 or self.single_scan_s is None:
            self.single_scan_s = seconds / (1 + (count - 1) * self.per_item)
        else:
            self.per_item = max(0.01, (seconds / self.single_scan_s - 1) / (count - 1))

    @staticmethod
    def _held_by(holder, chunk_ids):
        try:
            referents = gc.get_referents(holder)
        except Exception:
            return ()
        return tuple(dict.fromkeys(filter(chunk_ids.__contains__, map(id, referents))))

    def _root_kind(self, holder, holder_id):
        cls = type(holder)
        if holder_id in self.module_dicts or issubclass(cls, types.ModuleType):
            return ROOT_MODULE_GLOBAL
        if issubclass(cls, type):
            return ROOT_CLASS_ATTRIBUTE
        return None

    def _note_thread_roots(self, obj_id):
        for prefix, package in self.threads.by_object.get(obj_id, ()):
            self.roots.append((ROOT_THREAD_FRAME, None, obj_id, prefix, package))
