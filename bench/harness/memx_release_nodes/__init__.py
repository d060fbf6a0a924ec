"""A ComfyUI node pack whose loaders keep their models the way pack authors write caches (``bench.soak``'s
``release`` workload: does comfy_memx's release cut them, and does the pack keep working after it?).

``bench.soak --workload release`` copies this folder into the ``custom_nodes/`` of each server it starts, so the
package comfy_memx names for these loaders is this folder's name, ``memx_release_nodes``. Each loader hands ComfyUI a
fresh ``ModelPatcher`` around a torch module it keeps in a cache of its own; once ComfyUI's output cache drops that
patcher, the module is still alive and ComfyUI's ``cleanup_models_gc`` warns about a leak. The caches:

* ``MemxReleaseResolutionLoader``: a class-level dict keyed by resolution ``(width, height)``, as in
  ``../shared/seeds/003``'s ``QwenImageModel._cache`` (one model per aspect ratio, never dropped);
* ``MemxReleaseNamedLoader``: a module-level function decorated with ``functools.lru_cache(maxsize=None)``
  (unbounded) returning the module by name; ``MemxReleaseBoundedLoader``: the same with a bounded
  ``lru_cache(maxsize=BOUNDED_MAXSIZE)``, larger than any soak, so it never evicts on its own;
* ``MemxReleaseListLoader``: a module-level list, ``LOADED_MODULES``, to which every built module is appended (and
  which the loader searches by name before building).

Every cache is a cache in the full sense: a lookup that misses builds the module again, with weights seeded from
its key, so an entry that was cut (by comfy_memx's release) is recomputed, bit for bit, the next time it is needed.
With the environment variable ``MEMX_RELEASE_NODES_CACHE=off`` the loaders keep nothing (the class dict and the
list are not written, the undecorated function is called): the same pack after its author fixed the leak, which
the soak runs on one plain ComfyUI server as the memory baseline.

``MemxReleaseRender`` loads the MODEL through ``comfy.model_management.load_models_gpu`` (what real samplers do), runs
one deterministic forward pass on seeded noise and returns an IMAGE (``width`` x ``height``) for ComfyUI's own
``SaveImage``, so that the images of two servers, or of one prompt before and after a release, compare byte for
byte. ``MemxReleaseCensus`` reports, from inside the server, which of the pack's modules are alive (a ``WeakSet``, so
the census keeps nothing alive) and what each cache holds: the ground truth for survivors, independent of comfy_memx.

V1 node API only, so the same code loads in ComfyUI 0.3.64, 0.27.0 and 0.33.0. torch and ``comfy.*`` are imported
inside functions: ComfyUI has imported them before it loads custom nodes, and this module stays importable without
them (the soak's offline tests read ``NODE_CLASS_MAPPINGS``).
"""

import functools
import hashlib
import os
import weakref

CATEGORY = "memx/release"
NET_CLASS_NAME = "MemxReleaseNet"
BOUNDED_MAXSIZE = 4096
CACHE_SWITCH = "MEMX_RELEASE_NODES_CACHE"

_NET_CLASS = None
# Every module the pack has built, weakly: the census reads it, nothing here keeps a module alive.
_BUILT = weakref.WeakSet()

# Leak pattern 3: every built module is appended here, and never removed.
LOADED_MODULES = []


def caching():
    """Whether the loaders keep what they build (``MEMX_RELEASE_NODES_CACHE`` is not ``off``)."""
    return os.environ.get(CACHE_SWITCH, "on").strip().lower() != "off"


def release_net_class():
    """Return the torch module class of the pack's models, created on first use (imports torch lazily)."""
    global _NET_CLASS
    if _NET_CLASS is None:
        import torch

        class MemxReleaseNet(torch.nn.Module):
            """A stack of ``depth`` square Linear layers with ReLU in between (``features**2 * depth`` weights)."""

            def __init__(self, features, depth):
                super().__init__()
                self.layers = torch.nn.ModuleList(torch.nn.Linear(features, features) for _ in range(depth))

            def forward(self, x):
                for index, layer in enumerate(self.layers):
                    x = layer(x)
                    if index + 1 < len(self.layers):
                        x = torch.relu(x)
                return x

            def get_dtype(self):
                """The weight dtype, as ComfyUI's model classes report it (``ModelPatcher.model_dtype``)."""
                return self.layers[0].weight.dtype

        _NET_CLASS = MemxReleaseNet
    return _NET_CLASS


def model_bytes(features, depth):
    """The bytes of one model's float32 weights and biases (what one leaked model keeps alive)."""
    return 4 * depth * (features * features + features)


def seed_from_text(text):
    """A stable 63-bit seed from a string: the same key always builds the same weights."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


def build_module(key, features, depth):
    """Build one model named ``key`` with weights seeded from it, without disturbing torch's global generator."""
    import torch

    state = torch.random.get_rng_state()
    torch.manual_seed(seed_from_text(f"{key}/{features}/{depth}"))
    try:
        module = release_net_class()(features, depth)
    finally:
        torch.random.set_rng_state(state)
    module.eval()
    module.memx_release_key = key
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


SIZE_INPUTS = {
    "features": ("INT", {"default": 1024, "min": 8, "max": 8192}),
    "depth": ("INT", {"default": 4, "min": 1, "max": 64}),
}
RESOLUTION_INPUT = ("INT", {"default": 64, "min": 8, "max": 1024, "step": 8})


