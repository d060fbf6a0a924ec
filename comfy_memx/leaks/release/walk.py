"""Walk a holder chain's steps again, check every object on it is the one the search saw, and cut one entry.

The steps (:mod:`comfy_memx.leaks.holders.steps`) name each object by ``id`` and type; the walk reads every
reference through C-level views (``dict.get``, ``list.__getitem__``, the class namespace, the instance ``__dict__``)
and never through the pack's ``__getattr__`` or ``__getitem__``.  Any object that is not the one recorded raises
:class:`Changed`: the container was replaced, the entry now holds something else, or the chain no longer ends at the
model.  Only the cut itself runs the container's own code: the public ``__delitem__`` (else ``pop``) of the mapping
object that keeps the entry's container as its own attribute (a ``WeakKeyDictionary``'s ``.data``, a ``cachetools``
cache's dict, a pack's mapping class), else ``type(container).__delitem__``, or ``cache_clear()`` of a bounded
``lru_cache``; the entry must be gone afterwards.  If a container's own removal raises, whatever it removed is put back
and :class:`CutFailed` says so; a mapping object's remover that raises or leaves the entry is :class:`CutFailed` too.

Type tests read ``type(obj)``, never ``isinstance`` (which asks a hostile object for its ``__class__``).  The
objects are held only by a :class:`Chain` (:func:`follow`), which its caller drops (:func:`cut` does before it
returns).
"""

import collections
import gc
import sys

from comfy_memx.leaks.holders.containers import is_mapping_class, public_key, remover_of, torch_kinds
from comfy_memx.leaks.holders.labels import _LRU_WRAPPER, _MISSING, _class_namespace, instance_dict, type_name
from comfy_memx.leaks.holders.packages import module_namespace


class Changed(Exception):
    """The chain no longer reaches what it reached when it was searched; nothing was cut."""


class CutFailed(Exception):
    """The container's own removal raised; nothing was lost (a partial removal was undone)."""


def cut(steps, cut_at, target):
    """Check ``steps`` from the root to ``target`` and remove the entry of step ``cut_at`` from its container.

    Returns ``{"cut": label, "method": ..., "other_entries_dropped": n}``.  Raises :class:`Changed` (nothing cut)
    or :class:`CutFailed` (nothing lost)."""
    chain = follow(steps, target)
    try:
        return remove(chain, cut_at)
    finally:
        chain.drop()
        del target


class Chain:
    """The objects of a chain walked again (root first, target last) and, per step, ``(op, key)`` as found; held
    only until :meth:`drop`."""
    __slots__ = ("steps", "objects", "handles")

    def __init__(self, steps, objects, handles):
        self.steps, self.objects, self.handles = steps, objects, handles

    def drop(self):
        """Let go of every object of the chain."""
        self.objects.clear()
        self.handles.clear()


def follow(steps, target):
    """Walk ``steps`` again from the root and check that every object is the one the search saw and that the chain
    still ends at ``target``; returns the :class:`Chain`.  Raises :class:`Changed` otherwise."""
    objects = [_root(steps[0])]
    handles = [None]
    try:
        for step in steps[1:]:
            child, handle = _follow(objects[-1], step)
            objects.append(child)
            handles.append(handle)
            del child
        if objects[-1] is not target:
            raise Changed("the chain no longer ends at the model")
    except BaseException:
        objects.clear()
        handles.clear()
        raise
    finally:
        del target
    return Chain(steps, objects, handles)


def remove(chain, cut_at):
    """Remove the entry that step ``cut_at`` of a walked :class:`Chain` reached from its container: through the
    public ``__delitem__`` (else ``pop``) of the mapping object that keeps the container as its own attribute (a
    ``WeakKeyDictionary``, a ``cachetools`` cache, a pack's mapping class), else the container's own removal."""
    objects, handles = chain.objects, chain.handles
    container, (op, key) = objects[cut_at - 1], handles[cut_at]
    owner = _owner(chain, cut_at)
    if owner is not None:
        return _remove_through(owner, container, key, objects[cut_at])
    return _remove(container, op, key, objects[cut_at])


def _owner(chain, cut_at):
    """The mapping object whose own attribute is the container of step ``cut_at`` (an ``item`` step), or None."""
    if chain.handles[cut_at][0] != "item" or cut_at < 3 or chain.steps[cut_at - 1][0] != "attr":
        return None
    owner = chain.objects[cut_at - 2]
    if not is_mapping_class(type(owner), torch_kinds()[0]) or remover_of(type(owner)) is None:
        return None
    return owner


def _remove_through(owner, container, key, value):
    """Remove ``container[key]`` (``value``) with ``owner``'s public remover; the entry must be gone afterwards
    (an error raised once it is gone, as ``TTLCache`` raises for an expired entry, does not undo the cut)."""
    name, function = remover_of(type(owner))
    before = _length(container)
    error = None
    try:
        function(owner, public_key(owner, key))
    except Exception as exc:
        error = exc
    if _still_there(container, key, value):
        why = f"raised {type(error).__name__}: {error}" if error is not None else "left the entry in place"
        raise CutFailed(f"{type_name(type(owner))}.{name} {why}")
    return {"method": "mapping_" + ("entry" if name == "__delitem__" else "pop"),
            "other_entries_dropped": max(0, before - _length(container) - 1)}


def _still_there(container, key, value):
    try:
        return dict.get(container, key, _MISSING) is value
    except TypeError:   # a key that no longer hashes
        return any(item is value for item in dict.values(container))


