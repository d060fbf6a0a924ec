"""Names how one object holds the next, without running the holder's own code.

A chain is printed as a Python-like access path (``some_pack.Model._cache['k'].__self__``).  Every label is
found by identity through C-level views (``dict.keys``/``dict.values``, member descriptors, ``gc.get_referents``)
and never through the holder's ``__getattr__``, ``__eq__``, ``__iter__`` or ``__len__``: the holder is
third-party code under suspicion, and it may be broken or slow.  Only :func:`safe_repr` runs user code
(``repr`` of dict keys), and it contains whatever that code raises.
"""

import collections
import functools
import gc
import itertools
import operator
import re
import threading
import types
import weakref

from comfy_memx.leaks.holders.packages import display_module_name, module_namespace

# type's own descriptors: they bypass any metaclass __getattribute__.
_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]
_TYPE_MODULE = type.__dict__["__module__"]
_TYPE_QUALNAME = type.__dict__["__qualname__"]
_LRU_WRAPPER = type(functools.lru_cache(maxsize=None)(len))
_THREAD_LOCAL = threading.local
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MISSING = object()
_SIMPLE = frozenset({str, int, float, bool, bytes, complex, type(None), type(Ellipsis)})
# Getters of builtin types that only read a field: safe to call on any instance of these exact types.
_SAFE_GETSETS = (
    (BaseException, ("__traceback__", "__context__", "__cause__", "args")),
    (types.FunctionType, ("__defaults__", "__kwdefaults__", "__globals__", "__closure__", "__code__")),
    (types.FrameType, ("f_back", "f_globals", "f_builtins", "f_code", "f_trace")),
    (types.TracebackType, ("tb_next", "tb_frame")),
)


def _truncate(text, limit):
    limit = max(int(limit), 8)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def type_name(cls):
    """``module.Qualname`` of a class, read through ``type``'s own descriptors (``builtins.`` omitted)."""
    try:
        module = _TYPE_MODULE.__get__(cls)
        qualname = _TYPE_QUALNAME.__get__(cls)
    except Exception:
        return "?"
    if not isinstance(module, str) or module == "builtins":
        return str(qualname)
    return f"{display_module_name(module)}.{qualname}"


def safe_repr(obj, limit=80):
    """Return ``repr(obj)`` cut to ``limit`` characters; never raises.

    Builtin scalars and tuples of them are formatted directly.  Other objects go through their own
    ``__repr__``; if that raises (or returns a non-string), the result is a type-based description such as
    ``<some_pack.Holder object (repr raised ValueError)>``, whose error part is never cut.

    Example::

        >>> safe_repr("x" * 100, limit=10)
        "'xxxxxx..."

    .. versionadded:: 0.1
    """
    try:
        cls = type(obj)
        if cls in _SIMPLE:
            text = repr(obj)
        elif cls is tuple and len(obj) <= 8:
            inner = ", ".join(safe_repr(item, limit) for item in obj)
            text = f"({inner},)" if len(obj) == 1 else f"({inner})"
        else:
            text = repr(obj)
            if type(text) is not str:
                raise TypeError("__repr__ returned a non-string")
    except Exception as exc:
        suffix = f" object (repr raised {type(exc).__name__})>"
        name = type_name(type(obj))
        room = max(int(limit) - len(suffix) - 1, 8)
        return "<" + (name if len(name) <= room else "..." + name[3 - room:]) + suffix
    return _truncate(_ADDRESS.sub("", text), limit)


def describe(obj):
    """A short description of ``obj`` built from its type only (no user code runs)."""
    cls = type(obj)
    try:
        if cls in _SIMPLE:
            return safe_repr(obj, 40)
        if issubclass(cls, types.ModuleType):
            return f"module {display_module_name(module_namespace(obj).get('__name__'))}"
        if issubclass(cls, type):
            return f"class {type_name(obj)}"
        if cls is types.FunctionType:
            return f"function {function_name(obj)}"
        if cls in (dict, list, tuple, set, frozenset):
            unit = "keys" if cls is dict else "items"
            return f"{cls.__name__} ({cls.__len__(obj)} {unit})"
    except Exception:
        pass
    return type_name(cls)


def function_name(func):
    """``module.qualname`` of a plain function, read from its own fields."""
    module = func.__globals__.get("__name__") if type(func.__globals__) is dict else None
    module = display_module_name(module) if isinstance(module, str) else "?"
    return f"{module}.{func.__qualname__}"


def class_module(cls):
    """The ``__module__`` of a class, read through ``type``'s own descriptor (``"?"`` if unreadable)."""
    try:
        module = _TYPE_MODULE.__get__(cls)
    except Exception:
        return "?"
    return module if isinstance(module, str) else "?"


