"""Stand-in for ComfyUI 0.3.64 ``comfy/model_patcher.py``: ``ModelPatcher`` (no pinning, no dynamic VRAM).

Loading is simulated but does real per-tensor work: putting a weight on the simulated GPU copies it into its own
freshly allocated "device" buffer (kept in ``model._sim_device_weights``); offloading copies it back and drops the
buffer.  A CPU load device needs no copy.  ``model.model_loaded_weight_memory`` counts resident bytes.  Partial
loads and unloads move whole tensors.
"""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy/model_patcher")

_MODULE_DEFAULTS = (("model_loaded_weight_memory", 0), ("lowvram_patch_counter", 0), ("model_lowvram", False),
                    ("current_weight_patches_uuid", None))


class ModelPatcher(_SharedModelPatcher):
    """Wraps a torch module with its load/offload devices and moves its weights between them."""

    def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
        self.size = size
        self.model = model
        if getattr(model, "device", None) is None:
            self.model.device = offload_device
        self.patches = {}
        self.backup = {}
        self.object_patches = {}
        self.object_patches_backup = {}
        self.model_options = {"transformer_options": {}}
        self.model_size()
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

    def clone(self):
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
        if left_out:
            logging.info("loaded partially {} {} {}".format(lowvram_model_memory / (1024 * 1024), mem_counter / (1024 * 1024), 0))
        else:
            logging.info("loaded completely {} {} {}".format(lowvram_model_memory / (1024 * 1024), mem_counter / (1024 * 1024), full_load))
        self.model.model_lowvram = bool(left_out)
        self.model.device = device_to
        self.model.model_loaded_weight_memory = mem_counter
        self.model.current_weight_patches_uuid = self.patches_uuid
        if on_device and not comfy.model_management.is_device_cpu(device_to):
            comfy.model_management.SIM_RESIDENT.add(self.model)

    def unpatch_model(self, device_to=None, unpatch_weights=True):
        """With ``unpatch_weights``: offload every weight and zero the loaded-bytes counter."""
        if unpatch_weights:
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
            comfy.model_management.SIM_RESIDENT.discard(self.model)
        self.object_patches_backup.clear()

    def partially_unload(self, device_to, memory_to_free=0):
        """Offload resident weights, smallest first, until more than ``memory_to_free`` bytes are freed."""
        memory_freed = 0
        with torch.inference_mode():
            for nbytes, key in sorted((self._get_weight(k).nbytes, k) for k in self.model._sim_device_weights):
                if memory_to_free < memory_freed:
                    break
                self._to_offload(key)
                memory_freed += nbytes
        self.model.model_lowvram = True
        self.model.model_loaded_weight_memory -= memory_freed
        return memory_freed

    def partially_load(self, device_to, extra_memory=0, force_patch_weights=False):
        """Load ``extra_memory`` more bytes; returns bytes newly loaded (0 when already fully loaded)."""
        module = self.model
        applied = module.current_weight_patches_uuid
        if applied is not None and (force_patch_weights or applied != self.patches_uuid):
            # Resident weights carry another patcher's patches: offload them and budget their bytes again.
            extra_memory += module.model_loaded_weight_memory
            self.unpatch_model(self.offload_device, unpatch_weights=True)
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
        self.detach(unpatch_all=False)
