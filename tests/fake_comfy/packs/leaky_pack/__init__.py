"""A custom-node pack of our own that leaks on request, for leak-detection tests.

``LeakyLoader`` builds a model and loads it through ``load_models_gpu`` from the pack's own code.  With
``leak=True`` it also keeps the torch module in the class-level dict ``LeakyLoader._cache[name]``, the classic
custom-node mistake: once ComfyUI drops the ModelPatcher, ``cleanup_models_gc`` finds the entry dead but the
module alive and warns "memory leak with model BaseModel".  ``LeakySampler`` loads its input model again.
Works with both fake shapes (and imports comfy at module top like a real pack).
"""
import comfy.model_base
import comfy.model_management
import comfy.model_patcher


class LeakyLoader:
    _cache = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "leaky"}), "tensor_count": ("INT", {"default": 4}),
                             "tensor_numel": ("INT", {"default": 1024}), "leak": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"

    def load(self, name="leaky", tensor_count=4, tensor_numel=1024, leak=False):
        mm = comfy.model_management
        module = comfy.model_base.BaseModel(tensor_count, tensor_numel)
        if leak:
            LeakyLoader._cache[name] = module
        patcher = comfy.model_patcher.ModelPatcher(module, load_device=mm.get_torch_device(),
                                                   offload_device=mm.unet_offload_device())
        mm.load_models_gpu([patcher])
        return (patcher,)


class LeakySampler:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "sample"
    OUTPUT_NODE = True

    def sample(self, model):
        comfy.model_management.load_models_gpu([model])
        return (model.loaded_size(),)


NODE_CLASS_MAPPINGS = {"LeakyLoader": LeakyLoader, "LeakySampler": LeakySampler}
