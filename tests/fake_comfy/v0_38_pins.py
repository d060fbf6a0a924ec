"""A ComfyUI-0.38-shaped DynamicVRAM pin layer, installed over the 0.27.0 stand-in at test time.

No tree of 0.38 exists locally; this module models what the 0.33.0 tree and the 0.38 sources (Comfy-Org/ComfyUI
``comfy/model_management.py`` @02b2b388, ``comfy/pinned_memory.py`` @40bf8f7b, ``comfy/model_patcher.py``
@08d0e510) show about pins, written from the reference notes (section 8) in our own code; it contains no ComfyUI
code.  Modelled:

* per model and device, ``model.dynamic_pins[device]``: six subsets (``weights``, ``patches``, ``-loaded``,
  ``-fast``), each the 6-tuple ``(hostbuf, stack, stack_split, pinned_size, counter, buckets)``, plus ``active``
  and ``current_prompt``;
* per layer, ``layer._pins[subset] = {"pin", "registered", "stack_index"}``;
* ``comfy.pinned_memory.pin_memory`` / ``get_pin`` (no pin stealing: a refused pin returns False) and
  ``comfy.model_management.DISABLE_PINNED_MEMORY``;
* ``pin_memory(tensor, evict_active=True)`` that returns False when ``ensure_pin_registerable`` refuses;
* tiered ``free_pins`` / ``free_registrations`` over ``free_model_pins`` and ``models_for_pin_eviction`` (list
  order, most recently loaded first), fast subsets first, destroyed rather than unregistered;
* ``reset_cast_buffers`` (inactive, patches subsets destroyed and recreated);
* :class:`DynamicPatcher`: ``partially_unload_ram`` / ``unregister_inactive_pins`` with their subset orders.

Registration goes through the stand-in's ``HOST_REGISTER``.  Use :func:`install` on an imported 0.27.0 stand-in
before comfy_memx patches it (bootstrap afterwards, as a late activation does).
"""

import types

import torch

FAST = ["weights-fast", "patches-fast"]
PIN = ["weights", "patches"]
LOADED = ["weights-loaded", "patches-loaded"]
ALL = PIN + LOADED + FAST
DESTROY_ORDER = ["weights-fast", "patches-fast", "weights-loaded", "patches-loaded", "weights", "patches"]
UNREGISTER_ORDER = ["weights-loaded", "patches-loaded", "weights", "patches"]
PATCHES = ["patches", "patches-loaded", "patches-fast"]


class HostBuffer:
    """A growable host buffer: one CPU tensor per extension; ``truncate`` drops (and unregisters) the tail."""

    def __init__(self, mm):
        self.mm, self.size, self.regions = mm, 0, []   # regions: [(offset, tensor)]

    def extend(self, size):
        """Append ``size`` bytes; returns their tensor."""
        tensor = torch.empty(size, dtype=torch.uint8)
        self.regions.append((self.size, tensor))
        self.size += size
        return tensor

    def truncate(self, offset, do_unregister):
        """Drop everything from ``offset`` on, unregistering it first when ``do_unregister``."""
        for start, tensor in [r for r in self.regions if r[0] >= offset]:
            if do_unregister:
                self.mm.HOST_REGISTER.unregister(tensor.data_ptr())
            self.regions.remove((start, tensor))
        self.size = offset


def subset_state(mm):
    """A fresh subset tuple."""
    return (HostBuffer(mm), [], [-1], [0], [0], {})