def _length(container):
    return dict.__len__(container) if issubclass(type(container), dict) else 0


def _root(root):
    kind = root[0]
    if kind == "module":
        namespace = module_namespace(sys.modules.get(root[1]))
        if id(namespace) != root[2]:
            raise Changed(f"module {root[1]} is not the one searched")
        return namespace
    if kind == "class":
        obj = sys.modules.get(root[1])
        namespace = module_namespace(obj)
        for part in root[2].split("."):
            obj = dict.get(namespace, part, _MISSING) if type(namespace) is dict else _MISSING
            if not issubclass(type(obj), type):
                raise Changed(f"class {root[1]}.{root[2]} is gone")
            namespace = _class_namespace(obj)
        if id(obj) != root[3]:
            raise Changed(f"class {root[2]} is not the one searched (its module was reloaded?)")
        return obj
    raise Changed(f"a root of kind {kind!r} cannot be walked")


def _follow(holder, step):
    """``(child, (op, key))`` of one step from ``holder``; raises :class:`Changed` when it is not the recorded one."""
    op, arg, want_id, want_type = step
    child, key = _MISSING, None
    if op == "attr":
        namespace = _class_namespace(holder) if issubclass(type(holder), type) else instance_dict(holder)
        key = arg
        child = dict.get(namespace, arg, _MISSING) if namespace is not None else _MISSING
    elif op in ("item", "lru_item"):
        mapping = holder if op == "item" else _lru_dict(holder)
        if issubclass(type(mapping), dict):
            key = _find_key(mapping, arg)
            child = dict.get(mapping, key, _MISSING) if key is not _MISSING else _MISSING
    elif op == "index":
        key, child = _find_item(holder, arg, want_id)
    elif op == "lru_entry":
        if type(holder) is _LRU_WRAPPER:
            child = next((obj for obj in gc.get_referents(holder) if id(obj) == want_id), _MISSING)
    if child is _MISSING or id(child) != want_id or type_name(type(child)) != want_type:
        raise Changed(f"the {op} step {_shown(arg)} no longer reaches the {want_type} it reached")
    return child, (op, key)


def _shown(arg):
    if isinstance(arg, tuple) and arg[:1] == ("=",):
        return repr(arg[1])[:80]
    return "" if arg is None else str(arg)[:80]


def _find_key(mapping, spec):
    how, value = spec
    try:
        if how == "=":
            return value if dict.__contains__(mapping, value) else _MISSING
        return next((key for key in dict.keys(mapping) if id(key) == value), _MISSING)
    except RuntimeError:   # changed size while read (another thread)
        return _MISSING


def _find_item(sequence, index, want_id):
    """``(position, item)`` of the item with ``want_id``, looked for at ``index`` first (earlier cuts move items)."""
    cls = type(sequence)
    if issubclass(cls, list):
        items = list.__iter__(sequence)
    elif issubclass(cls, tuple):
        items = tuple.__iter__(sequence)
    elif issubclass(cls, collections.deque):
        items = collections.deque.__iter__(sequence)
    else:
        return None, _MISSING
    try:
        snapshot = list(items)
    except RuntimeError:   # a deque mutated while read
        return None, _MISSING
    if 0 <= index < len(snapshot) and id(snapshot[index]) == want_id:
        return index, snapshot[index]
    position = next((i for i, item in enumerate(snapshot) if id(item) == want_id), None)
    return (position, snapshot[position]) if position is not None else (None, _MISSING)


def _lru_dict(wrapper):
    if type(wrapper) is not _LRU_WRAPPER:
        return None
    inner = instance_dict(wrapper)
    return next((obj for obj in gc.get_referents(wrapper) if type(obj) is dict and obj is not inner), None)


def _remove(container, op, key, value):
    """Remove ``value`` (at ``key``) from ``container``; undo a partial removal when the container's code raises."""
    if op == "lru_entry":
        info = container.cache_info()
        try:
            container.cache_clear()
        except Exception as exc:
            raise CutFailed(f"cache_clear() raised {type(exc).__name__}: {exc}") from None
        return {"method": "lru_cache_clear", "other_entries_dropped": max(0, int(info.currsize) - 1)}
    if op == "lru_item":
        dict.__delitem__(_lru_dict(container), key)   # the unbounded cache's own dict: no linked list to keep
        return {"method": "lru_entry", "other_entries_dropped": 0}
    if op == "item":
        if not issubclass(type(container), dict):
            raise Changed("the container is no longer a dict")
        before = dict.__len__(container)
        try:
            type(container).__delitem__(container, key)
        except Exception as exc:
            if dict.get(container, key, _MISSING) is not value:
                dict.__setitem__(container, key, value)
            raise CutFailed(f"{type_name(type(container))}.__delitem__ raised {type(exc).__name__}: {exc}") from None
        return {"method": "dict_entry", "other_entries_dropped": max(0, before - dict.__len__(container) - 1)}
    if not issubclass(type(container), (list, collections.deque)):
        raise Changed("the container is an immutable sequence (a tuple): its entry cannot be cut")
    try:
        type(container).__delitem__(container, key)
    except Exception as exc:
        kind = list if issubclass(type(container), list) else collections.deque
        if not any(item is value for item in kind.__iter__(container)):
            kind.insert(container, key, value)
        raise CutFailed(f"{type_name(type(container))}.__delitem__ raised {type(exc).__name__}: {exc}") from None
    return {"method": "list_entry", "other_entries_dropped": 0}
