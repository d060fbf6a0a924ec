"""Appends every model it sees to a module-level list that never shrinks (a preview history, say)."""
MODELS = []


def keep(model):
    MODELS.append(model)


def release():
    MODELS.clear()


class KeepListKeeper:
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


NODE_CLASS_MAPPINGS = {"KeepListKeeper": KeepListKeeper}
