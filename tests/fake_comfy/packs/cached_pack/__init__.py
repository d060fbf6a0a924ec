"""A custom-node pack of our own that keeps models the way published packs do, for the release tests.

``CachedLoader`` keeps each torch module it builds in the class-level dict ``CachedLoader._cache[name]`` and, when
asked for a name again, hands out a new ModelPatcher of the cached module (a cache hit: the pack "loads" the same
model again, as the Qwen-image packs do).  ``HookedLoader`` registers a callback that returns its module in the
module-level list ``HOOKS`` (a callback registry: not a cache that may be cut).  ``SlowPass`` and ``SlowAfter`` are
slow nodes that hold the MODEL they were given until the test sets ``Slow.go``: ``SlowPass`` passes it on (a node
holding the model the pack just gave it, before anything loaded it), ``SlowAfter`` runs after its ``value`` input
(the model was loaded again earlier in the prompt).  Works with both stand-in shapes.
"""
import threading
import time

import comfy.model_base
import comfy.model_management
import comfy.model_patcher

HOOKS = []


def _patcher(module):
    mm = comfy.model_management
    return comfy.model_patcher.ModelPatcher(module, load_device=mm.get_torch_device(),
                                            offload_device=mm.unet_offload_device())


class _Loader:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "model"}), "tensor_count": ("INT", {"default": 4}),
                             "tensor_numel": ("INT", {"default": 1024})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"


class CachedLoader(_Loader):
    _cache = {}

    def load(self, name="model", tensor_count=4, tensor_numel=1024):
        if name not in CachedLoader._cache:
            CachedLoader._cache[name] = comfy.model_base.BaseModel(tensor_count, tensor_numel)
        return (_patcher(CachedLoader._cache[name]),)


class HookedLoader(_Loader):
    def load(self, name="model", tensor_count=4, tensor_numel=1024):
        module = comfy.model_base.BaseModel(tensor_count, tensor_numel)

        def on_progress():
            return module
        HOOKS.append(on_progress)
        return (_patcher(module),)


class Slow:
    """The test's handle on the slow nodes: ``entered`` is set when one runs, ``go`` lets it finish, ``left`` is
    when it did (``time.time()``)."""
    entered = threading.Event()
    go = threading.Event()
    left = None

    @classmethod
    def hold(cls):
        cls.entered.set()
        assert cls.go.wait(60), "the test never let the slow node go"
        cls.left = time.time()


class SlowPass:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"

    def run(self, model):
        Slow.hold()
        return (model,)


class SlowAfter:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "value": ("INT",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    OUTPUT_NODE = True

    def run(self, model, value):
        Slow.hold()
        return (value,)


NODE_CLASS_MAPPINGS = {"CachedLoader": CachedLoader, "HookedLoader": HookedLoader, "SlowPass": SlowPass,
                       "SlowAfter": SlowAfter}
