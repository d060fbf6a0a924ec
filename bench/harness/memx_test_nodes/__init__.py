"""Model-free ComfyUI test nodes for checking comfy_memx against a real ComfyUI server.

The pack is copied into the ``custom_nodes/`` of a server's base directory by ``bench/harness/drive.py``
(or into ``<ComfyUI>/custom_nodes/`` by its ``install_node_pack``). It uses the V1
node API (INPUT_TYPES, RETURN_TYPES, FUNCTION, CATEGORY, OUTPUT_NODE) so that the same code loads in
ComfyUI 0.3.64, 0.27.0 and 0.33.0.

* ``MemxTinyModelLoader`` builds a small torch module (a few MB of Linear layers) and returns it wrapped
  in ``comfy.model_patcher.ModelPatcher`` as a MODEL.
* ``MemxTinySampler`` loads that MODEL through ``comfy.model_management.load_models_gpu`` and runs one
  forward pass.
* ``MemxLeakyCache`` loads the MODEL the same way and then keeps the torch module (not the patcher) in
  a class-level dict: once ComfyUI drops the patcher, ComfyUI's own leak check reports the module.
* ``MemxReleaseCache`` empties that dict (the pack lets go of its leaked modules).
* ``MemxSleep`` sleeps, so that a prompt is running while a test sends ``/free`` or ``/memx/free``.
* ``MemxWeightProbe`` passes any value through and reports, for a MODEL, where its first weights live (device,
  storage address) and ComfyUI's own accounting (``loaded_size()``, whether ``current_loaded_models`` holds it):
  a ground truth for "did a load or an unload move bytes" that does not depend on comfy_memx.

torch and ``comfy.*`` are imported inside functions only: ComfyUI has imported them before it loads
custom nodes, and the module stays importable without them for consistency tests.
"""

import hashlib
import time

CATEGORY = "memx/testing"

_TINY_NET_CLASS = None


def tiny_net_class():
    """Return the torch module class used for test models, creating it on first use.

    Created lazily so that importing this pack does not import torch; the class name
    ``MemxTinyNet`` is what ComfyUI prints in its "memory leak" log lines.
    """
    global _TINY_NET_CLASS
    if _TINY_NET_CLASS is None:
        import torch

        class MemxTinyNet(torch.nn.Module):
            """A stack of Linear layers with ReLU in between; small, deterministic, model-file free."""

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
                """Report the weight dtype the way ComfyUI's model classes do (ModelPatcher.model_dtype)."""
                return self.layers[0].weight.dtype

        _TINY_NET_CLASS = MemxTinyNet
    return _TINY_NET_CLASS


def seed_from_text(text):
    """Turn a string into a stable 63-bit seed, so the same loader input always builds the same weights."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") >> 1


class MemxTinyModelLoader:
    """Build a few-MB torch module and hand it to ComfyUI as a MODEL (a ModelPatcher)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "name": ("STRING", {"default": "tiny"}),
                "width": ("INT", {"default": 512, "min": 8, "max": 4096}),
                "depth": ("INT", {"default": 4, "min": 1, "max": 64}),
            }
        }

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, name, width, depth):
        """Create the module with weights seeded from ``name`` and wrap it in a ModelPatcher."""
        import torch
        import comfy.model_management
        import comfy.model_patcher

        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed_from_text(name))
        try:
            module = tiny_net_class()(width, depth)
        finally:
            torch.random.set_rng_state(generator_state)
        module.eval()
        patcher = comfy.model_patcher.ModelPatcher(
            module,
            load_device=comfy.model_management.get_torch_device(),
            offload_device=comfy.model_management.unet_offload_device(),
        )
        return (patcher,)


def _forward_checksum(patcher, seed):
    """Load ``patcher`` through ComfyUI's model management and return the sum of one forward pass."""
    import torch
    import comfy.model_management

    comfy.model_management.load_models_gpu([patcher])
    module = patcher.model
    width = module.layers[0].in_features
    generator = torch.Generator(device="cpu").manual_seed(seed)
    sample = torch.randn(1, width, generator=generator)
    with torch.no_grad():
        result = module(sample.to(patcher.load_device))
    return float(result.sum().item())


