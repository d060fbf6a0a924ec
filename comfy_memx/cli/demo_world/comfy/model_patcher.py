"""The demo world's ``ModelPatcher``: a torch module, its devices, and how many of its bytes are "on the GPU"."""

import torch


class ModelPatcher:
    """Wraps a torch module; loading and offloading only move the count of resident bytes (simulated GPU)."""

    def __init__(self, model, load_device, offload_device):
        self.model = model
        self.load_device = load_device
        self.offload_device = offload_device
        self.parent = None
        if not hasattr(model, "model_loaded_weight_memory"):
            model.model_loaded_weight_memory = 0

    def model_size(self):
        """Bytes of all weights."""
        return sum(t.nbytes for t in self.model.state_dict().values())

    def loaded_size(self):
        """Bytes resident on the load device."""
        return self.model.model_loaded_weight_memory

    def is_clone(self, other):
        """True when ``other`` patches the same torch module."""
        return getattr(other, "model", None) is self.model

    def partially_load(self, device, extra_memory=0, force_patch_weights=False):
        """Move up to ``extra_memory`` more bytes to ``device`` (whole model when it fits); returns bytes moved."""
        moved = min(self.model_size() - self.loaded_size(), int(extra_memory))
        self.model.model_loaded_weight_memory += moved
        return moved

    def partially_unload(self, device, memory_to_free=0, force_patch_weights=False):
        """Move up to ``memory_to_free`` bytes back to ``device``; returns bytes freed."""
        freed = min(self.loaded_size(), int(memory_to_free))
        self.model.model_loaded_weight_memory -= freed
        return freed

    def detach(self, unpatch_all=True):
        """Move every weight back to the offload device; returns the torch module."""
        self.model.model_loaded_weight_memory = 0
        return self.model


class SimModel(torch.nn.Module):
    """A stand-in diffusion model: ``tensors`` parameters of ``numel`` float32 each."""

    def __init__(self, tensors=8, numel=256 * 1024):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(numel)) for _ in range(tensors))