def attr_text(key):
    """``.key`` for an identifier-like string key, else ``[repr(key)]``."""
    if type(key) is str and key.isidentifier():
        return f".{key}"
    return f"[{safe_repr(key, 60)}]"


def _index_of(iterable, item):
    """Position of ``item`` (by identity) in an iterable, at C speed, or ``-1``."""
    hits = itertools.compress(itertools.count(), map(operator.is_, iterable, itertools.repeat(item)))
    return next(hits, -1)


def dict_key_of(mapping, value):
    """The key under which the plain-dict view of ``mapping`` stores ``value`` (identity), or ``_MISSING``."""
    try:
        hits = itertools.compress(dict.keys(mapping),
                                  map(operator.is_, dict.values(mapping), itertools.repeat(value)))
        return next(hits, _MISSING)
    except RuntimeError:  # changed size during iteration (another thread)
        return _MISSING


def dict_keys_of(mapping, value):
    """Every key under which the plain-dict view of ``mapping`` stores ``value`` (identity)."""
    try:
        return list(itertools.compress(dict.keys(mapping),
                                       map(operator.is_, dict.values(mapping), itertools.repeat(value))))
    except RuntimeError:  # changed size during iteration (another thread)
        return []


def _is_dict_key(mapping, key):
    try:
        return _index_of(dict.keys(mapping), key) >= 0
    except RuntimeError:
        return False


def _mro(cls):
    try:
        return _TYPE_MRO.__get__(cls)
    except Exception:
        return (cls,)


def instance_dict(obj):
    """The instance ``__dict__`` of ``obj`` through the C getter of its class, or ``None``.

    A ``__dict__`` defined in Python (a property) is not called.
    """
    for cls in _mro(type(obj)):
        descriptor = _TYPE_DICT.__get__(cls).get("__dict__")
        if descriptor is None:
            continue
        if type(descriptor) is not types.GetSetDescriptorType:
            return None
        try:
            found = descriptor.__get__(obj)
        except Exception:
            return None
        return found if issubclass(type(found), dict) else None
    return None


def _class_namespace(cls):
    """The real dict behind ``cls.__dict__`` (the mappingproxy shows it; ``gc`` exposes it)."""
    proxy = _TYPE_DICT.__get__(cls)
    for referent in gc.get_referents(proxy):
        if type(referent) is dict:
            return referent
    return None


def _field_holding(obj, child):
    """Name of a slot, struct member or known read-only field of ``obj`` that is ``child``, or ``None``."""
    for cls in _mro(type(obj)):
        for name, descriptor in list(_TYPE_DICT.__get__(cls).items()):
            if type(descriptor) is not types.MemberDescriptorType:
                continue
            try:
                if descriptor.__get__(obj) is child:
                    return name
            except Exception:
                continue
    for base, names in _SAFE_GETSETS:
        if issubclass(type(obj), base):
            for name in names:
                try:
                    if _TYPE_DICT.__get__(base)[name].__get__(obj) is child:
                        return name
                except Exception:
                    continue
    return None


def _frame_local_name(frame, value):
    # Only called for frames that are not running on a thread (traceback frames, suspended generators): on
    # CPython < 3.13 f_locals stores a snapshot in the frame, holding values the frame holds anyway.
    try:
        key = dict_key_of(dict(frame.f_locals), value)
    except Exception:
        return None
    return None if key is _MISSING else key


def _namespace_hop(holder, cls, child, after):
    """``module.attr`` or ``Class.attr``: the reference through the module's or class's namespace dict."""
    if issubclass(cls, types.ModuleType):
        namespace = module_namespace(holder)
    elif issubclass(cls, type):
        namespace = _class_namespace(holder)
    else:
        return None
    if child is namespace and after is not _MISSING:
        key = dict_key_of(child, after)
        if key is not _MISSING:
            return attr_text(key), 2
    return None


def _closure_hop(holder, child, after, more):
    """A function's closure variable (through ``__closure__`` and, when ``more`` follows, its cell)."""
    closure = holder.__closure__
    if closure is None or child is not closure or after is _MISSING:
        return None
    index = _index_of(tuple.__iter__(closure), after)
    names = holder.__code__.co_freevars
    name = names[index] if 0 <= index < len(names) else "?"
    if more:
        return f" -> closure {name!r}", 3
    return f" -> closure cell {name!r}", 2


def _lru_hop(holder, child, after):
    """An ``functools.lru_cache`` entry, keyed when the cache dict is on the path; None for its ``__dict__``."""
    if child is instance_dict(holder):
        return None
    if type(child) is dict and after is not _MISSING:
        key = dict_key_of(child, after)
        if key is not _MISSING:
            return f" -> lru_cache[{safe_repr(key, 60)}]", 2
    return " -> lru_cache entry", 1


