"""Stand-in for ComfyUI 0.3.64 ``comfy/model_management.py`` (memory API only; test double, no ComfyUI code).

Public names, signatures, globals, log texts and the eviction/leak semantics follow the real module
(reference sections 2-6 and 14; see tests/fake_comfy/README.md).  0.3.64 has no pinned memory at all, a
3-parameter ``free_memory`` that stops early with smart memory, and unloads only the current device.
Everything else is simulated:

* The GPU is a label, ``SIM_GPU`` (``cuda:0``).  Its capacity is ``SIM_VRAM_TOTAL`` bytes and its use is the
  loaded bytes of every torch module resident on it (``SIM_RESIDENT``), so shrinking ``SIM_VRAM_TOTAL`` creates
  memory pressure.  :func:`set_sim_device` switches between that GPU and a ``--cpu`` shape.
* ``SIM_RAM_AVAILABLE`` (bytes) overrides psutil's available RAM when not None.
"""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy/model_management")



def module_size(module):
    """Bytes of every tensor in ``module``'s state dict."""
    return sum(t.nelement() * t.element_size() for t in module.state_dict().values())


class LoadedModel(_SharedLoadedModel):
    """One entry of ``current_loaded_models``: weak references to a ModelPatcher and, once loaded, its module."""

    def _set_model(self, model):
        self._model = weakref.ref(model)
        if model.parent is None:
            return
        self._parent_model = weakref.ref(model.parent)
        self._patcher_finalizer = weakref.finalize(model, self._switch_parent)

    def _switch_parent(self):
        parent = self._parent_model()
        if parent is not None:
            self._set_model(parent)

    def model_load(self, lowvram_model_memory=0, force_patch_weights=False):
        """Load up to ``lowvram_model_memory`` bytes (0 = everything), then watch the torch module."""
        patcher = self.model
        patcher.model_patches_to(self.device)
        patcher.model_patches_to(patcher.model_dtype())
        budget = 1e32 if lowvram_model_memory == 0 else lowvram_model_memory
        self.model_use_more_vram(budget, force_patch_weights=force_patch_weights)
        module = patcher.model
        self.real_model = weakref.ref(module)
        self.model_finalizer = weakref.finalize(module, cleanup_models)
        return module


def free_memory(memory_required, device, keep_loaded=[]):
    """Unload models from ``device`` until ``memory_required`` is free; returns the entries popped.

    Victims are tried in ``sorted()`` order of (-offloaded bytes, patcher refcount, size, index); with smart
    memory the loop stops as soon as enough is free and may unload the last victim only partially.
    """
    cleanup_models_gc()
    candidates = []
    for index in reversed(range(len(current_loaded_models))):
        entry = current_loaded_models[index]
        if entry.device == device and entry not in keep_loaded and not entry.is_dead():
            candidates.append((-entry.model_offloaded_memory(), sys.getrefcount(entry.model), entry.model_memory(), index))
            entry.currently_used = False

    fully_unloaded = []
    for *_, index in sorted(candidates):
        to_free = None
        if not DISABLE_SMART_MEMORY:
            free_now = get_free_memory(device)
            if free_now > memory_required:
                break
            to_free = memory_required - free_now
        entry = current_loaded_models[index]
        logging.debug(f"Unloading {entry.model.model.__class__.__name__}")
        if entry.model_unload(to_free):
            fully_unloaded.append(index)

    popped = [current_loaded_models.pop(index) for index in sorted(fully_unloaded, reverse=True)]

    if popped:
        soft_empty_cache()
    elif vram_state != VRAMState.HIGH_VRAM:
        free_total, free_torch = get_free_memory(device, torch_free_too=True)
        if free_torch > free_total * 0.25:
            soft_empty_cache()
    return popped


