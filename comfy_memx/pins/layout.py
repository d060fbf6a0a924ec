"""Where ComfyUI keeps its pins, and how to release them with its own calls, told apart by feature detection.

What was read in which ComfyUI (reference section 8 and the trees in ``../shared/comfyui``):

* Legacy tensor pins (0.27.0+): ``PINNED_MEMORY`` {data_ptr: bytes}, changed only by ``pin_memory`` /
  ``unpin_memory`` of ``comfy.model_management``.
* DynamicVRAM pins: per model (torch module) and load device, ``module.dynamic_pins[device]`` is a dict of subsets
  ``"weights"``, ``"patches"`` (0.27.0), ``"weights-loaded"``, ``"patches-loaded"`` (0.33.0), ``"weights-fast"``,
  ``"patches-fast"`` (0.38), each the 6-tuple ``(hostbuf, stack, stack_split, pinned_size, counter, buckets)``
  where ``pinned_size[0]`` is the subset's registered bytes, kept by ComfyUI in step with
  ``TOTAL_PINNED_MEMORY`` on every path (pin, re-register, unregister, destroy, steal); plus flags (``active``,
  ``current_prompt``, ...).
* One layer's pin: 0.27.0 ``layer._pin`` / ``layer._pin_registered`` (one pin per layer whatever the subset);
  0.33.0+ ``layer._pins[subset] = {"pin", "registered", ...}``.
* The disable switch: 0.38 ``comfy.model_management.DISABLE_PINNED_MEMORY``; before, ``args.disable_pinned_memory``.

Every reader here takes ComfyUI's objects as given and never holds them; nothing is imported from ComfyUI.
"""

import sys

FAST_SUBSETS = ("weights-fast", "patches-fast")   # 0.38: destroyed first when registrations run short


def layer_pin(layer, subset):
    """``(pin tensor or None, registered)`` of ``layer``'s pin for ``subset`` (0.33+ per subset, 0.27.0 per layer)."""
    attributes = getattr(layer, "__dict__", None)
    if attributes is None:
        return None, False
    pins = attributes.get("_pins")
    if pins is not None:
        entry = pins.get(subset)
        pin = entry.get("pin") if entry else None
        return pin, bool(pin is not None and entry.get("registered"))
    pin = attributes.get("_pin")
    return pin, bool(pin is not None and attributes.get("_pin_registered"))


def state_registered_bytes(pin_state):
    """Registered bytes of one device's DynamicVRAM pin state: the ``pinned_size`` counters of all its subsets."""
    return sum(subset_bytes(pin_state).values())


def subset_bytes(pin_state):
    """``{subset: registered bytes}`` of one device's DynamicVRAM pin state (subsets in the 6-tuple layout only)."""
    found = {}
    for name, value in list(pin_state.items()):
        if type(value) is tuple and len(value) >= 4:
            try:
                found[name] = int(value[3][0])
            except (TypeError, IndexError, ValueError):
                continue
    return found


def model_registered_bytes(module):
    """Registered DynamicVRAM bytes of a model (its torch module), over every load device; 0 without pins."""
    states = _dynamic_pins(module)
    return sum(state_registered_bytes(state) for state in states if isinstance(state, dict))


def pinning_disabled(mm):
    """True when ComfyUI's own switch turns pinning off (0.38 ``DISABLE_PINNED_MEMORY``, else the CLI flag)."""
    value = getattr(mm, "DISABLE_PINNED_MEMORY", None)
    if value is not None:
        return bool(value)
    cli = sys.modules.get("comfy.cli_args")
    return bool(getattr(getattr(cli, "args", None), "disable_pinned_memory", False))


def default_layer_size(layer):
    """What ComfyUI pins for ``layer`` when no size is given (weight and bias, aligned), or None if unknown."""
    helpers = sys.modules.get("comfy.memory_management")
    if helpers is None or not hasattr(helpers, "vram_aligned_size"):
        return None
    return helpers.vram_aligned_size([getattr(layer, "weight", None), getattr(layer, "bias", None)])


def is_dynamic(patcher):
    """True for a DynamicVRAM ModelPatcher."""
    check = getattr(patcher, "is_dynamic", None)
    return bool(check()) if check is not None else False


def pin_state_of(patcher):
    """The DynamicVRAM pin state of ``patcher`` on its load device, or None."""
    try:
        return patcher.model.dynamic_pins[patcher.load_device]
    except (AttributeError, KeyError, TypeError):
        return None


def release_dynamic(patcher, nbytes, reason):
    """Free at least ``nbytes`` of a dynamic model's registered pins with ComfyUI's own methods, as ComfyUI would.

    ``reason`` "ram_pressure": ``partially_unload_ram`` (pins destroyed, their RAM returned).  Otherwise (cap):
    the 0.38 fast subsets are destroyed first, as its registration tiers do, then ``unregister_inactive_pins``
    (the RAM stays, only the registration goes).  The return values are ComfyUI's (which count destroyed RAM, not
    only registered bytes); callers measure registered bytes themselves.
    """
    if reason == "ram_pressure":
        return patcher.partially_unload_ram(nbytes)
    freed = 0
    state = pin_state_of(patcher)
    fast = [name for name in FAST_SUBSETS if state is not None and name in state]
    if fast:
        freed += patcher.partially_unload_ram(nbytes, subsets=fast)
    if freed < nbytes:
        freed += patcher.unregister_inactive_pins(nbytes - freed)
    return freed


def _dynamic_pins(module):
    if module is None:
        return []
    pins = getattr(module, "__dict__", {}).get("dynamic_pins")
    if not isinstance(pins, dict):
        return []
    return list(pins.values())