def _thread_local_hop(objs, i, after):
    """threading.local: its per-thread dicts are values of a dict keyed by weak references to the threads."""
    if i + 3 < len(objs):
        key = dict_key_of(after, objs[i + 3])
        if key is not _MISSING:
            return f" -> thread-local{attr_text(key)}", 3
    return " -> thread-local", 2


_FRAME_OF = {types.GeneratorType: "gi_frame", types.CoroutineType: "cr_frame"}


def _suspended_hop(holder, cls, child):
    """A local variable of a suspended generator or coroutine, or of a frame that is not running."""
    if cls is types.FrameType:
        name = _frame_local_name(holder, child)
        return (f".f_locals[{name!r}]", 1) if name is not None else None
    frame = getattr(holder, _FRAME_OF.get(cls, "ag_frame"), None)
    name = _frame_local_name(frame, child) if frame is not None else None
    return (f" -> {cls.__name__} local {name!r}", 1) if name is not None else None


def _dict_hop(holder, child):
    """``[key]`` of a dict value (a weak-reference key named by its referent's type), or a dict key itself."""
    key = dict_key_of(holder, child)
    if key is not _MISSING:
        if type(key) is weakref.ReferenceType:
            referent = key()
            return f"[<weak reference to {type_name(type(referent)) if referent is not None else 'a dead object'}>]", 1
        return f"[{safe_repr(key, 60)}]", 1
    if _is_dict_key(holder, child):
        return " -> dict key", 1
    return None


def _container_hop(holder, cls, child):
    """``[index]`` of a list, tuple or deque, a set member, or a cell's contents."""
    if issubclass(cls, (list, tuple, collections.deque)):
        walk = (list.__iter__ if issubclass(cls, list) else tuple.__iter__ if issubclass(cls, tuple)
                else collections.deque.__iter__)
        try:
            index = _index_of(walk(holder), child)
        except RuntimeError:   # a deque changed while read (another thread)
            return None
        return (f"[{index}]", 1) if index >= 0 else None
    if issubclass(cls, (set, frozenset)):
        return " -> set member", 1
    if cls is types.CellType:
        return ".cell_contents", 1
    return None


def _instance_hop(holder, child, after):
    """``obj.attr`` through the instance ``__dict__`` (folded when the dict is on the path), or the dict itself."""
    attrs = instance_dict(holder)
    if attrs is None:
        return None
    if child is attrs and after is not _MISSING:
        key = dict_key_of(attrs, after)
        if key is not _MISSING:
            return attr_text(key), 2
    key = dict_key_of(attrs, child)
    if key is not _MISSING:
        return attr_text(key), 1
    if child is attrs:
        return ".__dict__", 1
    return None


def _kind_hop(objs, i, holder, cls, child, after):
    """The label that ``holder``'s kind of object gives the reference, or None when its kind names nothing."""
    if issubclass(cls, (types.ModuleType, type)):
        return _namespace_hop(holder, cls, child, after)
    if cls is types.FunctionType:
        return _closure_hop(holder, child, after, i + 3 < len(objs))
    if cls is _LRU_WRAPPER:
        return _lru_hop(holder, child, after)
    if issubclass(cls, _THREAD_LOCAL) and type(child) is dict and type(after) is dict:
        return _thread_local_hop(objs, i, after)
    if cls is types.FrameType or issubclass(cls, (types.GeneratorType, types.CoroutineType,
                                                  types.AsyncGeneratorType)):
        return _suspended_hop(holder, cls, child)
    if issubclass(cls, dict):
        return _dict_hop(holder, child)
    return _container_hop(holder, cls, child)


def hop(objs, i):
    """Label the reference from ``objs[i]`` to ``objs[i + 1]``; may fold helper objects into one label.

    Returns ``(label, steps)``: ``steps`` is how many references the label covers (2 for ``obj.attr`` through
    an instance ``__dict__``, 3 for a closure variable through ``__closure__`` and its cell).
    """
    holder, child = objs[i], objs[i + 1]
    after = objs[i + 2] if i + 2 < len(objs) else _MISSING
    cls = type(holder)
    found = _kind_hop(objs, i, holder, cls, child, after) or _instance_hop(holder, child, after)
    if found is not None:
        return found
    name = _field_holding(holder, child)
    if name is not None:
        return f".{name}", 1
    return f" -> (inside {type_name(cls)})", 1


def render_labels(objs):
    """Join the labels of every reference along ``objs`` (holder first, target last)."""
    parts = []
    i = 0
    while i < len(objs) - 1:
        label, steps = hop(objs, i)
        parts.append(label)
        i += steps
    return "".join(parts)


def render_steps(objs):
    """Like :func:`render_labels` but as ``[(from_index, label, to_index), ...]`` into ``objs``."""
    steps = []
    i = 0
    while i < len(objs) - 1:
        label, count = hop(objs, i)
        steps.append((i, label, i + count))
        i += count
    return steps