class DynamicPatcher:
    """The pin-related parts of a DynamicVRAM ModelPatcher for a model of ``layers`` layers of ``numel`` floats."""

    def __init__(self, mm, layers=4, numel=65536):
        from fake_comfy.loader import make_model
        self.mm = mm
        self.model = make_model(layers, numel)
        self.load_device = mm.get_torch_device()
        state = {subset: subset_state(mm) for subset in ALL}
        state.update(active=False, current_prompt=False, hostbufs_initialized=True, failed=False)
        self.model.dynamic_pins = {self.load_device: state}
        for layer in self.model.blocks:
            layer._pin_state = state
            layer.bias = None
        self.pinned = set()

    def is_dynamic(self):
        """Always True: a DynamicVRAM patcher."""
        return True

    def layers(self):
        """The model's layers (each pins as one unit)."""
        return list(self.model.blocks)

    def state(self):
        """This model's pin state on its device."""
        return self.model.dynamic_pins[self.load_device]

    def unregister_inactive_pins(self, ram_to_unload, subsets=UNREGISTER_ORDER):
        """Unregister pins from the top of each subset's registered stack; the RAM stays.  Returns bytes."""
        freed = 0
        for subset in subsets:
            _, stack, split, pinned_size, _, _ = self.state()[subset]
            while split[0] >= 0:
                layer, _ = stack[split[0]]
                split[0] -= 1
                entry = layer._pins[subset]
                if not entry["registered"]:
                    continue
                size = entry["pin"].nbytes
                self.mm.HOST_REGISTER.unregister(entry["pin"].data_ptr())
                entry["registered"] = False
                self._forget_registration(size, pinned_size)
                freed += size
                ram_to_unload -= size
                if ram_to_unload <= 0:
                    return freed
        return freed

    def _forget_registration(self, size, pinned_size):
        """Take ``size`` registered bytes off ComfyUI's pinned total and the subset's pinned size."""
        self.mm.TOTAL_PINNED_MEMORY = max(0, self.mm.TOTAL_PINNED_MEMORY - size)
        pinned_size[0] = max(0, pinned_size[0] - size)

    def partially_unload_ram(self, ram_to_unload, subsets=DESTROY_ORDER):
        """Destroy pins from the top of each subset's stack (RAM returned).  Returns bytes, registered or not."""
        freed = 0
        for subset in subsets:
            hostbuf, stack, split, pinned_size, _, _ = self.state()[subset]
            while stack:
                layer, offset = stack.pop()
                entry = layer._pins[subset]
                size = entry.pop("pin").nbytes
                registered = entry.pop("registered")
                hostbuf.truncate(offset, do_unregister=registered)
                split[0] = min(split[0], len(stack) - 1)
                if registered:
                    self._forget_registration(size, pinned_size)
                freed += size
                ram_to_unload -= size
                if ram_to_unload <= 0:
                    return freed
        return freed


