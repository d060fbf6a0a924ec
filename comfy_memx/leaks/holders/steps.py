"""A holder chain as steps that can be walked again later: how to get from its root to the target, without the objects.

The labels of :mod:`~comfy_memx.leaks.holders.labels` are for people; a release (:mod:`comfy_memx.leaks.release`)
must walk the same chain again at the moment it cuts, and check that every step still reaches the object it reached
during the search.  So each chain whose root is a module global or a class attribute also gets its ``steps``: plain
tuples of strings and numbers that hold no reference to anything searched (an object is named by its ``id`` and
type; a dict key by its value when it is a plain constant, else by its ``id``):

===================================  ==============================================================================
step                                 meaning
===================================  ==============================================================================
``("module", name, id)``             the root: ``sys.modules[name].__dict__``
``("class", module, qualname, id)``  the root: the class ``qualname`` of ``sys.modules[module]``
``("attr", name, id, type)``         an attribute in a class namespace or an instance ``__dict__``
``("item", key, id, type)``          a dict entry (``key`` is ``("=", value)`` or ``("id", id)``)
``("index", i, id, type)``           an item of a list, tuple or deque (found again by identity)
``("lru_item", key, id, type)``      an entry of an unbounded ``functools.lru_cache``'s own dict
``("lru_entry", None, id, type)``    a result that a bounded ``lru_cache`` holds in its C linked list
===================================  ==============================================================================

A chain through anything else (a closure cell, a slot, a frame, C code) has no steps: it cannot be walked again by
identity, so nothing on it is ever cut.
"""

import collections
import types

from comfy_memx.leaks.holders.labels import (_LRU_WRAPPER, _MISSING, _TYPE_QUALNAME, _class_namespace, _index_of,
                                             class_module, dict_key_of, instance_dict, type_name)
from comfy_memx.leaks.holders.search import ROOT_CLASS_ATTRIBUTE, ROOT_MODULE_GLOBAL

_PLAIN_KEYS = (str, int, float, bool, bytes, type(None))
MAX_KEY_CHARS = 1000
MAX_KEY_ITEMS = 8


def plain_key(key):
    """True for a dict key that can be kept by value: a short builtin constant, or a short tuple of them."""
    cls = type(key)
    if cls in (str, bytes):
        return len(key) <= MAX_KEY_CHARS
    if cls in _PLAIN_KEYS:
        return True
    return cls is tuple and len(key) <= MAX_KEY_ITEMS and all(plain_key(item) for item in key)


def key_spec(key):
    """How a step names a dict key: ``("=", key)`` for a plain constant, else ``("id", id(key))``."""
    return ("=", key) if plain_key(key) else ("id", id(key))


def chain_steps(objs, kind, root_id, module_dicts):
    """The steps of one chain (``objs``: root first, target last), or ``()`` when it cannot be walked again."""
    if kind == ROOT_MODULE_GLOBAL:
        name = module_dicts.get(root_id)
        if name is None or id(objs[0]) != root_id:
            return ()
        steps = [("module", name, root_id)]
    elif kind == ROOT_CLASS_ATTRIBUTE and issubclass(type(objs[0]), type):
        try:
            qualname = _TYPE_QUALNAME.__get__(objs[0])
        except Exception:
            return ()
        if "<locals>" in qualname:
            return ()
        steps = [("class", class_module(objs[0]), qualname, id(objs[0]))]
    else:
        return ()
    index = 0
    while index < len(objs) - 1:
        found = _step(objs, index)
        if found is None:
            return ()
        (op, arg), used = found
        reached = objs[index + used]
        steps.append((op, arg, id(reached), type_name(type(reached))))
        index += used
    return tuple(steps)


def _step(objs, index):
    """``((op, arg), references covered)`` from ``objs[index]`` onwards, or None for a reference not walkable."""
    holder, child = objs[index], objs[index + 1]
    after = objs[index + 2] if index + 2 < len(objs) else _MISSING
    cls = type(holder)
    if issubclass(cls, type):
        return _class_step(holder, child, after)
    if cls is _LRU_WRAPPER:
        return _lru_step(holder, child, after)
    if issubclass(cls, dict):
        key = dict_key_of(holder, child)
        return (("item", key_spec(key)), 1) if key is not _MISSING else None
    if issubclass(cls, (list, tuple, collections.deque)):
        return _sequence_step(holder, cls, child)
    if issubclass(cls, (types.FunctionType, types.FrameType, types.CellType, types.ModuleType)):
        return None
    return _instance_step(holder, child, after)


def _class_step(holder, child, after):
    """A class attribute, through the class's namespace dict."""
    if after is not _MISSING and child is _class_namespace(holder):
        key = dict_key_of(child, after)
        if type(key) is str:
            return ("attr", key), 2
    return None


def _lru_step(holder, child, after):
    """An ``functools.lru_cache`` entry, keyed when its cache dict is on the path."""
    if child is instance_dict(holder):
        return None
    if type(child) is dict and after is not _MISSING:
        key = dict_key_of(child, after)
        return (("lru_item", key_spec(key)), 2) if key is not _MISSING else None
    return ("lru_entry", None), 1


def _sequence_step(holder, cls, child):
    """The position of ``child`` in a list, tuple or deque."""
    walk = (list.__iter__ if issubclass(cls, list) else tuple.__iter__ if issubclass(cls, tuple)
            else collections.deque.__iter__)
    position = _index_of(walk(holder), child)
    return (("index", position), 1) if position >= 0 else None


def _instance_step(holder, child, after):
    """An instance attribute, through the instance ``__dict__`` (folded when the dict is on the path)."""
    attrs = instance_dict(holder)
    if attrs is None:
        return None
    if child is attrs and after is not _MISSING:
        key = dict_key_of(attrs, after)
        return (("attr", key), 2) if type(key) is str else None
    key = dict_key_of(attrs, child)
    return (("attr", key), 1) if type(key) is str else None
