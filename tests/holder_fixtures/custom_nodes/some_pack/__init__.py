"""Fixture for tests/unit/test_holders.py: a fake custom-node package that keeps "models" alive the ways real
packs do.  ``hold(kind, model)`` keeps ``model`` in one way; ``release()`` forgets everything.

The tests import it as ComfyUI does, under its directory path as the module name.
"""

import functools
import threading

from . import model

HOOKS = {}
CALLBACKS = []
RECENT = []
SEEN = set()
BY_MODEL = {}
LAST_ERROR = []
GENERATORS = []
HOSTILE = []
BIG = []
TLS = threading.local()
CURRENT = None
_PENDING = {}


class State:
    def __init__(self):
        self.current = None


class SlotState:
    __slots__ = ("model",)


class Wrapper:
    def __init__(self, wrapped):
        self.model = wrapped


class HostileHolder:
    """Every hook a careless search would call raises (the object itself stays usable through object's own)."""

    def __init__(self, held):
        object.__setattr__(self, "held", held)

    def __getattribute__(self, name):
        raise RuntimeError(f"hostile __getattribute__({name})")

    def __getattr__(self, name):
        raise RuntimeError(f"hostile __getattr__({name})")

    def __repr__(self):
        raise RuntimeError("hostile __repr__")

    def __eq__(self, other):
        raise RuntimeError("hostile __eq__")

    __hash__ = object.__hash__


STATE = State()
SLOTS = SlotState()


def make_callback(model):
    def cb():
        return model
    return cb


@functools.lru_cache(maxsize=None)
def load_model(name):
    return _PENDING.pop(name)


def _explode():
    raise ValueError("sampling failed")


def remember_failure(model):
    try:
        _explode()
    except ValueError as exc:
        LAST_ERROR.append(exc)


def _stream(model):
    yield 1
    yield model


def hold(kind, obj):
    """Keep ``obj`` alive in the way named by ``kind``."""
    if kind == "class_cache":
        model.QwenImageModel().load_weights("qwen_2512.safetensors", 1024, lambda: obj)
    elif kind == "bound_method":
        HOOKS["preview"] = obj.preview
    elif kind == "closure":
        CALLBACKS.append(make_callback(obj))
    elif kind == "lru_cache":
        _PENDING["qwen"] = obj
        load_model("qwen")
    elif kind == "instance_dict":
        STATE.current = obj
    elif kind == "slots":
        SLOTS.model = obj
    elif kind == "list_tuple":
        RECENT.extend([None, (0, obj)])
    elif kind == "set_member":
        SEEN.add(Wrapper(obj))
    elif kind == "dict_key":
        BY_MODEL[obj] = "loaded"
    elif kind == "traceback_frame":
        remember_failure(obj)
    elif kind == "generator":
        stream = _stream(obj)
        next(stream)
        GENERATORS.append(stream)
    elif kind == "module_global":
        global CURRENT
        CURRENT = obj
    elif kind == "thread_local":
        TLS.model = obj
    elif kind == "hostile":
        HOSTILE.append({HostileHolder(None): HostileHolder(obj)})
    elif kind == "huge_list":
        BIG.extend([None] * 1_000_000)
        BIG.append(obj)
    else:
        raise ValueError(kind)


def release():
    """Forget every object ``hold`` kept."""
    model.QwenImageModel._cache.clear()
    global CURRENT
    for container in (HOOKS, CALLBACKS, RECENT, SEEN, BY_MODEL, LAST_ERROR, GENERATORS, HOSTILE, BIG, _PENDING):
        container.clear()
    load_model.cache_clear()
    STATE.current = None
    CURRENT = None
    TLS.__dict__.clear()
    if hasattr(SLOTS, "model"):
        del SLOTS.model
