"""A custom-node pack of our own that unloads models the ways third-party packs do, for unload-cause tests.

``UnloadAllModels`` calls ``unload_all_models()`` (as ComfyUI-Unload-Model's node of that name does),
``FreeEverything`` calls ``free_memory(1e30, device)`` (as purge-VRAM nodes do), ``ForgetModels`` removes the
entries from ``current_loaded_models`` itself.  Each passes its ``value`` input through, so it can be chained after
a sampler.  Works with both fake shapes.
"""
import comfy.model_management


class _PassThrough:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT",)}}

    RETURN_TYPES = ("INT",)
    OUTPUT_NODE = True


class UnloadAllModels(_PassThrough):
    FUNCTION = "unload"

    def unload(self, value):
        comfy.model_management.unload_all_models()
        return (value,)


class FreeEverything(_PassThrough):
    FUNCTION = "free"

    def free(self, value):
        mm = comfy.model_management
        mm.free_memory(1e30, mm.get_torch_device())
        return (value,)


class ForgetModels(_PassThrough):
    FUNCTION = "forget"

    def forget(self, value):
        loaded = comfy.model_management.current_loaded_models
        while loaded:
            loaded.pop(0)
        return (value,)


NODE_CLASS_MAPPINGS = {"UnloadAllModels": UnloadAllModels, "FreeEverything": FreeEverything,
                       "ForgetModels": ForgetModels}
