"""ComfyUI 0.27.0's part of the stand-in ``comfy/sd.py``: CLIP and VAE patchers are ``CoreModelPatcher``; the UNet's
patcher is built before its weights are copied in (``ModelPatcher`` when ``disable_dynamic``).

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""


def _patcher_class(disable_dynamic=False):
    return comfy.model_patcher.ModelPatcher if disable_dynamic else comfy.model_patcher.CoreModelPatcher


def _diffusion_model(unet_sd, disable_dynamic):
    """The UNet's patcher, built before its weights are copied in (as 0.27.0 does)."""
    model, tensors = _unet(unet_sd)
    load_device, offload_device = _devices()
    patcher = _patcher_class(disable_dynamic)(model, load_device=load_device, offload_device=offload_device)
    _copy_weights(model, tensors)
    return patcher
