"""A custom-node pack of our own that patches ComfyUI the way ComfyUI-MultiGPU does (from its public behaviour).

* At import it wraps a core function that a core node calls on its way to ``load_models_gpu`` (MultiGPU wraps
  ``comfy.sample.sample``, which KSampler calls; the stand-ins' sampler calls ``SimSampler.sample``).
* Its loader node ``DisTorchLoader`` replaces ``comfy.model_management.load_models_gpu`` outright with a function
  that calls ComfyUI's own original (reached with ``inspect.unwrap``), never the wrapper it replaced.
* ``request_free(queue)`` is its RAM monitor: it sets ComfyUI's ``free_memory`` flag, as POST /free would.

Works with both stand-in shapes.
"""
import inspect

import comfy.model_management
import nodes

_core_sample = nodes.SimSampler.sample


def sample_wrapper(self, *args, **kwargs):
    """What a device-selecting wrapper around the core sampler does: pick a device, then call the core function."""
    return _core_sample(self, *args, **kwargs)


nodes.SimSampler.sample = sample_wrapper
_comfyui_load_models_gpu = inspect.unwrap(comfy.model_management.load_models_gpu)


def distorch_load_models_gpu(models, *args, **kwargs):
    """The replacement: ComfyUI's own loader (here unchanged), not whatever wrapped it."""
    return _comfyui_load_models_gpu(models, *args, **kwargs)


def install_replacement():
    """Replace load_models_gpu, as MultiGPU's DisTorch2 loaders do when they first run."""
    comfy.model_management.load_models_gpu = distorch_load_models_gpu


def restore():
    """Put ComfyUI's functions back (for tests)."""
    nodes.SimSampler.sample = _core_sample


def request_free(queue):
    """The RAM monitor's way of asking ComfyUI to free memory."""
    queue.set_flag("free_memory", True)


class DisTorchLoader:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"

    def load(self, model):
        install_replacement()
        return (model,)


NODE_CLASS_MAPPINGS = {"DisTorchLoader": DisTorchLoader}
