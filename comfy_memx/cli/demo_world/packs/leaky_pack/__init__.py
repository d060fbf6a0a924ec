"""A custom-node pack with the classic leak: a class-level cache of models, shared by every instance."""

import comfy.model_base
import comfy.model_management
import comfy.model_patcher


class LeakyLoader:
    """Loads a model; with ``leak`` it also keeps the torch module in ``LeakyLoader._cache`` forever."""
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    _cache = {}

    def load(self, name, tensors, numel, leak):
        model = comfy.model_base.BaseModel(tensors, numel)
        if leak:
            LeakyLoader._cache[name] = model
        mm = comfy.model_management
        patcher = comfy.model_patcher.ModelPatcher(model, mm.get_torch_device(), mm.unet_offload_device())
        mm.load_models_gpu([patcher])
        return (patcher,)


NODE_CLASS_MAPPINGS = {"LeakyLoader": LeakyLoader}
