"""A leaking ComfyUI node pack for ``bench.soak``: about six small models kept alive on purpose.

``bench.soak`` copies this folder into the ``custom_nodes/`` of each server it starts. The pack keeps its
models alive the two ways that real custom nodes leak (``../shared/seeds/003``):

* ``MemxSoakCachedLoader`` keeps every torch module it builds in a class-level weight cache (``_cache = {}`` on
  the class, shared by all instances) and hands ComfyUI a fresh ``ModelPatcher`` around the cached module on
  each call. Once ComfyUI's output cache drops that patcher, the module is still alive, and ComfyUI's own
  ``cleanup_models_gc`` reports it as a memory leak (on every later prompt, as long as the entry stays).
* ``MemxSoakHookedLoader`` registers, for every module it builds, a bound method of a hook object and a
  closure in the module-level ``HOOK_REGISTRY``; both reference the module, and nothing ever unregisters them.

Both caches are keyed by ``slot``: a request for a slot with another ``name`` replaces the slot's entry, so the
previous module is released (by the pack; ComfyUI must then be able to free it, and comfy_memx must not keep it
alive). The soak uses six slots (three per loader), so about six models are leaked at any time.

``MemxSoakSampler`` loads a MODEL through ``comfy.model_management.load_models_gpu`` (what real samplers do) and
runs one forward pass. ``MemxSoakCensus`` reports, from inside the server, which of the pack's modules are alive
(a ``WeakSet``, so the census itself keeps nothing alive) and how many ComfyUI model objects exist, which gives
the soak a ground truth that does not depend on comfy_memx.

V1 node API only, so the same code loads in ComfyUI 0.3.64, 0.27.0 and 0.33.0. torch and ``comfy.*`` are
imported inside functions: ComfyUI has imported them before it loads custom nodes, and this module stays
importable without them (the soak's offline tests read ``NODE_CLASS_MAPPINGS``).
"""

import hashlib
import weakref

CATEGORY = "memx/soak"
NET_CLASS_NAME = "MemxSoakNet"

_NET_CLASS = None
# Every module the pack has built, weakly: the census reads it, nothing here keeps a module alive.
_BUILT = weakref.WeakSet()

# Module-level hook registry: slot -> {"name": ..., "hooks": [bound method, closure]}. Never cleaned up.
HOOK_REGISTRY = {}


def soak_net_class():
    """Return the torch module class of the pack's models, created on first use (imports torch lazily)."""
    global _NET_CLASS
    if _NET_CLASS is None:
        import torch

        class MemxSoakNet(torch.nn.Module):
            """A small stack of Linear layers with ReLU in between (``width * width * depth`` weights)."""

            def __init__(self, width, depth):
                super().__init__()
                self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

            def forward(self, x):
                for index, layer in enumerate(self.layers):
                    x = layer(x)
                    if index + 1 < len(self.layers):
                        x = torch.relu(x)
                return x

            def get_dtype(self):
                """The weight dtype, as ComfyUI's model classes report it (``ModelPatcher.model_dtype``)."""
                return self.layers[0].weight.dtype

        _NET_CLASS = MemxSoakNet
    return _NET_CLASS


def seed_from_text(text):
    """A stable 63-bit seed from a string: the same ``name`` always builds the same weights."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


def build_module(name, width, depth):
    """Build one model with weights seeded from ``name``, without disturbing torch's global generator."""
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(seed_from_text(name))
    try:
        module = soak_net_class()(width, depth)
    finally:
        torch.random.set_rng_state(state)
    module.eval()
    module.memx_soak_name = name
    _BUILT.add(module)
    return module


def wrap(module):
    """A fresh ComfyUI ModelPatcher around ``module`` (what a MODEL output is)."""
    import comfy.model_management
    import comfy.model_patcher

    return comfy.model_patcher.ModelPatcher(
        module,
        load_device=comfy.model_management.get_torch_device(),
        offload_device=comfy.model_management.unet_offload_device(),
    )


LOADER_INPUTS = {
    "required": {
        "slot": ("STRING", {"default": "s0"}),
        "name": ("STRING", {"default": "soak"}),
        "width": ("INT", {"default": 256, "min": 8, "max": 4096}),
        "depth": ("INT", {"default": 4, "min": 1, "max": 64}),
    }
}


