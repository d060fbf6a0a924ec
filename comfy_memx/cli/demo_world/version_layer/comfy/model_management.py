"""ComfyUI 0.27.0's part of ``comfy/model_management.py``: ``free_memory`` without the smart-memory ``break`` and
with the pin-budget step, order-kept de-dup, ``is_oom``, ``unload_all_models()`` over every device,
``unload_model_and_clones`` and legacy tensor pinning (``cudaHostRegister``/``cudaHostUnregister`` go to
:data:`HOST_REGISTER`, a replaceable backend that logs calls).

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

import comfy.memory_management


class SimHostRegister:
    """Replaceable stand-in for cudaHostRegister/cudaHostUnregister; ``calls`` records every call in order."""

    def __init__(self):
        self.calls = []
        self.registered = {}
        self.fail = False

    def register(self, ptr, size):
        """Register ``size`` bytes at ``ptr``; False when ``fail`` is set or ``ptr`` is already registered."""
        self.calls.append(("register", ptr, size))
        if self.fail or ptr in self.registered:
            return False
        self.registered[ptr] = size
        return True

    def unregister(self, ptr):
        """Unregister ``ptr``; False when it was not registered."""
        self.calls.append(("unregister", ptr))
        return self.registered.pop(ptr, None) is not None
HOST_REGISTER = SimHostRegister()


def get_all_torch_devices(exclude_current=False):
    """Every device of the current state (one here), optionally without the current one."""
    devices = [get_torch_device()]
    if exclude_current:
        devices.remove(get_torch_device())
    return devices
ACCELERATOR_ERROR = getattr(torch, "AcceleratorError", RuntimeError)


def discard_cuda_async_error():
    """Nothing to discard: the simulated GPU raises no asynchronous errors."""


def is_oom(e):
    """True for an out-of-memory exception, as ComfyUI 0.27.0 recognises them."""
    if isinstance(e, OOM_EXCEPTION):
        return True
    if isinstance(e, ACCELERATOR_ERROR) and (getattr(e, "error_code", None) == 2 or "out of memory" in str(e).lower()):
        discard_cuda_async_error()
        return True
    return False


class LoadedModel(_SharedLoadedModel):
    """One entry of ``current_loaded_models``: weak references to a ModelPatcher and, once loaded, its module."""

    FINALIZERS_AT_EXIT = False
    SWITCH_TAKES_PARENT_DEVICE = True   # a clone's entry moves to its parent's device


def module_size(module):
    """Bytes of every tensor in ``module``'s state dict."""
    return sum(t.nbytes for t in module.state_dict().values())


def free_pins(size, evict_active=False):
    """Free up to ``size`` bytes of DynamicVRAM pins, LRU first; returns bytes freed (0: no dynamic models here)."""
    freed = 0
    for entry in reversed(current_loaded_models):
        if freed >= size:
            break
        patcher = entry.model
        if patcher is None or not patcher.is_dynamic():
            continue
        if evict_active or not patcher.model.dynamic_pins[patcher.load_device]["active"]:
            freed += patcher.partially_unload_ram(size - freed)
    return freed


def ensure_pin_budget(size, evict_active=False):
    """True when ``size`` more bytes may be pinned without squeezing RAM, freeing pins when short."""
    if args.high_ram:
        return True
    if args.fast_disk:
        shortfall = TOTAL_PINNED_MEMORY + size - MAX_PINNED_MEMORY
    else:
        reserve = max(comfy.memory_management.RAM_CACHE_HEADROOM / 2, 2048 * 1024 ** 2)
        shortfall = size + reserve - _ram_available()
    if shortfall <= 0:
        return True
    return free_pins(shortfall + PIN_PRESSURE_HYSTERESIS, evict_active=evict_active) >= shortfall


def free_registrations(shortfall, evict_active=True):
    """Unregister dynamic pins until ``shortfall`` (+ hysteresis) is covered; False when pinning is off."""
    if MAX_PINNED_MEMORY <= 0:
        return False
    if shortfall <= 0:
        return True
    # COMFY: overshoot, since every unregistration costs a GPU sync; inactive models LRU first, then active MRU first.
    remaining = shortfall + REGISTERABLE_PIN_HYSTERESIS
    order = [(entry, False) for entry in reversed(current_loaded_models)]
    if evict_active:
        order += [(entry, True) for entry in current_loaded_models]
    for entry, active in order:
        patcher = entry.model
        if patcher is None or not patcher.is_dynamic():
            continue
        if patcher.model.dynamic_pins[patcher.load_device]["active"] == active:
            remaining -= patcher.unregister_inactive_pins(remaining)
            if remaining <= 0:
                return True
    return remaining <= REGISTERABLE_PIN_HYSTERESIS


