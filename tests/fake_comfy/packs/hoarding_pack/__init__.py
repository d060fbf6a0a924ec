"""A custom-node pack of our own that keeps models where ComfyUI never warns about them, for leak tests.

``ListLoader`` appends each torch module it builds to the module-level list ``_CACHE`` (an ``appended_list``);
``PatcherHoarder`` appends each ModelPatcher it returns to ``HOARD`` (a hoarded ModelPatcher: ComfyUI sees a live
patcher, so it never warns).  Once ComfyUI unloads such a model it leaves ComfyUI's loaded list and stays alive.
``HookedHoarder`` does what ``PatcherHoarder`` does with a module that holds a bound method of its own (a hook, as
torch modules with hooks do): a reference cycle through the model, which the forward probe cannot account for alone.
``SampleAfter`` loads its model after its ``value`` input ran (to load a model again later in the same prompt).
Works with both fake shapes.
"""
import comfy.model_base
import comfy.model_management
import comfy.model_patcher

_CACHE = []
HOARD = []


def _build(tensor_count, tensor_numel):
    mm = comfy.model_management
    module = comfy.model_base.BaseModel(tensor_count, tensor_numel)
    return module, comfy.model_patcher.ModelPatcher(module, load_device=mm.get_torch_device(),
                                                    offload_device=mm.unet_offload_device())


class _Loader:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "kept"}), "tensor_count": ("INT", {"default": 4}),
                             "tensor_numel": ("INT", {"default": 1024})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"


class ListLoader(_Loader):
    def load(self, name="kept", tensor_count=4, tensor_numel=1024):
        module, patcher = _build(tensor_count, tensor_numel)
        _CACHE.append(module)
        comfy.model_management.load_models_gpu([patcher])
        return (patcher,)


class PatcherHoarder(_Loader):
    hooked = False

    def load(self, name="hoarded", tensor_count=4, tensor_numel=1024):
        module, patcher = _build(tensor_count, tensor_numel)
        if self.hooked:
            module.hooks = [module.__repr__]
        HOARD.append(patcher)
        comfy.model_management.load_models_gpu([patcher])
        return (patcher,)


class HookedHoarder(PatcherHoarder):
    hooked = True


class SampleAfter:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "value": ("INT",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "sample"
    OUTPUT_NODE = True

    def sample(self, model, value):
        comfy.model_management.load_models_gpu([model])
        return (model.loaded_size(),)


NODE_CLASS_MAPPINGS = {"ListLoader": ListLoader, "HookedHoarder": HookedHoarder, "PatcherHoarder": PatcherHoarder,
                       "SampleAfter": SampleAfter}
