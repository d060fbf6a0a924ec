"""Fixture for tests/test_holders.py: a fake custom-node package that keeps "models" alive the ways real
packs do.  ``hold(kind, model)`` keeps ``model`` in one way; ``release()`` forgets everything.

The tests import it as ComfyUI does, under its directory path as the module name.
"""

import functools

from . import model

HOOKS = {}
CALLBACKS = []
RECENT = []
SEEN = set()
BY_MODEL = {}
LAST_ERROR = []
GENERATORS = []
_PENDING = {}


class State:
    def __init__(self):
        self.current = None


class SlotState:
    __slots__ = ("model",)


class Wrapper:
    def __init__(self, wrapped):
        self.model = wrapped


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
    else:
        raise ValueError(kind)


def release():
    """Forget every object ``hold`` kept."""
    model.QwenImageModel._cache.clear()
    for container in (HOOKS, CALLBACKS, RECENT, SEEN, BY_MODEL, LAST_ERROR, GENERATORS, _PENDING):
        container.clear()
    load_model.cache_clear()
    STATE.current = None
    if hasattr(SLOTS, "model"):
        del SLOTS.model