class MemxTinySampler:
    """Run the MODEL once; an output node so that a prompt made of loader -> sampler executes."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL",),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFF}),
            }
        }

    RETURN_TYPES = ()
    FUNCTION = "sample"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def sample(self, model, seed):
        """Load the model the way real samplers do and report a checksum in the UI output."""
        checksum = _forward_checksum(model, seed)
        return {"ui": {"memx_sample": [{"seed": seed, "checksum": checksum}]}}


class MemxLeakyCache:
    """Deliberately leak: keep the torch module of every MODEL it sees in a class-level dict.

    The patcher itself is not kept, so when ComfyUI's output cache lets go of the patcher the module
    stays alive here and ComfyUI's ``cleanup_models_gc`` reports a memory leak for it.
    """

    _cache = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model": ("MODEL",),
                "key": ("STRING", {"default": "leak"}),
            }
        }

    RETURN_TYPES = ()
    FUNCTION = "keep"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def keep(self, model, key):
        """Load the model, then store its torch module under ``key`` (the leak)."""
        checksum = _forward_checksum(model, 0)
        type(self)._cache[key] = model.model
        return {"ui": {"memx_leak": [{"key": key, "held": len(type(self)._cache), "checksum": checksum}]}}


class MemxReleaseCache:
    """Let go of every module ``MemxLeakyCache`` keeps (the pack fixes its leak)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"token": ("STRING", {"default": "release"})}}

    RETURN_TYPES = ()
    FUNCTION = "release"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def release(self, token):
        released = sorted(MemxLeakyCache._cache)
        MemxLeakyCache._cache.clear()
        return {"ui": {"memx_release": [{"token": token, "released": released}]}}


class MemxSleep:
    """Sleep ``seconds`` (a prompt that keeps ComfyUI's worker busy for a while)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 60.0, "step": 0.1}),
                             "token": ("STRING", {"default": "sleep"})}}

    RETURN_TYPES = ()
    FUNCTION = "sleep"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def sleep(self, seconds, token):
        started = time.time()
        time.sleep(seconds)
        return {"ui": {"memx_sleep": [{"token": token, "started": started, "ended": time.time()}]}}


class AnyType(str):
    """A type name equal to every other under ComfyUI's ``!=`` input check (the usual custom-node idiom)."""

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


ANY = AnyType("*")


def weight_facts(patcher):
    """Where ``patcher``'s weights live and what ComfyUI accounts for them; plain JSON values only."""
    import comfy.model_management

    module = patcher.model
    facts = {"model": type(module).__name__, "loaded_size": int(patcher.loaded_size()),
             "model_size": int(patcher.model_size()),
             "in_loaded_list": any(entry.model is patcher for entry in comfy.model_management.current_loaded_models),
             "weights": []}
    for name, param in list(module.named_parameters())[:4]:
        facts["weights"].append({"name": name, "device": str(param.device), "dtype": str(param.dtype),
                                 "data_ptr": int(param.data_ptr()), "bytes": int(param.nelement() *
                                                                                 param.element_size())})
    return facts


class MemxWeightProbe:
    """Pass ``value`` through and report :func:`weight_facts` of ``model`` (loads nothing, moves nothing)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": (ANY,), "model": ("MODEL",), "label": ("STRING", {"default": "probe"})}}

    RETURN_TYPES = (ANY,)
    RETURN_NAMES = ("value",)
    FUNCTION = "probe"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def probe(self, value, model, label):
        facts = dict(weight_facts(model), label=label, time=time.time())
        return {"ui": {"memx_probe": [facts]}, "result": (value,)}


NODE_CLASS_MAPPINGS = {
    "MemxTinyModelLoader": MemxTinyModelLoader,
    "MemxTinySampler": MemxTinySampler,
    "MemxLeakyCache": MemxLeakyCache,
    "MemxReleaseCache": MemxReleaseCache,
    "MemxSleep": MemxSleep,
    "MemxWeightProbe": MemxWeightProbe,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "MemxTinyModelLoader": "Memx tiny model loader (test)",
    "MemxTinySampler": "Memx tiny sampler (test)",
    "MemxLeakyCache": "Memx leaky cache (test)",
    "MemxReleaseCache": "Memx release leaky cache (test)",
    "MemxSleep": "Memx sleep (test)",
    "MemxWeightProbe": "Memx weight probe (test)",
}
