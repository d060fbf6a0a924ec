"""A ComfyUI node pack that unloads models the ways third-party "free VRAM" packs do (for the real-tree test of unload causes).

``tests/real/test_real_comfyui.py`` copies this folder into the ``custom_nodes/`` of a server's base directory, so the
package comfy_memx names for these nodes is this folder's name, ``memx_unload_nodes``. Each node takes any value,
does its unload, and passes the value on, so it can sit between ``VAEDecode`` and ``SaveImage`` in ComfyUI's default
text-to-image workflow (as ComfyUI-Unload-Model's ``UnloadAllModels`` is used):

* ``MemxUnloadAllModels`` calls ``comfy.model_management.unload_all_models()``;
* ``MemxFreeAllMemory`` calls ``comfy.model_management.free_memory(1e30, get_torch_device())``;
* ``MemxDropLoadedModels`` removes every entry from ``comfy.model_management.current_loaded_models`` itself, one
  ``list.remove`` at a time, without unloading anything (ComfyUI then no longer manages those weights).

The "any type" input is the ``str`` subclass whose ``__ne__`` is always False that such packs use: ComfyUI's input
validation compares types with ``!=`` (0.3.64, 0.27.0, 0.33.0), so it accepts any connection.

V1 node API only; ``comfy.*`` is imported inside functions (ComfyUI has imported it before custom nodes load, and
the module stays importable without it for the offline tests).
"""

CATEGORY = "memx/testing"


class AnyType(str):
    """A type name equal to every other type name under ComfyUI's ``!=`` check."""

    def __ne__(self, other):
        return False

    __hash__ = str.__hash__


ANY = AnyType("*")


def _loaded_summary(model_management):
    """Class names of the models in ComfyUI's ``current_loaded_models`` (for the node's UI output)."""
    names = []
    for entry in list(model_management.current_loaded_models):
        patcher = getattr(entry, "model", None)
        module = getattr(patcher, "model", None)
        names.append(type(module).__name__ if module is not None else None)
    return names


class _Unloader:
    """Shared shape: one ANY input passed through, an output node so ComfyUI always runs it."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": (ANY,)}}

    RETURN_TYPES = (ANY,)
    RETURN_NAMES = ("value",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def run(self, value):
        import comfy.model_management as model_management

        before = _loaded_summary(model_management)
        self.unload(model_management)
        after = _loaded_summary(model_management)
        return {"ui": {"memx_unload": [{"node": type(self).__name__, "before": before, "after": after}]},
                "result": (value,)}

    def unload(self, model_management):
        raise NotImplementedError


class MemxUnloadAllModels(_Unloader):
    """``unload_all_models()``, as ComfyUI-Unload-Model's UnloadAllModels node does."""

    def unload(self, model_management):
        model_management.unload_all_models()


class MemxFreeAllMemory(_Unloader):
    """``free_memory(1e30, device)``: ask ComfyUI to make room for more memory than any device has."""

    def unload(self, model_management):
        model_management.free_memory(1e30, model_management.get_torch_device())


class MemxDropLoadedModels(_Unloader):
    """Remove every entry from ``current_loaded_models`` behind ComfyUI's back (no ``model_unload``)."""

    def unload(self, model_management):
        for entry in list(model_management.current_loaded_models):
            model_management.current_loaded_models.remove(entry)


NODE_CLASS_MAPPINGS = {
    "MemxUnloadAllModels": MemxUnloadAllModels,
    "MemxFreeAllMemory": MemxFreeAllMemory,
    "MemxDropLoadedModels": MemxDropLoadedModels,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "MemxUnloadAllModels": "Memx unload all models (test)",
    "MemxFreeAllMemory": "Memx free_memory(1e30) (test)",
    "MemxDropLoadedModels": "Memx drop current_loaded_models entries (test)",
}