class MemxSoakCachedLoader:
    """Leak pattern 1: a class-level weight cache, as in the seed's ``QwenImageModel._cache``."""

    _cache = {}

    @classmethod
    def INPUT_TYPES(cls):
        return LOADER_INPUTS

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, slot, name, width, depth):
        """Return a new patcher around the slot's cached module, building it when the slot holds another name."""
        entry = type(self)._cache.get(slot)
        if entry is None or entry[0] != name:
            type(self)._cache[slot] = (name, build_module(name, width, depth))
        return (wrap(type(self)._cache[slot][1]),)


class _StepHook:
    """A per-model hook object; its bound method in HOOK_REGISTRY keeps the model alive through ``__self__``."""

    def __init__(self, module):
        self.module = module
        self.calls = 0

    def on_step(self):
        self.calls += 1
        return self.calls


def _make_closure(module):
    """A closure over ``module`` (the second way a hook registry holds a model)."""

    def after_step():
        return module.training

    return after_step


class MemxSoakHookedLoader:
    """Leak pattern 2: a module-level hook registry holding a bound method and a closure per model."""

    @classmethod
    def INPUT_TYPES(cls):
        return LOADER_INPUTS

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, slot, name, width, depth):
        """Return a new patcher around the slot's hooked module, building (and hooking) it for a new name."""
        entry = HOOK_REGISTRY.get(slot)
        if entry is None or entry["name"] != name:
            module = build_module(name, width, depth)
            HOOK_REGISTRY[slot] = {"name": name, "hooks": [_StepHook(module).on_step, _make_closure(module)]}
            entry = HOOK_REGISTRY[slot]
        module = entry["hooks"][0].__self__.module
        return (wrap(module),)


class MemxSoakSampler:
    """Load the MODEL through ComfyUI's model management and run it once; an output node."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL",),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF}),
            }
        }

    RETURN_TYPES = ()
    FUNCTION = "sample"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def sample(self, model, seed):
        import torch
        import comfy.model_management

        comfy.model_management.load_models_gpu([model])
        module = model.model
        generator = torch.Generator(device="cpu").manual_seed(seed % (2 ** 63))
        sample = torch.randn(1, module.layers[0].in_features, generator=generator)
        with torch.no_grad():
            checksum = float(module(sample.to(model.load_device)).sum().item())
        return {"ui": {"memx_soak_sample": [{"name": getattr(module, "memx_soak_name", None), "seed": seed,
                                             "checksum": checksum}]}}


class MemxSoakCensus:
    """Report what is alive in the server: the pack's modules by name, and ComfyUI's model objects by kind."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"nonce": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF})}}

    RETURN_TYPES = ()
    FUNCTION = "count"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def count(self, nonce):
        import gc

        import comfy.model_base
        import comfy.model_patcher

        gc.collect()
        kinds = {"model_patchers": comfy.model_patcher.ModelPatcher, "base_models": comfy.model_base.BaseModel}
        counts = dict.fromkeys(kinds, 0)
        for obj in gc.get_objects():
            kind = type(obj)  # not isinstance: that reads __class__, which some lazy module proxies warn about
            for key, cls in kinds.items():
                if issubclass(kind, cls):
                    counts[key] += 1
        alive = sorted(getattr(module, "memx_soak_name", "?") for module in list(_BUILT))
        held = sorted([entry[0] for entry in MemxSoakCachedLoader._cache.values()]
                      + [entry["name"] for entry in HOOK_REGISTRY.values()])
        return {"ui": {"memx_soak_census": [{"nonce": nonce, "alive": alive, "held": held, **counts}]}}


NODE_CLASS_MAPPINGS = {
    "MemxSoakCachedLoader": MemxSoakCachedLoader,
    "MemxSoakHookedLoader": MemxSoakHookedLoader,
    "MemxSoakSampler": MemxSoakSampler,
    "MemxSoakCensus": MemxSoakCensus,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "MemxSoakCachedLoader": "Memx soak loader, class-level cache (leaks)",
    "MemxSoakHookedLoader": "Memx soak loader, hook registry (leaks)",
    "MemxSoakSampler": "Memx soak sampler",
    "MemxSoakCensus": "Memx soak census",
}