def install(mm, pm):
    """Replace the 0.27.0 stand-in's pin functions in ``mm`` and ``pm`` by the 0.38-shaped ones."""
    mm.DISABLE_PINNED_MEMORY = False
    mm.PIN_SUBSETS, mm.LOADED_PIN_SUBSETS, mm.FAST_PIN_SUBSETS = list(PIN), list(LOADED), list(FAST)

    def models_for_pin_eviction(active, current_prompt=None):
        for entry in list(mm.current_loaded_models):
            patcher = entry.model
            if patcher is None or not patcher.is_dynamic():
                continue
            state = patcher.model.dynamic_pins[patcher.load_device]
            if (active is None or state["active"] == active) and \
                    (current_prompt is None or state["current_prompt"] == current_prompt):
                yield patcher

    def free_model_pins(size, subsets, current_prompt, active, registrations=False):
        freed = 0
        for patcher in mm.models_for_pin_eviction(active, current_prompt=current_prompt):
            if size <= 0:
                break
            if registrations:
                step = patcher.unregister_inactive_pins(size, subsets=subsets)
            else:
                step = patcher.partially_unload_ram(size, subsets=subsets)
            freed += step
            size -= step
        return freed

    def pin_eviction_tiers(loaded, evict_active):
        tiers = [(FAST, False, False), (PIN, False, None), (LOADED, False, None), (FAST, True, False),
                 (LOADED, True, None)]
        if not loaded:
            tiers.append((PIN, True, False))
            if evict_active:
                tiers += [(FAST, False, True), (FAST, True, True), (PIN, True, True)]
        return tiers

    def registration_eviction_tiers(evict_active):
        tiers = [(FAST, False, False, False), (PIN + LOADED, False, False, True), (FAST, True, False, False),
                 (PIN + LOADED, True, False, True)]
        if evict_active:
            tiers += [(FAST, False, True, False), (PIN + LOADED, False, True, True), (FAST, True, True, False),
                      (PIN + LOADED, True, True, True)]
        return tiers

    def free_pins(size, evict_active=False, loaded=False):
        freed = 0
        for subsets, current_prompt, active in mm.pin_eviction_tiers(loaded, evict_active):
            freed += mm.free_model_pins(size - freed, subsets, current_prompt, active)
        return freed

    def ensure_pin_budget(size, evict_active=False, loaded=False):
        shortfall = size + 2 * 1024 ** 3 - mm._ram_available()
        if shortfall <= 0:
            return True
        return mm.free_pins(shortfall + mm.PIN_PRESSURE_HYSTERESIS, evict_active=evict_active,
                            loaded=loaded) >= shortfall

    def free_registrations(shortfall, evict_active=True):
        if mm.MAX_PINNED_MEMORY <= 0:
            return False
        if shortfall <= 0:
            return True
        shortfall += mm.REGISTERABLE_PIN_HYSTERESIS
        for subsets, current_prompt, active, registrations in mm.registration_eviction_tiers(evict_active):
            shortfall -= mm.free_model_pins(shortfall, subsets, current_prompt, active, registrations=registrations)
        return shortfall <= mm.REGISTERABLE_PIN_HYSTERESIS

    def ensure_pin_registerable(size, evict_active=True):
        return mm.free_registrations(mm.TOTAL_PINNED_MEMORY + size - mm.MAX_PINNED_MEMORY, evict_active=evict_active)

    def pin_memory(tensor, evict_active=True):
        if mm.MAX_PINNED_MEMORY <= 0 or type(tensor).__name__ not in mm.PINNING_ALLOWED_TYPES:
            return False
        if not mm.is_device_cpu(tensor.device) or tensor.data_ptr() in mm.PINNED_MEMORY:
            return False
        if not tensor.is_contiguous():
            return False
        size = tensor.nbytes
        if not mm.ensure_pin_registerable(size, evict_active=evict_active):
            return False   # new in 0.38: the answer is no longer ignored
        if not mm.HOST_REGISTER.register(tensor.data_ptr(), size):
            return False
        mm.PINNED_MEMORY[tensor.data_ptr()] = size
        mm.TOTAL_PINNED_MEMORY += size
        return True

    def reset_cast_buffers():
        for entry in list(mm.current_loaded_models):
            patcher = entry.model
            if patcher is None or not patcher.is_dynamic():
                continue
            state = patcher.model.dynamic_pins[patcher.load_device]
            state["active"] = False
            patcher.partially_unload_ram(1e30, subsets=PATCHES)
            for subset in PATCHES:
                state[subset] = subset_state(mm)

    for name, function in dict(models_for_pin_eviction=models_for_pin_eviction, free_model_pins=free_model_pins,
                               pin_eviction_tiers=pin_eviction_tiers,
                               registration_eviction_tiers=registration_eviction_tiers, free_pins=free_pins,
                               ensure_pin_budget=ensure_pin_budget, free_registrations=free_registrations,
                               ensure_pin_registerable=ensure_pin_registerable, pin_memory=pin_memory,
                               reset_cast_buffers=reset_cast_buffers).items():
        setattr(mm, name, function)

    def get_pin(layer, subset="weights"):
        entry = layer.__dict__.get("_pins", {}).get(subset)
        pin = entry.get("pin") if entry else None
        if pin is None or entry["registered"] or mm.DISABLE_PINNED_MEMORY:
            return pin
        _, _, split, pinned_size, _, _ = layer._pin_state[subset]
        mm.ensure_pin_registerable(pin.nbytes)
        if not mm.HOST_REGISTER.register(pin.data_ptr(), pin.nbytes):
            return pin
        entry["registered"] = True
        split[0] = max(split[0], entry["stack_index"])
        mm.TOTAL_PINNED_MEMORY += pin.nbytes
        pinned_size[0] += pin.nbytes
        return pin

    def pin_layer(layer, subset="weights", size=None):
        if mm.DISABLE_PINNED_MEMORY:
            return None
        if pm.get_pin(layer, subset) is not None:
            return None
        if size is None:
            size = layer.weight.nbytes
        fast = subset.endswith("-fast")
        if not mm.ensure_pin_budget(size, loaded=subset.endswith("-loaded")) or \
                not mm.ensure_pin_registerable(size, evict_active=not fast):
            return False
        hostbuf, stack, split, pinned_size, _, _ = layer._pin_state[subset]
        offset = hostbuf.size
        pin = hostbuf.extend(size)
        if not mm.HOST_REGISTER.register(pin.data_ptr(), size):
            hostbuf.truncate(offset, do_unregister=False)
            return False
        stack.append((layer, offset))
        layer.__dict__.setdefault("_pins", {})[subset] = {"pin": pin, "registered": True,
                                                          "stack_index": len(stack) - 1}
        split[0] = max(split[0], len(stack) - 1)
        mm.TOTAL_PINNED_MEMORY += size
        pinned_size[0] += size
        return True

    pm.get_pin = get_pin
    pm.pin_memory = pin_layer


def loaded(mm, *patchers):
    """Put ``patchers`` into ``current_loaded_models`` (first = most recently loaded), active."""
    for patcher in reversed(patchers):
        patcher.state()["active"] = True
        mm.current_loaded_models.insert(0, types.SimpleNamespace(model=patcher, device=patcher.load_device))
