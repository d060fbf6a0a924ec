"""An ``functools.lru_cache`` loader keyed by file name that returns the model itself."""
import functools

_SOURCE = []


@functools.lru_cache(maxsize=8)
def cached_load(path):
    return _SOURCE.pop()


def keep(model):
    _SOURCE.append(model)
    cached_load("qwen_image_2512.safetensors")


def release():
    cached_load.cache_clear()


class KeepLoraCache:
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


NODE_CLASS_MAPPINGS = {"KeepLoraCache": KeepLoraCache}
