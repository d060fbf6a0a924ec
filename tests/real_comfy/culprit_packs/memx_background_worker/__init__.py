"""Starts a background thread of its own that keeps the model in a local variable (a preview loop)."""
import threading

_RELEASE = threading.Event()
_THREADS = []


def keep(model):
    box = [model]
    taken = threading.Event()

    def preview_loop():
        model = box.pop()
        taken.set()
        _RELEASE.wait(600)
        del model
    thread = threading.Thread(target=preview_loop, name="preview-loop", daemon=True)
    thread.start()
    _THREADS.append(thread)
    taken.wait(10)


def release():
    _RELEASE.set()
    for thread in _THREADS:
        thread.join(10)
    _THREADS.clear()
    _RELEASE.clear()


class KeepBackgroundWorker:
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


NODE_CLASS_MAPPINGS = {"KeepBackgroundWorker": KeepBackgroundWorker}
