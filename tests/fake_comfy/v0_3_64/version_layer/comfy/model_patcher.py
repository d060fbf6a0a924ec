"""ComfyUI 0.3.64's part of ``comfy/model_patcher.py``: ``ModelPatcher`` with no pinning and no dynamic VRAM,
``clone()`` without options, 0.3.64's log texts.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""

_MODULE_DEFAULTS = (("model_loaded_weight_memory", 0), ("lowvram_patch_counter", 0), ("model_lowvram", False),
                    ("current_weight_patches_uuid", None))


class ModelPatcher(_SharedModelPatcher):
    """Wraps a torch module with its load/offload devices and moves its weights between them."""

    UNLOADS_ON_NEGATIVE_EXTRA = False

    def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
        self._setup(model, load_device, offload_device, size, weight_inplace_update)
        self.model_size()

    def clone(self):
        """A new patcher on the same torch module, with ``parent`` set and backups shared."""
        return self._clone()

    # 0.3.64 pins nothing: the hooks of the shared load path do nothing here
    def _before_load(self, key):
        pass

    def _after_offload(self, key):
        pass

    def _release_pins(self):
        pass

    def _after_unpatch(self):
        pass

    def _log_load(self, lowvram_model_memory, mem_counter, left_out, full_load):
        if left_out:
            logging.info("loaded partially {} {} {}".format(lowvram_model_memory / (1024 * 1024), mem_counter / (1024 * 1024), 0))
        else:
            logging.info("loaded completely {} {} {}".format(lowvram_model_memory / (1024 * 1024), mem_counter / (1024 * 1024), full_load))

    def _log_partial_unload(self, memory_freed):
        pass
