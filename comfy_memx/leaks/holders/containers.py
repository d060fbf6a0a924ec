"""What kind of holder an object is, read from its type alone: a container, a mapping class, ComfyUI's own object, a
torch model or tensor.  No code of the object runs (``type()``, ``type``'s own descriptors and class namespaces only).

Packs keep models in the standard containers (dict and its subclasses, list, tuple, set, deque), in the standard
library's weak dictionaries, in ``cachetools`` caches and in mapping classes of their own that wrap one of those.  A
*mapping object* is an instance of a class (none of the above, no torch module) that defines a mapping's methods
(``__getitem__``, ``__delitem__``, ``pop`` or ``__contains__``) and keeps its entries in a standard container among
its attributes: ``weakref.WeakKeyDictionary`` (``.data``), a ``cachetools.Cache`` (``._Cache__data``), Inspire-Pack's
``TaggedCache`` (``._data``).  Its public ``__delitem__`` (else ``pop``) is how an entry is removed so that the
object's own bookkeeping (an LRU order, a size count) stays true (:func:`remover_of`).
"""

import collections
import functools
import sys
import types
import weakref

from comfy_memx.leaks.holders.labels import class_module
from comfy_memx.leaks.holders.packages import module_namespace

_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]
_LRU_WRAPPER = type(functools.lru_cache(maxsize=None)(len))
STANDARD = (dict, list, tuple, set, frozenset, collections.deque)
MAPPING_METHODS = ("__getitem__", "__delitem__", "pop", "__contains__")
#: Top-level modules of ComfyUI itself: instances of their classes are ComfyUI's objects (wrappers, caches, nodes).
COMFYUI_TOP_MODULES = frozenset({"comfy", "comfy_extras", "comfy_execution", "comfy_api", "comfy_api_nodes",
                                 "comfy_config", "execution", "nodes", "server", "app", "latent_preview",
                                 "node_helpers", "folder_paths"})
_NOT_HOLDERS = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
                types.CodeType, types.FrameType, weakref.ReferenceType)


def mro(cls):
    """``cls.__mro__`` through ``type``'s own descriptor (a metaclass never runs)."""
    try:
        return _TYPE_MRO.__get__(cls)
    except Exception:
        return (cls,)


def class_lookup(cls, name):
    """What ``name`` is bound to in the first class of ``cls``'s MRO that defines it, ``object`` left out (None)."""
    for base in mro(cls):
        if base is object:
            continue
        try:
            value = _TYPE_DICT.__get__(base).get(name)
        except Exception:
            return None
        if value is not None:
            return value
    return None


def is_comfyui_class(cls):
    """True for a class of ComfyUI itself (its module's top-level name is one of :data:`COMFYUI_TOP_MODULES`)."""
    return class_module(cls).split(".", 1)[0] in COMFYUI_TOP_MODULES


def is_standard(cls):
    """True for the standard containers and their subclasses (``OrderedDict``, ``defaultdict``, a namedtuple)."""
    return issubclass(cls, STANDARD)


def is_mapping_class(cls, torch_module=None):
    """True for a mapping class (see the module docstring): none of the standard containers, no class, function or
    module, no torch module (``torch_module``: ``torch.nn.Module`` when loaded), and a mapping method defined."""
    if issubclass(cls, STANDARD + _NOT_HOLDERS) or cls is _LRU_WRAPPER:
        return False
    if torch_module is not None and torch_module in mro(cls):
        return False
    return any(class_lookup(cls, name) is not None for name in MAPPING_METHODS)


def is_cache_structure(cls, torch_module=None):
    """True for the containers a pack builds its cache of (never part of one entry's own objects): a mapping class,
    a ``functools.lru_cache``, a deque, an ``OrderedDict`` or ``defaultdict``."""
    return (cls is _LRU_WRAPPER or issubclass(cls, (collections.deque, collections.OrderedDict,
                                                      collections.defaultdict))
            or is_mapping_class(cls, torch_module))


def remover_of(cls):
    """``(name, function)`` of the public method that removes one entry of a mapping class: its ``__delitem__``,
    else its ``pop``; None when it has neither (the entry is then cut from the standard container inside it)."""
    for name in ("__delitem__", "pop"):
        function = class_lookup(cls, name)
        if function is not None and callable(function):
            return name, function
    return None


def public_key(owner, key):
    """The key ``owner``'s own ``__delitem__`` takes for the entry stored under ``key`` in its storage: a
    ``WeakKeyDictionary`` stores a weak reference to its key (the referent is the key; None when it died)."""
    if issubclass(type(owner), weakref.WeakKeyDictionary) and isinstance(key, weakref.ref):
        return key()
    return key


def torch_kinds():
    """``(torch.nn.Module or None, ids of the tensor and storage base classes)`` of the torch this process loaded
    (nothing is imported: without torch both are empty)."""
    torch = sys.modules.get("torch")
    if not isinstance(torch, types.ModuleType):
        return None, frozenset()
    names = module_namespace(torch)
    bases = [names.get("UntypedStorage"), names.get("TypedStorage"), names.get("Tensor")]
    c_module = names.get("_C")
    if isinstance(c_module, types.ModuleType):
        c_names = module_namespace(c_module)
        bases += [c_names.get("TensorBase"), c_names.get("_TensorBase")]
    nn_module = sys.modules.get("torch.nn.modules.module")
    module_cls = module_namespace(nn_module).get("Module") if isinstance(nn_module, types.ModuleType) else None
    return (module_cls if issubclass(type(module_cls), type) else None,
            frozenset(id(base) for base in bases if issubclass(type(base), type)))