def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None, force_full_load=False):
    """Make ``models`` resident on their load devices, evicting others as needed; returns None."""
    cleanup_models_gc()

    inference_memory = minimum_inference_memory()
    extra_mem = max(inference_memory, memory_required + extra_reserved_memory())
    if minimum_memory_required is None:
        minimum_memory_required = extra_mem
    else:
        minimum_memory_required = max(inference_memory, minimum_memory_required + extra_reserved_memory())

    # COMFY: 0.3.64 de-duplicates through a set, so the load order of several models is arbitrary.
    wanted = {p for m in models for p in (m, *m.model_patches_models())}

    entries = []
    for patcher in wanted:
        candidate = LoadedModel(patcher)
        known = next((entry for entry in current_loaded_models if entry == candidate), None)
        if known is not None:
            known.currently_used = True
            entries.append(known)
            continue
        if hasattr(patcher, "model"):
            logging.info(f"Requested to load {patcher.model.__class__.__name__}")
        entries.append(candidate)

    for entry in entries:
        # COMFY: entries sharing the torch module (the entry itself too) leave the list without model_unload;
        # their weights stay where they are for the new entry to reuse.
        shared = [i for i, other in enumerate(current_loaded_models) if entry.model.is_clone(other.model)]
        for i in reversed(shared):
            stale = current_loaded_models.pop(i)
            stale.model.detach(unpatch_all=False)
            stale.model_finalizer.detach()

    needed = {}
    for entry in entries:
        needed[entry.device] = needed.get(entry.device, 0) + entry.model_memory_required(entry.device)
    accelerators = [dev for dev in needed if dev != torch.device("cpu")]

    for dev in accelerators:
        free_memory(needed[dev] * 1.1 + extra_mem, dev)
    for dev in accelerators:
        if get_free_memory(dev) < minimum_memory_required:
            unloaded = free_memory(minimum_memory_required, dev)
            logging.info("{} models unloaded.".format(len(unloaded)))

    for entry in entries:
        entry.model_load(_weight_budget(entry, minimum_memory_required, force_full_load), force_patch_weights=force_patch_weights)
        current_loaded_models.insert(0, entry)


def _weight_budget(entry, minimum_memory_required, force_full_load):
    """Bytes of weights ``entry`` may put on its device: 0 means all of them, 0.1 practically none."""
    device = entry.model.load_device
    state = VRAMState.DISABLED if is_device_cpu(device) else vram_state
    if state == VRAMState.NO_VRAM:
        return 0.1
    if force_full_load or not lowvram_available or state not in (VRAMState.LOW_VRAM, VRAMState.NORMAL_VRAM):
        return 0
    resident = entry.model_loaded_memory()
    usable = get_free_memory(device) + resident
    budget = max(128 * 1024 * 1024, usable - minimum_memory_required,
                 min(usable * MIN_WEIGHT_MEMORY_RATIO, usable - minimum_inference_memory()))
    return max(0.1, budget - resident)


def cast_to(weight, dtype=None, device=None, non_blocking=False, copy=False, stream=None):
    """Cast/move a tensor (trivial here; hook_breaker_ac10a0 restores this attribute after custom nodes load)."""
    return weight.to(device=device, dtype=dtype, non_blocking=non_blocking, copy=copy)


def soft_empty_cache(force=False):
    """Release cached GPU memory (counted in SIM_EMPTY_CACHE_CALLS); 0.3.64 has no CPU-mode early return, but
    without a CUDA device there is nothing to release."""
    global SIM_EMPTY_CACHE_CALLS
    if cpu_state == CPUState.GPU:
        SIM_EMPTY_CACHE_CALLS += 1


def unload_all_models():
    """Fully unload every model (the ``/free`` and OOM path)."""
    free_memory(1e30, get_torch_device())


def set_sim_device(kind, vram_total=None):
    """Switch the simulation to ``"cuda"`` (the simulated GPU) or ``"cpu"`` (as with ``--cpu``).

    Recomputes what real ComfyUI derives from the device at import: vram_state and total_vram.
    Call it before loading models; models already loaded keep their old device.
    """
    global cpu_state, vram_state, set_vram_to, total_vram, SIM_VRAM_TOTAL, MIN_WEIGHT_MEMORY_RATIO
    if kind not in ("cpu", "cuda"):
        raise ValueError("kind must be 'cpu' or 'cuda'")
    if vram_total is not None:
        SIM_VRAM_TOTAL = vram_total
    cpu_state = CPUState.CPU if kind == "cpu" else CPUState.GPU
    vram_state = set_vram_to = _vram_state_for(cpu_state)
    total_vram = get_total_memory(get_torch_device()) / (1024 * 1024)
    MIN_WEIGHT_MEMORY_RATIO = 0.0 if is_nvidia() else 0.4
