"""ComfyUI 0.27.0's part of ``comfy/model_patcher.py``: the legacy (non-dynamic) ``ModelPatcher``.  Offloaded
weights are pinned and loaded ones unpinned, as 0.27.0 does; ``clone_base_uuid``, ``CoreModelPatcher``.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

_MODULE_DEFAULTS = (("model_loaded_weight_memory", 0), ("lowvram_patch_counter", 0), ("model_lowvram", False),
                    ("current_weight_patches_uuid", None), ("model_offload_buffer_memory", 0))


class ModelPatcher(_SharedModelPatcher):
    """Wraps a torch module with its load/offload devices and moves its weights between them."""

    UNLOADS_ON_NEGATIVE_EXTRA = True

    def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
        self._setup(model, load_device, offload_device, size, weight_inplace_update)
        self.pinned = set()
        self.clone_base_uuid = uuid.uuid4()

    def is_dynamic(self):
        return False

    def clone(self, disable_dynamic=False, model_override=None, force_deepcopy=False):
        """A new patcher on the same torch module, with ``parent`` set and backups/pins shared."""
        n = self._clone()
        n.pinned, n.clone_base_uuid = self.pinned, self.clone_base_uuid
        return n

    def get_nested_additional_models(self):
        return [m for models in self.additional_models.values() for m in models]

    def pin_weight_to_device(self, key):
        """Pin the CPU copy of weight ``key`` and remember it in ``pinned``."""
        if comfy.model_management.pin_memory(self._get_weight(key)):
            self.pinned.add(key)

    def unpin_weight(self, key):
        """Release the pin of weight ``key`` if this patcher family made it."""
        if key in self.pinned:
            comfy.model_management.unpin_memory(self._get_weight(key))
            self.pinned.remove(key)

    def unpin_all_weights(self):
        """Release every pin in ``pinned``."""
        for key in list(self.pinned):
            self.unpin_weight(key)

    def _before_load(self, key):
        self.unpin_weight(key)

    def _after_offload(self, key):
        self.pin_weight_to_device(key)

    def _release_pins(self):
        self.unpin_all_weights()

    def _after_unpatch(self):
        self.model.model_offload_buffer_memory = 0

    def _log_load(self, lowvram_model_memory, mem_counter, left_out, full_load):
        usable_stat = "{:.2f} MB usable,".format(lowvram_model_memory / (1024 * 1024)) if lowvram_model_memory < 1e32 else ""
        if left_out:
            logging.info("loaded partially; {} {:.2f} MB loaded, {:.2f} MB offloaded, {:.2f} MB buffer reserved, lowvram patches: {}".format(
                usable_stat, mem_counter / (1024 * 1024), sum(n for _, n in left_out) / (1024 * 1024), 0.0, 0))
        else:
            logging.info("loaded completely; {} {:.2f} MB loaded, full load: {}".format(usable_stat, mem_counter / (1024 * 1024), full_load))

    def _log_partial_unload(self, memory_freed):
        logging.info("Unloaded partially: {:.2f} MB freed, {:.2f} MB remains loaded, {:.2f} MB buffer reserved, lowvram patches: {}".format(
            memory_freed / (1024 * 1024), self.model.model_loaded_weight_memory / (1024 * 1024), 0.0, self.model.lowvram_patch_counter))

    def pinned_memory_size(self):
        return 0

    def loaded_ram_size(self):
        return 0

    def partially_unload_ram(self, ram_to_unload):
        return 0


CoreModelPatcher = ModelPatcher
