"""Registers a callback that captured the model in a global hook list, and never unregisters it."""
CALLBACKS = []


def keep(model):
    CALLBACKS.append(lambda: model)


def release():
    CALLBACKS.clear()


class KeepHookHub:
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


NODE_CLASS_MAPPINGS = {"KeepHookHub": KeepHookHub}
