"""Wraps ComfyUI's ``ModelPatcher`` constructor (``comfy.model_patcher``) so that every model enters the ledger when
it is built, loaded or not.

ComfyUI's loaders wrap every model they make in a ModelPatcher: ``comfy.sd.load_state_dict_guess_config`` and
``load_diffusion_model_state_dict`` the UNet's, ``CLIP.__init__`` one around ``cond_stage_model``, ``VAE.__init__``
one around ``first_stage_model`` (and the CLIP vision, ControlNet, upscale and other loaders likewise).  A pack that
keeps what such a loader returned, without any sampler ever loading it, keeps memory that ComfyUI's model management
never sees; the ledger needs to know it from the moment it is built, with the node and package that asked.
``ModelPatcher.clone`` builds a new patcher around the *same* torch module: the subscribers tell a clone from a new
model by the module (first sight of a module is its creation).

Checked against ComfyUI 0.3.64, 0.27.0 and 0.33.0: ``ModelPatcher.__init__(model, load_device, offload_device,
size=0, weight_inplace_update=False)`` in all three.
# COMFY: ``CoreModelPatcher`` (0.27.0+) is the same class object as ``ModelPatcher`` unless DynamicVRAM is on, and
``ModelPatcherDynamic.__init__`` calls ``super().__init__`` first (its ``__new__`` returns a plain ``ModelPatcher``
for a CPU load device), so wrapping the one class attribute covers every patcher ComfyUI builds, whatever name the
caller bound (``comfy/sd.py`` binds the class, not the function); a pack's subclass that calls ``super().__init__``
is covered too.  The wrapper fires after ComfyUI's constructor returned (``self.model`` is set, nothing else of the
patcher is called); an exception from the constructor propagates and fires nothing.
Fires ``patcher_built`` (``comfy_memx.core.signals``); the ledger subscribes (``ledger.subscriptions``).
Settings: ``COMFY_MEMX_DISABLE=model_patcher`` (models then enter the ledger at their first load only).
"""

import sys

from comfy_memx.core import signals
from comfy_memx.core.patching import Patch


def _memx_init(model_patcher, original, switch):
    def __init__(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        signals.patcher_built.fire(self, sys._getframe(1))
        return result
    return __init__


class ModelPatcherPatch(Patch):
    """Every ModelPatcher ComfyUI builds: a new model enters the ledger with who built it."""

    name = "model_patcher"
    target = "comfy.model_patcher"
    sites = {"ModelPatcher.__init__": _memx_init}


PATCH = ModelPatcherPatch()
