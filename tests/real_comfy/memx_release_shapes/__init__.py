"""A test pack that keeps ComfyUI's MODEL (a ModelPatcher, or a clone of it) the ways published packs keep models:
a weak-keyed memo of clones keyed by the MODEL, a dict of lists of checkpoint tuples, ``cachetools`` caches (when
cachetools is installed), a tagged mapping class over them, an ``OrderedDict`` of clones that pops its oldest, a
``defaultdict`` and a deque.  ``MemxKeepInShape`` stores its MODEL input in the shape it is told; nothing lets go of
it, so once ComfyUI unloads the model and empties its caches (``/memx/free``) the pack is its only holder.
"""

import collections
import weakref

try:
    import cachetools
except ImportError:   # the cachetools shapes are then not offered
    cachetools = None

CATEGORY = "memx/test"
PATCHED = weakref.WeakKeyDictionary()      # MODEL -> {(kind, key): MODEL.clone()}
LOADED = {}                                # folder -> [(name, model, clip, vae, ids), ...]
CKPTS = cachetools.LRUCache(maxsize=5) if cachetools else None
RECENT = cachetools.TTLCache(maxsize=8, ttl=24 * 3600) if cachetools else None
CLONES = collections.OrderedDict()         # clones kept on purpose, at most MAX_CLONES
MAX_CLONES = 16
BY_ARCH = collections.defaultdict(list)
HISTORY = collections.deque(maxlen=8)


class TaggedCache:
    """One LRU cache per tag (a plain dict without cachetools); values are ``(tag, (is_list, data))``."""

    def __init__(self, sizes=None):
        self._sizes = sizes or {}
        self._data = {}

    def __getitem__(self, key):
        for per_tag in self._data.values():
            if key in per_tag:
                return per_tag[key]
        raise KeyError(key)

    def __setitem__(self, key, value):
        for per_tag in self._data.values():
            per_tag.pop(key, None)
        tag = value[0]
        if tag not in self._data:
            self._data[tag] = cachetools.LRUCache(maxsize=self._sizes.get(tag, 5)) if cachetools else {}
        self._data[tag][key] = value

    def __delitem__(self, key):
        for per_tag in self._data.values():
            if key in per_tag:
                del per_tag[key]
                return
        raise KeyError(key)

    def __contains__(self, key):
        return any(key in per_tag for per_tag in self._data.values())


backend = TaggedCache({"ckpt": 5})


def _weak_memo(model, key):
    PATCHED.setdefault(model, {})[("cfg_rescale", key)] = model.clone()


def _dict_of_lists(model, key):
    LOADED.setdefault("tiny", []).append((key, model, None, None, [1, 2]))


def _ordered(model, key):
    CLONES[key] = model.clone()
    while len(CLONES) > MAX_CLONES:
        CLONES.popitem(last=False)


SHAPES = {
    "weak_memo": _weak_memo,
    "dict_of_lists": _dict_of_lists,
    "ordered_clones": _ordered,
    "defaultdict": lambda model, key: BY_ARCH[key].append(model),
    "deque": lambda model, key: HISTORY.append((key, model)),
}
if cachetools is not None:
    SHAPES.update({
        "lru": lambda model, key: CKPTS.__setitem__(key, (model, None, None)),
        "ttl": lambda model, key: RECENT.__setitem__(key, (model, None, None)),
        "tagged": lambda model, key: backend.__setitem__(key, ("ckpt", (False, (model, None, None)))),
    })


class MemxKeepInShape:
    """Keeps its MODEL input in the pack's container of the given shape, under ``key``."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "shape": (sorted(SHAPES),), "key": ("STRING", {"default": "a"})}}

    RETURN_TYPES = ()
    FUNCTION = "keep"
    CATEGORY = CATEGORY
    OUTPUT_NODE = True

    def keep(self, model, shape, key):
        SHAPES[shape](model, key)
        return {"ui": {"memx_kept": [{"shape": shape, "key": key}]}}


NODE_CLASS_MAPPINGS = {"MemxKeepInShape": MemxKeepInShape}
NODE_DISPLAY_NAME_MAPPINGS = {"MemxKeepInShape": "Memx keep in shape (test)"}
