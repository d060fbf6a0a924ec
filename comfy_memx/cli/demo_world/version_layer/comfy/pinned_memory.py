"""Stand-in for ComfyUI 0.27.0 ``comfy/pinned_memory.py``: per-module pins (DynamicVRAM style), simplified.

The real module carves pins out of comfy-aimdo host buffers and can steal a pin from a lower-priority module.
Here a pin is a plain uint8 CPU tensor registered through ``comfy.model_management.HOST_REGISTER``; budget and
registration checks and the TOTAL_PINNED_MEMORY bookkeeping are the real ones, stealing is left out.
Registered bytes per subset are counted in ``module._pin_state[subset]["pinned_size"][0]``.
"""
import torch

import comfy.memory_management
import comfy.model_management
from comfy.cli_args import args


def _subset_state(module, subset):
    states = getattr(module, "_pin_state", None)
    if states is None:
        states = {}
        module._pin_state = states
    return states.setdefault(subset, {"pinned_size": [0]})


def _register(module, subset, pin):
    size = pin.nbytes
    if not comfy.model_management.HOST_REGISTER.register(pin.data_ptr(), size):
        comfy.model_management.discard_cuda_async_error()
        return False
    module._pin_registered = True
    comfy.model_management.TOTAL_PINNED_MEMORY += size
    _subset_state(module, subset)["pinned_size"][0] += size
    return True


def get_pin(module, subset="weights"):
    """The module's pin tensor or None; an unregistered pin is registered again first (if the cap allows)."""
    pin = getattr(module, "_pin", None)
    if pin is None or module._pin_registered or args.disable_pinned_memory:
        return pin
    comfy.model_management.ensure_pin_registerable(pin.nbytes)
    _register(module, subset, pin)
    return pin


def pin_memory(module, subset="weights", size=None):
    """Pin ``size`` bytes (default: weight+bias, 1 KiB aligned) for ``module``.

    Returns None when pinning is disabled or the module is already pinned, True when pinned, False when the
    budget or the registration refused it.
    """
    if args.disable_pinned_memory:
        return None
    if get_pin(module, subset) is not None:
        return None
    if size is None:
        size = comfy.memory_management.vram_aligned_size([module.weight, getattr(module, "bias", None)])
    comfy.memory_management.extra_ram_release(comfy.memory_management.RAM_CACHE_HEADROOM)
    if not comfy.model_management.ensure_pin_budget(size) or not comfy.model_management.ensure_pin_registerable(size):
        return False
    pin = torch.empty(size, dtype=torch.uint8)
    if not _register(module, subset, pin):
        comfy.model_management.free_registrations(size)
        if not _register(module, subset, pin):
            return False
    module._pin = pin
    return True
