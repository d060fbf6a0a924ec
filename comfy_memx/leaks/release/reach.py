"""Bounded walks that decide a release: what one cache entry holds, and whether ComfyUI still reaches a model.

Both follow ``gc.get_referents`` (only gc-tracked referents: an untracked object holds no model), breadth first, keep
every object met alive while they run (so that ids stay unique) and drop them all before returning.  They never
enter a class, a module or its namespace, a code object, a frame, a weak reference, a tensor or storage, or an object
of comfy_memx; a torch module is a leaf, named by its ``id``.  Each has a bound in objects expanded and in CPU time
(:class:`~comfy_memx.leaks.holders.budget.Budget`); a walk that reaches it says so (``complete`` False) and its
caller decides on the safe side.

* :func:`entry_contents` walks the value of one cache entry through everything it holds: the torch modules it
  reaches (the models that go with the entry), whether one of them is outside the models asked about, and whether it
  holds a pack's cache structure (a mapping class, a deque, an ``OrderedDict`` ...: another cache, not this entry's
  own objects).
* :func:`comfyui_reach` walks from ComfyUI's long-lived objects (:func:`comfyui_roots`: its prompt executor with the
  output caches, ``PromptServer.instance``, the loaded list) through the standard containers and ComfyUI's own
  objects only, never through the objects the caller leaves out (the pack's chain down to the entry being cut), and
  says which root still reaches a model.
"""

import collections
import gc
import sys
import types
import weakref

from comfy_memx.leaks.holders.budget import Budget
from comfy_memx.leaks.holders.containers import (class_lookup, is_cache_structure, is_comfyui_class, is_standard, mro,
                                                 torch_kinds)
from comfy_memx.leaks.holders.labels import class_module
from comfy_memx.leaks.holders.packages import module_namespace

MAX_OBJECTS = 200_000   # objects one walk may expand
CPU_S = 0.5             # CPU seconds one walk may use
_CHECK_EVERY = 256
_OWN = __name__.split(".", 1)[0]
_MODEL, _ENTER, _STRUCTURE, _SKIP = "model", "enter", "structure", "skip"
_NEVER = (type, types.ModuleType, types.CodeType, types.FrameType, weakref.ReferenceType)


class Walked:
    """What one walk met: ``models`` (ids of the torch modules reached), ``structure`` (it met a cache structure),
    ``found`` (the label of the root that reached a wanted model, :func:`comfyui_reach`), ``complete`` (it ended
    within its bounds) and ``stopped_by`` (``objects`` or a budget reason, else None)."""
    __slots__ = ("models", "structure", "found", "complete", "stopped_by")

    def __init__(self):
        self.models, self.structure, self.found, self.complete, self.stopped_by = set(), False, None, True, None


class _Walk:
    """One bounded walk; ``enter`` decides, by class, whether an object that is neither a model nor a leaf is
    walked through (True), walked through as a cache structure ("structure") or left alone (False)."""

    def __init__(self, enter, skip_ids, allowed=None):
        self.enter = enter
        self.allowed = allowed   # with a set of model ids: stop at the first other model or cache structure
        self.module_cls, self.leaf_ids = torch_kinds()
        self.skip = set(skip_ids) | _module_dict_ids()
        self.verdicts = {}
        self.seen = {}
        self.result = Walked()

    def run(self, starts, wanted=frozenset(), max_objects=None, cpu_s=None):
        """Walk from ``starts`` (``(label, object)`` pairs); stop at the first model in ``wanted``."""
        max_objects = MAX_OBJECTS if max_objects is None else max_objects
        budget, queue, result = Budget(CPU_S if cpu_s is None else cpu_s), collections.deque(), self.result
        for label, obj in starts:
            self._meet(obj, label, queue, wanted)
        expanded, until_check = 0, 0
        while queue and result.found is None and not self._settled():
            stop = "objects" if expanded >= max_objects else None
            if stop is None and until_check <= 0:
                stop, until_check = budget.stop_reason(), _CHECK_EVERY
            if stop is not None:
                result.complete, result.stopped_by = False, stop
                break
            until_check -= 1
            obj, label = queue.popleft()
            expanded += 1
            for ref in list(filter(gc.is_tracked, gc.get_referents(obj))):
                self._meet(ref, label, queue, wanted)
            obj = ref = None
        queue.clear()
        self.seen.clear()
        return result

    def _settled(self):
        """True once a walk told to stop at an object outside ``allowed`` met one (the answer cannot change)."""
        result = self.result
        return self.allowed is not None and (result.structure or not result.models <= self.allowed)

    def _meet(self, obj, label, queue, wanted):
        obj_id = id(obj)
        if obj_id in self.seen or obj_id in self.skip:
            return
        self.seen[obj_id] = obj
        verdict = self._verdict(type(obj))
        if verdict is _MODEL:
            self.result.models.add(obj_id)
            if obj_id in wanted:
                self.result.found = label
        elif verdict is not _SKIP:
            self.result.structure = self.result.structure or verdict is _STRUCTURE
            queue.append((obj, label))

    def _verdict(self, cls):
        cached = self.verdicts.get(id(cls))
        if cached is None:
            cached = self.verdicts[id(cls)] = (cls, self._type_verdict(cls))
        return cached[1]

    def _type_verdict(self, cls):
        bases = mro(cls)
        if self.module_cls is not None and self.module_cls in bases:
            return _MODEL
        if issubclass(cls, _NEVER) or any(id(base) in self.leaf_ids for base in bases):
            return _SKIP
        module = class_module(cls)
        if module == _OWN or module.startswith(_OWN + "."):
            return _SKIP
        verdict = self.enter(cls, self.module_cls)
        return _STRUCTURE if verdict == "structure" else _ENTER if verdict else _SKIP