def ensure_pin_registerable(size, evict_active=True):
    """Make room under MAX_PINNED_MEMORY for ``size`` more registered bytes."""
    return free_registrations(TOTAL_PINNED_MEMORY + size - MAX_PINNED_MEMORY, evict_active=evict_active)


def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False, pins_required=0, ram_required=0):
    """Unload models from ``device`` (None: all) until ``memory_required`` is free; returns popped entries.

    Victims are tried in ``sorted()`` order of (-offloaded bytes, patcher refcount, size, index).
    """
    cleanup_models_gc()
    fully_unloaded = []
    for *_, index in sorted(_unload_candidates(device, keep_loaded)):
        entry = current_loaded_models[index]
        to_free = 1e32
        if device is None or not DISABLE_SMART_MEMORY:
            to_free = 0 if device is None else memory_required - get_free_memory(device)
            if entry.model.is_dynamic() and for_dynamic:
                # COMFY: dynamic models hand VRAM back on demand; only count what they hold.
                memory_required -= entry.model.loaded_size()
                to_free = 0
        if to_free > 0 and entry.model_unload(to_free):
            logging.debug(f"Unloading {entry.model.model.__class__.__name__}")
            fully_unloaded.append(index)

    popped = [current_loaded_models.pop(index) for index in sorted(fully_unloaded, reverse=True)]

    if pins_required > 0 and not for_dynamic:
        ensure_pin_budget(pins_required)
        ensure_pin_registerable(pins_required)

    _empty_cache_after_free(device, popped)
    return popped


def _unload_candidates(device, keep_loaded):
    """The sort keys of ``free_memory``'s victims on ``device`` (None: all), each marked as no longer in use."""
    candidates = []
    for index in reversed(range(len(current_loaded_models))):
        entry = current_loaded_models[index]
        if (device is None or entry.device == device) and entry not in keep_loaded and not entry.is_dead():
            candidates.append((-entry.model_offloaded_memory(), sys.getrefcount(entry.model), entry.model_memory(), index))
            entry.currently_used = False
    return candidates


def _empty_cache_after_free(device, popped):
    """``soft_empty_cache()`` when models were popped, or when torch's cache holds over a quarter of the free VRAM."""
    if popped:
        soft_empty_cache()
    elif device is not None and vram_state != VRAMState.HIGH_VRAM:
        free_total, free_torch = get_free_memory(device, torch_free_too=True)
        if free_torch > free_total * 0.25:
            soft_empty_cache()


def _wanted_patchers(models):
    """The patchers and the extra models their patches need, first-seen order kept, then reversed."""
    wanted = list(dict.fromkeys(p for m in models for p in (m, *m.model_patches_models())))
    wanted.reverse()
    return wanted


def _free_options(wanted):
    return {"for_dynamic": all(p.is_dynamic() for p in wanted)}


def _pin_bytes(entry):
    """The pinned host memory ``entry`` will need (dynamic models pin nothing up front)."""
    return 0 if entry.model.is_dynamic() else entry.model_memory()


def _pin_request(pin_bytes):
    return {"pins_required": pin_bytes}


def _budget_left(usable, minimum_memory_required, resident):
    budget = max(0, usable - minimum_memory_required,
                 min(usable * MIN_WEIGHT_MEMORY_RATIO, usable - minimum_inference_memory())) - resident
    return 0.1 if budget == 0 else budget


def cast_to(weight, dtype=None, device=None, non_blocking=False, copy=False, stream=None, r=None):
    """Cast/move a tensor (trivial here; hook_breaker_ac10a0 restores this attribute after custom nodes load)."""
    return weight.to(device=device, dtype=dtype, non_blocking=non_blocking, copy=copy)


PINNED_MEMORY = {}
TOTAL_PINNED_MEMORY = 0
MAX_PINNED_MEMORY = -1


