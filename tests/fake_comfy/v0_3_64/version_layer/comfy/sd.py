"""ComfyUI 0.3.64's part of the stand-in ``comfy/sd.py``: every patcher is a ``ModelPatcher``; the UNet's is built
after its weights are copied in.

Runs at the end of the base module, in its namespace (``stand_in_version.apply_layer``).
"""


def _patcher_class(disable_dynamic=False):
    return comfy.model_patcher.ModelPatcher


def _diffusion_model(unet_sd, disable_dynamic):
    """The UNet's patcher, built after its weights are copied in (as 0.3.64 does)."""
    model, tensors = _unet(unet_sd)
    _copy_weights(model, tensors)
    load_device, offload_device = _devices()
    return _patcher_class()(model, load_device=load_device, offload_device=offload_device)
