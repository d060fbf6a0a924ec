"""The innocent pack: its node only asks ComfyUI to load the model it is given (``load_models_gpu``), then passes
it on.  comfy_memx must name it as the loader of a leaked model, never as its holder."""


def load_model(patcher):
    """What a utility node does before using a model: ask ComfyUI to load it."""
    import comfy.model_management
    comfy.model_management.load_models_gpu([patcher])
    return patcher


class UBApplyModel:
    CATEGORY = "memx/testing"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "apply"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    def apply(self, model):
        return (load_model(model),)


NODE_CLASS_MAPPINGS = {"UBApplyModel": UBApplyModel}
