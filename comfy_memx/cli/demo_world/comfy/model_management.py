"""Stand-in for ComfyUI's ``comfy/model_management.py`` (memory API only; test double, no ComfyUI code): what every
version shares; ``free_memory``, ``LoadedModel``, ``unload_all_models``, pinning and the rest that differ come from
the version layer, at the end.

Public names, signatures, globals, log texts and the eviction/leak semantics follow the real module
(reference sections 2-8 and 14; see tests/fake_comfy/README.md).  Everything else is simulated:

* The GPU is a label, ``SIM_GPU`` (``cuda:0``).  Its capacity is ``SIM_VRAM_TOTAL`` bytes and its use is the
  loaded bytes of every torch module resident on it (``SIM_RESIDENT``), so shrinking ``SIM_VRAM_TOTAL`` creates
  memory pressure.  :func:`set_sim_device` switches between that GPU and a ``--cpu`` shape.
* ``SIM_RAM_AVAILABLE`` (bytes) overrides psutil's available RAM when not None.
"""

import gc
import logging
import platform
import sys
import threading
import weakref
from enum import Enum

import psutil
import torch
from comfy.cli_args import args

import stand_in_version


class VRAMState(Enum):
    DISABLED = 0
    NO_VRAM = 1
    LOW_VRAM = 2
    NORMAL_VRAM = 3
    HIGH_VRAM = 4
    SHARED = 5


class CPUState(Enum):
    GPU = 0
    CPU = 1
    MPS = 2


SIM_GPU = torch.device("cuda", 0)
SIM_VRAM_TOTAL = 8 * 1024 ** 3
SIM_RAM_AVAILABLE = None
SIM_RESIDENT = weakref.WeakSet()
SIM_EMPTY_CACHE_CALLS = 0

cpu_state = CPUState.CPU if args.cpu else CPUState.GPU
lowvram_available = True
directml_enabled = False


def _vram_state_for(state):
    if state != CPUState.GPU:
        return VRAMState.DISABLED
    if args.highvram or args.gpu_only:
        return VRAMState.HIGH_VRAM
    if args.lowvram:
        return VRAMState.LOW_VRAM
    if args.novram:
        return VRAMState.NO_VRAM
    return VRAMState.NORMAL_VRAM


vram_state = _vram_state_for(cpu_state)
set_vram_to = vram_state


def is_nvidia():
    """The simulated GPU counts as an Nvidia card (so pinning and MIN_WEIGHT_MEMORY_RATIO behave as on one)."""
    return cpu_state == CPUState.GPU


def is_amd():
    return False


def cpu_mode():
    return cpu_state == CPUState.CPU


def is_device_type(device, type):
    return getattr(device, "type", None) == type


def is_device_cpu(device):
    return is_device_type(device, "cpu")


def is_device_cuda(device):
    return is_device_type(device, "cuda")


def get_torch_device():
    """The simulated ``cuda:0`` label, or ``cpu`` in the CPU shape."""
    return torch.device("cpu") if cpu_state == CPUState.CPU else SIM_GPU


def get_torch_device_name(device):
    if is_device_cuda(device):
        return "{} {} : {}".format(device, "Simulated GPU (fake_comfy)", "native")
    return "{}".format(device.type)


def _sim_vram_used(dev):
    return sum(m.model_loaded_weight_memory for m in list(SIM_RESIDENT) if getattr(m, "device", None) == dev)


def _ram_available():
    return psutil.virtual_memory().available if SIM_RAM_AVAILABLE is None else SIM_RAM_AVAILABLE


def get_total_memory(dev=None, torch_total_too=False):
    """Total bytes of ``dev``: psutil RAM for cpu/mps, ``SIM_VRAM_TOTAL`` for the simulated GPU."""
    if dev is None:
        dev = get_torch_device()
    if getattr(dev, "type", None) in ("cpu", "mps"):
        mem_total = mem_total_torch = psutil.virtual_memory().total
    else:
        mem_total, mem_total_torch = SIM_VRAM_TOTAL, _sim_vram_used(dev)
    return (mem_total, mem_total_torch) if torch_total_too else mem_total


def get_free_memory(dev=None, torch_free_too=False):
    """Free bytes of ``dev``: available RAM for cpu/mps; for the GPU its total minus the resident weights."""
    if dev is None:
        dev = get_torch_device()
    if getattr(dev, "type", None) in ("cpu", "mps"):
        mem_free_total = mem_free_torch = _ram_available()
    else:
        mem_free_total, mem_free_torch = max(0, SIM_VRAM_TOTAL - _sim_vram_used(dev)), 0
    return (mem_free_total, mem_free_torch) if torch_free_too else mem_free_total


