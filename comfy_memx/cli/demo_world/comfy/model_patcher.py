"""Stand-in for ComfyUI's ``comfy/model_patcher.py``: what every version's ``ModelPatcher`` shares; the class
itself (pinning, ``clone``, log texts) comes from the version layer, at the end.

Loading is simulated but does real per-tensor work: putting a weight on the simulated GPU copies it into its own
freshly allocated "device" buffer (kept in ``model._sim_device_weights``); offloading copies it back and drops the
buffer.  A CPU load device needs no copy.  ``model.model_loaded_weight_memory`` counts resident bytes.  Partial
loads and unloads move whole tensors.
"""

import logging
import uuid
from functools import reduce

import torch

import comfy.model_management
import stand_in_version


def _copy_options(value):
    if isinstance(value, dict):
        return {k: _copy_options(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_options(v) for v in value]
    return value


class _SharedModelPatcher:
    """What ``ModelPatcher`` is in every stand-in version (each version's class adds the rest)."""

    def _setup(self, model, load_device, offload_device, size, weight_inplace_update):
        """What every version's constructor sets (the version adds its own fields)."""
        self.size = size
        self.model = model
        if getattr(model, "device", None) is None:
            self.model.device = offload_device
        self.patches = {}
        self.backup = {}
        self.object_patches = {}
        self.object_patches_backup = {}
        self.model_options = {"transformer_options": {}}
        self.load_device = load_device
        self.offload_device = offload_device
        self.weight_inplace_update = weight_inplace_update
        self.force_cast_weights = False
        self.patches_uuid = uuid.uuid4()
        self.parent = None
        self.additional_models = {}
        for name, default in _MODULE_DEFAULTS:
            if not hasattr(self.model, name):
                setattr(self.model, name, default)
        if not hasattr(self.model, "_sim_device_weights"):
            self.model._sim_device_weights = {}

    def _clone(self):
        """A new patcher on the same torch module, with ``parent`` set and backups shared."""
        n = self.__class__(self.model, self.load_device, self.offload_device, self.model_size(),
                           weight_inplace_update=self.weight_inplace_update)
        n.patches = {k: v[:] for k, v in self.patches.items()}
        n.patches_uuid = self.patches_uuid
        n.object_patches = self.object_patches.copy()
        n.model_options = _copy_options(self.model_options)
        n.parent = self
        n.force_cast_weights = self.force_cast_weights
        n.backup, n.object_patches_backup = self.backup, self.object_patches_backup
        return n

    def _to_device(self, key, tensor, device_to):
        self._before_load(key)
        if comfy.model_management.is_device_cpu(device_to):
            self.model._sim_device_weights[key] = None
            return
        buffer = torch.empty_like(tensor)
        buffer.copy_(tensor)
        self.model._sim_device_weights[key] = buffer

    def load(self, device_to=None, lowvram_model_memory=0, force_patch_weights=False, full_load=False):
        """Put weights on ``device_to``, largest first, while they fit in ``lowvram_model_memory`` bytes."""
        on_device = self.model._sim_device_weights
        mem_counter = self.model.model_loaded_weight_memory
        left_out = []
        with torch.inference_mode():
            for key, tensor in sorted(self._weights(), key=lambda kv: -kv[1].nbytes):
                if key in on_device:
                    continue
                if full_load or mem_counter + tensor.nbytes <= lowvram_model_memory:
                    self._to_device(key, tensor, device_to)
                    mem_counter += tensor.nbytes
                else:
                    left_out.append((key, tensor.nbytes))
        for key, _ in left_out:
            self._after_offload(key)
        self._log_load(lowvram_model_memory, mem_counter, left_out, full_load)
        self.model.model_lowvram = bool(left_out)
        self.model.device = device_to
        self.model.model_loaded_weight_memory = mem_counter
        self.model.current_weight_patches_uuid = self.patches_uuid
        if on_device and not comfy.model_management.is_device_cpu(device_to):
            comfy.model_management.SIM_RESIDENT.add(self.model)

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        """With ``unpatch_weights``: release pins, offload every weight and zero the loaded-bytes counter."""
        if unpatch_weights:
            self._release_pins()
            with torch.inference_mode():
                for key in list(self.model._sim_device_weights):
                    self._to_offload(key)
            self.model.model_lowvram = False
            self.model.lowvram_patch_counter = 0
            self.model.current_weight_patches_uuid = None
            self.backup.clear()
            if device_to is not None:
                self.model.device = device_to
            self.model.model_loaded_weight_memory = 0
            self._after_unpatch()
            comfy.model_management.SIM_RESIDENT.discard(self.model)
        self.object_patches_backup.clear()

    def partially_unload(self, device_to, memory_to_free=0, force_patch_weights=False):
        """Offload resident weights (pinning them where the version pins), smallest first, until more than ``memory_to_free`` bytes are freed."""
        memory_freed = 0
        with torch.inference_mode():
            for nbytes, key in sorted((self._get_weight(k).nbytes, k) for k in self.model._sim_device_weights):
                if memory_to_free < memory_freed:
                    break
                self._to_offload(key)
                memory_freed += nbytes
                self._after_offload(key)
        self.model.model_lowvram = True
        self.model.model_loaded_weight_memory -= memory_freed
        self._log_partial_unload(memory_freed)
        return memory_freed

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        """Load ``extra_memory`` more bytes (negative: unload that much where the version does); returns bytes newly
        loaded."""
        module = self.model
        applied = module.current_weight_patches_uuid
        if applied is not None and (force_patch_weights or applied != self.patches_uuid):
            # Resident weights carry another patcher's patches: offload them and budget their bytes again.
            extra_memory += module.model_loaded_weight_memory
            self.unpatch_model(self.offload_device, unpatch_weights=True)
        elif extra_memory < 0 and self.UNLOADS_ON_NEGATIVE_EXTRA:
            self.partially_unload(self.offload_device, -extra_memory, force_patch_weights=force_patch_weights)
            return 0
        resident = module.model_loaded_weight_memory
        if resident > 0 and not module.model_lowvram:
            return 0
        try:
            self.load(device_to, lowvram_model_memory=resident + extra_memory, force_patch_weights=force_patch_weights,
                      full_load=resident + extra_memory > self.model_size())
        except Exception:
            self.detach()
            raise
        return module.model_loaded_weight_memory - resident

    def __del__(self):
        self._release_pins()
        self.detach(unpatch_all=False)

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


stand_in_version.apply_layer(globals())