def _pin_cap():
    if args.disable_pinned_memory or not (is_nvidia() or is_amd()):
        return -1
    ram = get_total_memory(torch.device("cpu"))
    return ram * 0.40 if WINDOWS else ram * 0.90


MAX_PINNED_MEMORY = _pin_cap()
if MAX_PINNED_MEMORY > 0:
    logging.info("Enabled pinned memory {}".format(MAX_PINNED_MEMORY // (1024 * 1024)))

PINNING_ALLOWED_TYPES = set(["Tensor", "Parameter", "QuantizedTensor"])


def pin_memory(tensor):
    """Register a CPU tensor as pinned through HOST_REGISTER; True on success, False when refused or failed."""
    global TOTAL_PINNED_MEMORY
    if MAX_PINNED_MEMORY <= 0 or type(tensor).__name__ not in PINNING_ALLOWED_TYPES:
        return False
    # Already pinned (stands in for tensor.is_pinned()), not contiguous or not on the CPU: refuse.
    if not is_device_cpu(tensor.device) or tensor.data_ptr() in PINNED_MEMORY or not tensor.is_contiguous():
        return False
    size = tensor.nbytes
    comfy.memory_management.extra_ram_release(comfy.memory_management.RAM_CACHE_HEADROOM)
    ensure_pin_registerable(size)
    address = tensor.data_ptr()
    if address == 0:
        return False
    if not HOST_REGISTER.register(address, size):
        logging.warning("Pin error.")
        discard_cuda_async_error()
        return False
    PINNED_MEMORY[address] = size
    TOTAL_PINNED_MEMORY += size
    return True


def unpin_memory(tensor):
    """Unregister a tensor pinned by :func:`pin_memory`; True on success."""
    global TOTAL_PINNED_MEMORY
    if MAX_PINNED_MEMORY <= 0 or not is_device_cpu(tensor.device):
        return False
    address = tensor.data_ptr()
    if address not in PINNED_MEMORY:
        logging.warning("Tried to unpin tensor not pinned by ComfyUI")
        return False
    if PINNED_MEMORY[address] != tensor.nbytes:
        logging.warning("Size of pinned tensor changed")
        return False
    if not HOST_REGISTER.unregister(address):
        logging.warning("Unpin error.")
        discard_cuda_async_error()
        return False
    size = PINNED_MEMORY.pop(address)  # COMFY: popped into a local first, as ComfyUI does (one atomic step each)
    TOTAL_PINNED_MEMORY -= size
    return True


def reset_cast_buffers():
    """End of a node under DynamicVRAM: every dynamic loaded model becomes inactive and loses its ``patches`` pins.

    The real one also syncs offload streams, bounces dirty mmaps, prunes pin buckets and recreates the patches host
    buffer; here only the pin effect is modelled (the stand-in's own patchers are never dynamic, tests add some).
    """
    for entry in list(current_loaded_models):
        patcher = entry.model
        if patcher is None or not patcher.is_dynamic():
            continue
        patcher.model.dynamic_pins[patcher.load_device]["active"] = False
        patcher.partially_unload_ram(1e30, subsets=["patches"])
    soft_empty_cache()


def soft_empty_cache(force=False):
    """Release cached GPU memory (counted in SIM_EMPTY_CACHE_CALLS); nothing to do in CPU mode."""
    global SIM_EMPTY_CACHE_CALLS
    if cpu_mode():
        return
    SIM_EMPTY_CACHE_CALLS += 1


def unload_all_models():
    """Fully unload every model (the ``/free`` and OOM path)."""
    for device in get_all_torch_devices():
        free_memory(1e30, device)


def unload_model_and_clones(model, unload_additional_models=True, all_devices=False):
    """Unload ``model`` and every loaded clone of it (same clone_base_uuid), keeping everything else."""
    family = {model.clone_base_uuid}
    if unload_additional_models:
        family |= {extra.clone_base_uuid for extra in model.get_nested_additional_models()}
    keep_loaded = [entry for entry in list(current_loaded_models)
                   if entry.model is None or entry.model.clone_base_uuid not in family]
    for device in (get_all_torch_devices() if all_devices else [get_torch_device()]):
        free_memory(1e30, device, keep_loaded)


def _after_sim_device():
    global MAX_PINNED_MEMORY
    MAX_PINNED_MEMORY = _pin_cap()
