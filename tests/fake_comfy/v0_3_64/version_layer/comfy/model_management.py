"""ComfyUI 0.3.64's part of ``comfy/model_management.py``: no pinned memory at all, a 3-parameter
``free_memory`` that stops early with smart memory, ``set()`` de-dup in ``load_models_gpu``, the 128 MiB lowvram
floor, ``OOM_EXCEPTION`` without ``is_oom``, and ``unload_all_models()`` over the current device only.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""


def module_size(module):
    """Bytes of every tensor in ``module``'s state dict."""
    return sum(t.nelement() * t.element_size() for t in module.state_dict().values())


class LoadedModel(_SharedLoadedModel):
    """One entry of ``current_loaded_models``: weak references to a ModelPatcher and, once loaded, its module."""

    FINALIZERS_AT_EXIT = True
    SWITCH_TAKES_PARENT_DEVICE = False


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


def _wanted_patchers(models):
    """The patchers and the extra models their patches need."""
    # COMFY: 0.3.64 de-duplicates through a set, so the load order of several models is arbitrary.
    return {p for m in models for p in (m, *m.model_patches_models())}


def _free_options(wanted):
    return {}


def _pin_bytes(entry):
    """0.3.64 pins nothing."""
    return 0


def _pin_request(pin_bytes):
    return {}


def _budget_left(usable, minimum_memory_required, resident):
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


def _after_sim_device():
    pass
