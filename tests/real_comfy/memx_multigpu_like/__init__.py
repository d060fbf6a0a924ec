"""A custom-node pack of our own that patches ComfyUI the way ComfyUI-MultiGPU does (its public behaviour; none of
its code):

* at import it wraps ``comfy.sample.sample`` (the function KSampler calls on its way to ``load_models_gpu``);
* its ``MemxDisTorchLoader`` node replaces ``comfy.model_management.load_models_gpu`` outright with a function that
  calls ComfyUI's own original (``inspect.unwrap``), never the wrapper it replaced;
* its ``MemxRamMonitor`` node starts the pack's RAM monitor thread, which sets ComfyUI's ``free_memory`` flag as
  POST /free would.
"""
import inspect
import threading

import comfy.model_management
import comfy.sample

CATEGORY = "memx/testing"
_core_sample = comfy.sample.sample


def sample(*args, **kwargs):
    """Pick a device (here: nothing to pick), then call the core sampler."""
    return _core_sample(*args, **kwargs)


comfy.sample.sample = sample
_comfyui_load_models_gpu = inspect.unwrap(comfy.model_management.load_models_gpu)


def distorch_load_models_gpu(models, *args, **kwargs):
    """The replacement: ComfyUI's own loader, whatever wrapped it."""
    return _comfyui_load_models_gpu(models, *args, **kwargs)


class MemxDisTorchLoader:
    CATEGORY = CATEGORY
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    def load(self, model):
        comfy.model_management.load_models_gpu = distorch_load_models_gpu
        return (model,)


def _monitor():
    import server
    server.PromptServer.instance.prompt_queue.set_flag("free_memory", True)


class MemxRamMonitor:
    CATEGORY = CATEGORY
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "watch"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    def watch(self, model):
        thread = threading.Thread(target=_monitor, name="ram-monitor", daemon=True)
        thread.start()
        thread.join(10)
        return (model,)


NODE_CLASS_MAPPINGS = {"MemxDisTorchLoader": MemxDisTorchLoader, "MemxRamMonitor": MemxRamMonitor}
