"""Keeps the last model in a ``threading.local`` (of ComfyUI's prompt worker thread, which never ends)."""
import threading

TLS = threading.local()


def keep(model):
    TLS.model = model


def release():
    TLS.__dict__.clear()


class KeepThreadStash:
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


NODE_CLASS_MAPPINGS = {"KeepThreadStash": KeepThreadStash}