def _module_dict_ids():
    return {id(module_namespace(module)) for module in list(sys.modules.values())
            if issubclass(type(module), types.ModuleType)}


def _contents_verdict(cls, module_cls):
    return "structure" if is_cache_structure(cls, module_cls) else True


def _comfyui_verdict(cls, _module_cls):
    return is_standard(cls) or is_comfyui_class(cls)


def entry_contents(value, leave_out=(), allowed=None, max_objects=None, cpu_s=None):
    """A :class:`Walked` of everything ``value`` (one cache entry's value) holds, the objects whose ids are in
    ``leave_out`` (the pack's chain above the entry) not entered; ``models`` are all it reached.  With ``allowed``
    (a set of model ids) it stops at the first other model or cache structure: the entry then holds more than
    those, and ``models`` is only what it met until then."""
    walk = _Walk(_contents_verdict, leave_out, allowed)
    try:
        return walk.run([("entry", value)], max_objects=max_objects, cpu_s=cpu_s)
    finally:
        del value


def comfyui_reach(roots, wanted_ids, leave_out=(), max_objects=None, cpu_s=None):
    """A :class:`Walked` from ComfyUI's ``roots`` (``(label, object)`` pairs) through standard containers and
    ComfyUI's own objects, never entering the objects whose ids are in ``leave_out``; ``found`` names the root that
    reached a model of ``wanted_ids`` (None: none did, or the walk stopped first: see ``complete``)."""
    walk = _Walk(_comfyui_verdict, leave_out)
    return walk.run(roots, wanted=frozenset(wanted_ids), max_objects=max_objects, cpu_s=cpu_s)


def comfyui_roots(model_management):
    """ComfyUI's long-lived objects that use models, as ``(label, object)``: every prompt executor a live thread holds
    (with its output caches; ComfyUI's worker keeps it only in a local variable, as the holder probe finds it),
    ``PromptServer.instance`` and the loaded list ``current_loaded_models``."""
    from comfy_memx.leaks.holders.probe import core_watch_types
    from comfy_memx.leaks.holders.search import ThreadLocals, frames_to_skip
    roots = []
    threads = ThreadLocals(frames_to_skip(sys._getframe(), 0), None, core_watch_types())
    try:
        seen = set()
        for executor in threads.watched:
            if id(executor) not in seen:
                seen.add(id(executor))
                roots.append(("ComfyUI's prompt executor (its output caches)", executor))
    finally:
        threads.watched.clear()
        threads.pack_held.clear()
    server = sys.modules.get("server")
    server_class = module_namespace(server).get("PromptServer") if isinstance(server, types.ModuleType) else None
    if issubclass(type(server_class), type):
        instance = class_lookup(server_class, "instance")
        if instance is not None:
            roots.append(("ComfyUI's PromptServer.instance", instance))
    loaded = getattr(model_management, "current_loaded_models", None)
    if type(loaded) is list:
        roots.append(("ComfyUI's loaded list (current_loaded_models)", loaded))
    return roots
