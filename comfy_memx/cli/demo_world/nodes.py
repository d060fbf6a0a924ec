"""The demo world's nodes: a core loader and sampler, and ``load_custom_node`` for a custom-node pack."""

import importlib.util
import os
import sys

import torch

import comfy.model_management
from comfy.model_patcher import ModelPatcher, SimModel


class SimModelLoader:
    """A core node that loads a model (like CheckpointLoaderSimple)."""
    FUNCTION = "load"

    def load(self, tensors, numel):
        return (ModelPatcher(SimModel(tensors, numel), comfy.model_management.GPU, torch.device("cpu")),)


class SimSampler:
    """A core node that puts its model on the GPU (like KSampler)."""
    FUNCTION = "sample"

    def sample(self, model):
        comfy.model_management.load_models_gpu([model])
        return (None,)


NODE_CLASS_MAPPINGS = {"SimModelLoader": SimModelLoader, "SimSampler": SimSampler}


def load_custom_node(path):
    """Import the pack at ``path`` (a folder under a ``custom_nodes`` directory) and register its nodes."""
    name = os.path.basename(path)
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    for key, node in module.NODE_CLASS_MAPPINGS.items():
        NODE_CLASS_MAPPINGS.setdefault(key, node)
    return module
