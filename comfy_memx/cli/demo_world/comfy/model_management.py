"""The demo world's model management: ComfyUI's LoadedModel / load_models_gpu / free_memory / cleanup_models_gc.

Same shapes and the semantics comfy_memx depends on: ``current_loaded_models`` (most recent first) holds
LoadedModel entries that know their ModelPatcher and torch module by weakref; ``free_memory`` unloads the
least-needed entries until the simulated GPU has room; ``cleanup_models_gc`` finds entries whose patcher is gone
while the module lives, logs the INFO line, collects garbage, and warns about the modules still alive.
"""

import gc
import logging
import weakref

import torch

SIM_VRAM_TOTAL = 8 * 1024 ** 3
GPU = torch.device("cuda", 0)
current_loaded_models = []


def get_torch_device():
    """The simulated GPU."""
    return GPU


def minimum_inference_memory():
    """Bytes kept free for inference."""
    return 64 * 1024 ** 2


def get_free_memory(device=None):
    """Free bytes on the simulated GPU."""
    used = sum(entry.model_loaded_memory() for entry in current_loaded_models if entry.model is not None)
    return SIM_VRAM_TOTAL - used


class LoadedModel:
    """One model ComfyUI manages: its patcher and torch module by weakref."""

    def __init__(self, model):
        self._model = weakref.ref(model)
        self.device = model.load_device
        self.real_model = None
        self.currently_used = True
        self.model_finalizer = None

    @property
    def model(self):
        """The ModelPatcher, or None once it was collected."""
        return self._model()

    def model_memory(self):
        return self.model.model_size()

    def model_loaded_memory(self):
        return self.model.loaded_size()

    def model_load(self, lowvram_model_memory=0, force_patch_weights=False):
        """Move the model onto its device; returns the torch module."""
        patcher = self.model
        patcher.partially_load(self.device, 1e32 if lowvram_model_memory == 0 else lowvram_model_memory)
        self.real_model = weakref.ref(patcher.model)
        self.model_finalizer = weakref.finalize(patcher.model, cleanup_models)
        return patcher.model

    def model_unload(self, memory_to_free=None, unpatch_weights=True):
        """Free ``memory_to_free`` bytes (partial unload: returns False) or unload fully (returns True)."""
        patcher = self.model
        if memory_to_free is not None and memory_to_free < patcher.loaded_size():
            if patcher.partially_unload(patcher.offload_device, memory_to_free) >= memory_to_free:
                return False
        patcher.detach(unpatch_weights)
        self.model_finalizer.detach()
        self.model_finalizer = None
        self.real_model = None
        return True

    def __eq__(self, other):
        return self.model is other.model

    def is_dead(self):
        return self.real_model() is not None and self.model is None


def free_memory(memory_required, device, keep_loaded=[]):
    """Unload models (most offloaded and smallest first) until ``memory_required`` bytes are free."""
    cleanup_models_gc()
    candidates = [(-entry.model_memory() + entry.model_loaded_memory(), entry.model_memory(), i)
                  for i, entry in enumerate(current_loaded_models)
                  if entry.model is not None and entry not in keep_loaded and not entry.is_dead()]
    unloaded = []
    for _, _, i in sorted(candidates):
        shortfall = memory_required - get_free_memory(device)
        if shortfall <= 0:
            break
        if current_loaded_models[i].model_unload(shortfall):
            unloaded.append(i)
    return [current_loaded_models.pop(i) for i in sorted(unloaded, reverse=True)]


def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None,
                    force_full_load=False):
    """Load ``models`` (ModelPatchers) onto the simulated GPU, making room first."""
    cleanup_models_gc()
    to_load = []
    for patcher in models:
        entry = LoadedModel(patcher)
        if entry in current_loaded_models:
            entry = current_loaded_models.pop(current_loaded_models.index(entry))
            entry.currently_used = True
        else:
            logging.info("Requested to load %s", type(patcher.model).__name__)
        to_load.append(entry)
    needed = sum(entry.model_memory() - entry.model_loaded_memory() for entry in to_load)
    free_memory(needed + minimum_inference_memory(), GPU, keep_loaded=to_load)
    for entry in to_load:
        entry.model_load()
        current_loaded_models.insert(0, entry)


def cleanup_models_gc():
    """ComfyUI's leak check: a patcher gone while its module lives is a cycle (collected) or a leak (warned)."""
    for entry in current_loaded_models:
        if entry.is_dead():
            logging.info("Potential memory leak detected with model %s, doing a full garbage collect, for maximum "
                         "performance avoid circular references in the model code.",
                         type(entry.real_model()).__name__)
            break
    else:
        return
    gc.collect()
    for entry in current_loaded_models:
        if entry.is_dead():
            logging.warning("WARNING, memory leak with model %s. Please make sure it is not being referenced from "
                            "somewhere.", type(entry.real_model()).__name__)


def cleanup_models():
    """Drop the entries whose torch module was collected (the module's finalizer calls this)."""
    current_loaded_models[:] = [e for e in current_loaded_models if e.real_model is None or e.real_model() is not None]


def unload_all_models():
    """Unload every model (ComfyUI's POST /free)."""
    free_memory(1e30, GPU)
