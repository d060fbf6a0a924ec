"""What every stand-in version's ``comfy/model_patcher`` shares (run in that module by ``extend``; the version's own file adds the rest).

Stand-in for ComfyUI 0.3.64 ``comfy/model_patcher.py``: ``ModelPatcher`` (no pinning, no dynamic VRAM).
"""
import logging
import uuid
from functools import reduce

import torch

import comfy.model_management


def _copy_options(value):
    if isinstance(value, dict):
        return {k: _copy_options(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_options(v) for v in value]
    return value


class _SharedModelPatcher:
    """What ``ModelPatcher`` is in every stand-in version (each version's class adds the rest)."""

    def model_size(self):
        """Bytes of all weights (computed once, or the ``size`` given to the constructor)."""
        if self.size > 0:
            return self.size
        self.size = comfy.model_management.module_size(self.model)
        return self.size

    def loaded_size(self):
        """Bytes of weights currently on the load device."""
        return self.model.model_loaded_weight_memory

    def lowvram_patch_counter(self):
        return self.model.lowvram_patch_counter

    def is_clone(self, other):
        """True when ``other`` wraps the same torch module."""
        return hasattr(other, "model") and self.model is other.model

    def model_patches_to(self, device):
        for patch_list in self.model_options["transformer_options"].get("patches", {}).values():
            for i, patch in enumerate(patch_list):
                if hasattr(patch, "to"):
                    patch_list[i] = patch.to(device)

    def model_patches_models(self):
        """Extra ModelPatchers that model patches (e.g. ControlNets) need loaded alongside this one."""
        models = []
        for patch_list in self.model_options["transformer_options"].get("patches", {}).values():
            for patch in patch_list:
                if hasattr(patch, "models"):
                    models += patch.models()
        return models

    def model_dtype(self):
        if hasattr(self.model, "get_dtype"):
            return self.model.get_dtype()

    def _weights(self):
        return list(self.model.named_parameters()) + list(self.model.named_buffers())

    def _get_weight(self, key):
        return reduce(getattr, key.split("."), self.model)

    def _to_offload(self, key):
        buffer = self.model._sim_device_weights.pop(key)
        if buffer is not None:
            self._get_weight(key).copy_(buffer)

    def detach(self, unpatch_all=True):
        """Move model patches to the offload device and, with ``unpatch_all``, offload every weight; returns the module."""
        self.model_patches_to(self.offload_device)
        if unpatch_all:
            self.unpatch_model(self.offload_device, unpatch_weights=unpatch_all)
        return self.model

    def current_loaded_device(self):
        """The device the module's weights were last loaded to (its offload device when unloaded)."""
        return self.model.device