class MemxReleaseResolutionLoader:
    """Leak pattern 1: a class-level weight cache keyed by resolution, as in the seed's ``QwenImageModel._cache``."""

    _cache = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"width": RESOLUTION_INPUT, "height": RESOLUTION_INPUT, **SIZE_INPUTS}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, width, height, features, depth):
        """A new patcher around the module for ``(width, height)``, built when the cache has none."""
        cache_key = (width, height)
        module = self._cache.get(cache_key)
        if module is None:
            module = build_module(f"resolution:{width}x{height}", features, depth)
            if caching():
                self._cache[cache_key] = module
        return (wrap(module),)


@functools.lru_cache(maxsize=None)
def load_named_model(name, features, depth):
    """Leak pattern 2: the module called ``name``, built once and kept by an unbounded ``lru_cache``."""
    return build_module(f"named:{name}", features, depth)


@functools.lru_cache(maxsize=BOUNDED_MAXSIZE)
def load_bounded_model(name, features, depth):
    """Leak pattern 2, bounded: the same with ``lru_cache(maxsize=BOUNDED_MAXSIZE)``."""
    return build_module(f"bounded:{name}", features, depth)


def _call(cached, *args):
    return cached(*args) if caching() else cached.__wrapped__(*args)


NAME_INPUTS = {"required": {"name": ("STRING", {"default": "model"}), **SIZE_INPUTS}}


class MemxReleaseNamedLoader:
    """The model called ``name`` from the unbounded ``lru_cache`` function :func:`load_named_model`."""

    source = "load_named_model"   # the cached function, by its global name: the class itself holds no cache

    @classmethod
    def INPUT_TYPES(cls):
        return NAME_INPUTS

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, name, features, depth):
        """A new patcher around the cached module (built on a cache miss)."""
        return (wrap(_call(globals()[self.source], name, features, depth)),)


class MemxReleaseBoundedLoader(MemxReleaseNamedLoader):
    """The model called ``name`` from the bounded ``lru_cache`` function :func:`load_bounded_model`."""

    source = "load_bounded_model"


class MemxReleaseListLoader:
    """Leak pattern 3: every module it builds is appended to the module-level ``LOADED_MODULES``."""

    @classmethod
    def INPUT_TYPES(cls):
        return NAME_INPUTS

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, name, features, depth):
        """A new patcher around the listed module called ``name``, built and appended when the list has none."""
        key = f"list:{name}"
        module = next((m for m in LOADED_MODULES if getattr(m, "memx_release_key", None) == key), None)
        if module is None:
            module = build_module(key, features, depth)
            if caching():
                LOADED_MODULES.append(module)
        return (wrap(module),)


class MemxReleaseRender:
    """Load the MODEL through ComfyUI's model management, run it on seeded noise and return a ``width`` x ``height``
    IMAGE (deterministic: the same weights and seed give the same pixels)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",),
                             "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF}),
                             "width": RESOLUTION_INPUT, "height": RESOLUTION_INPUT}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "render"
    CATEGORY = CATEGORY

    def render(self, model, seed, width, height):
        import torch
        import comfy.model_management

        comfy.model_management.load_models_gpu([model])
        module = model.model
        features = module.layers[0].in_features
        values = width * height * 3
        rows = -(-values // features)
        generator = torch.Generator(device="cpu").manual_seed(seed % (2 ** 63))
        noise = torch.randn(rows, features, generator=generator)
        with torch.no_grad():
            out = module(noise.to(model.load_device)).float().cpu().flatten()[:values]
        return (torch.sigmoid(out).reshape(1, height, width, 3),)


class MemxReleaseCensus:
    """Report what is alive in the server: the pack's modules by key, what each cache holds, and ComfyUI's model
    objects by kind."""

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
        alive = list(_BUILT)
        record = {
            "nonce": nonce,
            "alive": sorted(getattr(module, "memx_release_key", "?") for module in alive),
            "alive_bytes": sum(sum(p.numel() * p.element_size() for p in module.parameters()) for module in alive),
            "held": {"resolution": len(MemxReleaseResolutionLoader._cache),
                     "named": load_named_model.cache_info().currsize,
                     "bounded": load_bounded_model.cache_info().currsize,
                     "list": len(LOADED_MODULES)},
            "caching": caching(),
            **counts,
        }
        del alive
        return {"ui": {"memx_release_census": [record]}}


NODE_CLASS_MAPPINGS = {
    "MemxReleaseResolutionLoader": MemxReleaseResolutionLoader,
    "MemxReleaseNamedLoader": MemxReleaseNamedLoader,
    "MemxReleaseBoundedLoader": MemxReleaseBoundedLoader,
    "MemxReleaseListLoader": MemxReleaseListLoader,
    "MemxReleaseRender": MemxReleaseRender,
    "MemxReleaseCensus": MemxReleaseCensus,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "MemxReleaseResolutionLoader": "Memx release loader, class cache by resolution (leaks)",
    "MemxReleaseNamedLoader": "Memx release loader, lru_cache (leaks)",
    "MemxReleaseBoundedLoader": "Memx release loader, bounded lru_cache (leaks)",
    "MemxReleaseListLoader": "Memx release loader, module list (leaks)",
    "MemxReleaseRender": "Memx release render",
    "MemxReleaseCensus": "Memx release census",
}
