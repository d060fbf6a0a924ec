"""Attaches the model as a submodule of a long-lived torch module of its own."""
_HOLDER = []


def holder():
    if not _HOLDER:
        import torch
        _HOLDER.append(torch.nn.Module())
    return _HOLDER[0]


def keep(model):
    holder().extra = model


def release():
    if _HOLDER:
        _HOLDER[0]._modules.pop("extra", None)


class KeepTorchGlue:
    """Keeps the torch module of its MODEL input (see keep) and passes the MODEL on."""
    CATEGORY = "memx/testing"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "run"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    def run(self, model):
        keep(model.model)
        return (model,)


NODE_CLASS_MAPPINGS = {"KeepTorchGlue": KeepTorchGlue}
