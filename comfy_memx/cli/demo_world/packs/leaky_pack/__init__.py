"""A custom-node pack with the classic leak: a class-level cache of models, shared by every instance."""

import torch

import comfy.model_management
from comfy.model_patcher import ModelPatcher, SimModel


class LeakyLoader:
    """Loads a model; with ``leak`` it also keeps the torch module in ``LeakyLoader._cache`` forever."""
    FUNCTION = "load"
    _cache = {}

    def load(self, name, tensors, numel, leak):
        model = SimModel(tensors, numel)
        if leak:
            LeakyLoader._cache[name] = model
        patcher = ModelPatcher(model, comfy.model_management.GPU, torch.device("cpu"))
        comfy.model_management.load_models_gpu([patcher])
        return (patcher,)


NODE_CLASS_MAPPINGS = {"LeakyLoader": LeakyLoader}