total_vram = get_total_memory(get_torch_device()) / (1024 * 1024)
total_ram = psutil.virtual_memory().total / (1024 * 1024)
logging.info("Total VRAM {:0.0f} MB, total RAM {:0.0f} MB".format(total_vram, total_ram))
logging.info("pytorch version: {}".format(torch.version.__version__))

OOM_EXCEPTION = torch.cuda.OutOfMemoryError


MIN_WEIGHT_MEMORY_RATIO = 0.0 if is_nvidia() else 0.4

logging.info(f"Set vram state to: {vram_state.name}")

DISABLE_SMART_MEMORY = args.disable_smart_memory
if DISABLE_SMART_MEMORY:
    logging.info("Disabling smart memory management")

logging.info("Device: {}".format(get_torch_device_name(get_torch_device())))

current_loaded_models = []


class _SharedLoadedModel:
    """What ``LoadedModel`` is in every stand-in version (each version's class adds the rest)."""

    def __init__(self, model):
        self._set_model(model)
        self.device = model.load_device
        self.real_model = None
        self.currently_used = True
        self.model_finalizer = None
        # COMFY: reset after _set_model in the real class too; a clone's finalizer stays registered anyway.
        self._patcher_finalizer = None

    @property
    def model(self):
        """The ModelPatcher, or None once it was collected."""
        return self._model()

    def model_memory(self):
        """Bytes of all weights of the model."""
        return self.model.model_size()

    def model_loaded_memory(self):
        """Bytes of weights currently on the load device."""
        return self.model.loaded_size()

    def model_offloaded_memory(self):
        """Bytes of weights not on the load device."""
        patcher = self.model
        return patcher.model_size() - patcher.loaded_size()

    def model_memory_required(self, device):
        """Bytes still to move to ``device``: the offloaded part if the model already lives there."""
        if self.model.current_loaded_device() == device:
            return self.model_offloaded_memory()
        return self.model_memory()

    def model_unload(self, memory_to_free=None, unpatch_weights=True):
        """False if a partial unload freed ``memory_to_free``; otherwise detach fully and return True."""
        patcher = self.model
        if memory_to_free is not None and memory_to_free < patcher.loaded_size():
            if patcher.partially_unload(patcher.offload_device, memory_to_free) >= memory_to_free:
                return False
        patcher.detach(unpatch_weights)
        self.model_finalizer.detach()
        self.model_finalizer = None
        self.real_model = None
        return True

    def model_use_more_vram(self, extra_memory, force_patch_weights=False):
        """Load ``extra_memory`` more bytes of weights; returns what the patcher loaded."""
        return self.model.partially_load(self.device, extra_memory, force_patch_weights=force_patch_weights)

    def __eq__(self, other):
        return self.model is other.model

    def __del__(self):
        if self._patcher_finalizer is not None:
            self._patcher_finalizer.detach()

    def is_dead(self):
        """Torch module still alive while its ModelPatcher is gone (TypeError on a never-loaded entry)."""
        return self.real_model() is not None and self.model is None

    def _set_model(self, model):
        self._model = weakref.ref(model)
        if model.parent is None:
            return
        self._parent_model = weakref.ref(model.parent)
        self._patcher_finalizer = weakref.finalize(model, self._switch_parent)
        self._patcher_finalizer.atexit = self.FINALIZERS_AT_EXIT

    def _switch_parent(self):
        parent = self._parent_model()
        if parent is not None:
            self._set_model(parent)
            if self.SWITCH_TAKES_PARENT_DEVICE:
                self.device = parent.load_device

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
        self.model_finalizer.atexit = self.FINALIZERS_AT_EXIT
        return module

DIRTY_MMAPS = set()
PIN_PRESSURE_HYSTERESIS = 256 * 1024 * 1024
REGISTERABLE_PIN_HYSTERESIS = 2048 * 1024 * 1024



WINDOWS = any(platform.win32_ver())

EXTRA_RESERVED_VRAM = 400 * 1024 * 1024
if WINDOWS:
    EXTRA_RESERVED_VRAM = 600 * 1024 * 1024
    if total_vram > (15 * 1024):
        EXTRA_RESERVED_VRAM += 100 * 1024 * 1024
if args.reserve_vram is not None:
    EXTRA_RESERVED_VRAM = args.reserve_vram * 1024 * 1024 * 1024
    logging.debug("Reserving {}MB vram for other applications.".format(EXTRA_RESERVED_VRAM / (1024 * 1024)))


