"""A class-level cache keyed by resolution (the Qwen-Image-2512 shape): shared by every instance, never cleared."""


class StyleMixer:
    _cache = {}


def keep(model):
    StyleMixer._cache[(1328, 1328)] = model


def release():
    StyleMixer._cache.clear()


class KeepStyleMixer:
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


NODE_CLASS_MAPPINGS = {"KeepStyleMixer": KeepStyleMixer}