def extra_reserved_memory():
    """VRAM kept free for other programs (EXTRA_RESERVED_VRAM bytes)."""
    return EXTRA_RESERVED_VRAM


def minimum_inference_memory():
    """VRAM a sampling step needs besides the weights: 0.8 GiB plus the reserve."""
    return (1024 * 1024 * 1024) * 0.8 + extra_reserved_memory()


def load_model_gpu(model):
    """Shorthand for ``load_models_gpu([model])``."""
    return load_models_gpu([model])


def loaded_models(only_currently_used=False):
    """The ModelPatchers of ``current_loaded_models`` (MRU first)."""
    return [m.model for m in current_loaded_models if m.currently_used or not only_currently_used]


def cleanup_models_gc():
    """Warn about entries whose patcher is gone but whose torch module lives on (two-stage, with gc.collect)."""
    suspect = next((entry for entry in current_loaded_models if entry.is_dead()), None)
    if suspect is None:
        return
    logging.info("Potential memory leak detected with model {}, doing a full garbage collect, for maximum performance avoid circular references in the model code.".format(suspect.real_model().__class__.__name__))
    del suspect
    gc.collect()
    soft_empty_cache()
    for entry in current_loaded_models:
        if entry.is_dead():
            logging.warning("WARNING, memory leak with model {}. Please make sure it is not being referenced from somewhere.".format(entry.real_model().__class__.__name__))


def cleanup_models():
    """Drop entries whose torch module was collected (runs as the module's weakref finalizer)."""
    current_loaded_models[:] = [entry for entry in current_loaded_models if entry.real_model() is not None]


def unet_offload_device():
    """Where diffusion models rest when unloaded: the GPU itself in HIGH_VRAM, else the CPU."""
    return get_torch_device() if vram_state == VRAMState.HIGH_VRAM else torch.device("cpu")


def debug_memory_summary():
    """The CUDA allocator summary; empty for the simulated GPU."""
    return ""


class InterruptProcessingException(BaseException):
    pass


interrupt_processing_mutex = threading.RLock()
interrupt_processing = False


def interrupt_current_processing(value=True):
    """Ask the running prompt to stop at the next node (``/interrupt``)."""
    global interrupt_processing
    with interrupt_processing_mutex:
        interrupt_processing = value


def processing_interrupted():
    """Whether an interrupt is pending."""
    with interrupt_processing_mutex:
        return interrupt_processing


def throw_exception_if_processing_interrupted():
    """Raise InterruptProcessingException once for a pending interrupt."""
    global interrupt_processing
    with interrupt_processing_mutex:
        if interrupt_processing:
            interrupt_processing = False
            raise InterruptProcessingException()


def load_models_gpu(models, memory_required=0, force_patch_weights=False, minimum_memory_required=None, force_full_load=False):
    """Make ``models`` resident on their load devices, evicting others as needed; returns None."""
    cleanup_models_gc()

    inference_memory = minimum_inference_memory()
    extra_mem = max(inference_memory, memory_required + extra_reserved_memory())
    if minimum_memory_required is None:
        minimum_memory_required = extra_mem
    else:
        minimum_memory_required = max(inference_memory, minimum_memory_required + extra_reserved_memory())

    wanted = _wanted_patchers(models)
    free_options = _free_options(wanted)

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

    needed, pins_needed = {}, {}
    for entry in entries:
        needed[entry.device] = needed.get(entry.device, 0) + entry.model_memory_required(entry.device)
        pins_needed[entry.device] = pins_needed.get(entry.device, 0) + _pin_bytes(entry)
    accelerators = [dev for dev in needed if dev != torch.device("cpu")]

    for dev in accelerators:
        free_memory(needed[dev] * 1.1 + extra_mem, dev, **free_options, **_pin_request(pins_needed.get(dev, 0)))
    for dev in accelerators:
        if get_free_memory(dev) < minimum_memory_required:
            unloaded = free_memory(minimum_memory_required, dev, **free_options)
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
    return _budget_left(usable, minimum_memory_required, resident)


def set_sim_device(kind, vram_total=None):
    """Switch the simulation to ``"cuda"`` (the simulated GPU) or ``"cpu"`` (as with ``--cpu``).

    Recomputes what real ComfyUI derives from the device at import: vram_state and total_vram (and what the version adds in
    ``_after_sim_device``).
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
    _after_sim_device()


stand_in_version.apply_layer(globals())
