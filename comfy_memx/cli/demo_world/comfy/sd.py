"""Stand-in for ComfyUI's ``comfy/sd.py``: the shape of its checkpoint loader and of its ``CLIP`` and ``VAE``.

``load_checkpoint_guess_config(ckpt_path, ...)`` reads the file with ``comfy.utils.load_torch_file`` and hands the
state dict to ``load_state_dict_guess_config``, which answers ``(model_patcher, clip, vae, clipvision)`` as ComfyUI
does: the diffusion model (the keys under ``model.diffusion_model.``) is a ``comfy.model_base.BaseModel`` in the
version's patcher (its layer's ``_diffusion_model``: 0.27.0 builds a ``CoreModelPatcher`` before the weights are
copied in, 0.3.64 a ``ModelPatcher`` after), ``CLIP`` (``cond_stage_model.``) and ``VAE``
(``first_stage_model.``) each build their own ModelPatcher around their torch module (``cond_stage_model``,
``first_stage_model``), and the CLIP vision part is None.  A part whose keys the file lacks is None (ComfyUI warns
that the checkpoint has no text encoder); a file with no diffusion-model key raises ``RuntimeError`` naming it.
Left out: model detection (the tensors of a part are that part's weights: equal 1-D tensors, as the stand-in's
``BaseModel`` has), dtypes, the text encoder's and VAE's own devices (the UNet's are used), tokenizers, encoding,
decoding and LoRA loading; the ``disable_dynamic`` arguments of 0.27.0 are accepted by every version.
"""
import logging

import torch

import comfy.model_base
import comfy.model_management
import comfy.model_patcher
import comfy.utils
import stand_in_version

UNET_PREFIX = "model.diffusion_model."
CLIP_PREFIX = "cond_stage_model."
VAE_PREFIX = "first_stage_model."


class _Tensors(torch.nn.Module):
    """A torch module whose weights are the tensors of one part of a checkpoint, copied (the file's are views)."""

    def __init__(self, sd):
        super().__init__()
        for index, key in enumerate(sorted(sd)):
            self.register_parameter(f"weight_{index}", torch.nn.Parameter(sd[key].detach().clone(),
                                                                          requires_grad=False))


class SD1ClipModel(_Tensors):
    """The text encoder module a ``CLIP`` holds as ``cond_stage_model`` (named like ComfyUI's SD1.x one)."""


class AutoencoderKL(_Tensors):
    """The VAE module a ``VAE`` holds as ``first_stage_model`` (named like ComfyUI's)."""


def _devices():
    mm = comfy.model_management
    return mm.get_torch_device(), mm.unet_offload_device()


class CLIP:
    """A text encoder: its module ``cond_stage_model`` in its own ModelPatcher ``patcher``; ``clone()`` shares the
    module under a clone of the patcher."""

    def __init__(self, target=None, embedding_directory=None, no_init=False, tokenizer_data={}, parameters=0,
                 state_dict=[], model_options={}, disable_dynamic=False):
        if no_init:
            return
        load_device, offload_device = _devices()
        self.cond_stage_model = SD1ClipModel(state_dict or {})
        self.patcher = _patcher_class()(self.cond_stage_model, load_device=load_device, offload_device=offload_device)
        self.layer_idx = None

    def clone(self):
        """A CLIP on the same module (a clone of the patcher), as ComfyUI's CLIP.clone."""
        n = CLIP(no_init=True)
        n.patcher = self.patcher.clone()
        n.cond_stage_model = self.cond_stage_model
        n.layer_idx = self.layer_idx
        return n

    def load_model(self):
        """Load the text encoder with ``load_models_gpu``, as encoding does; returns the patcher."""
        comfy.model_management.load_models_gpu([self.patcher])
        return self.patcher


class VAE:
    """A VAE: its module ``first_stage_model`` in its own ModelPatcher ``patcher``."""

    def __init__(self, sd=None, device=None, config=None, dtype=None, metadata=None):
        load_device, offload_device = _devices()
        self.device = device if device is not None else load_device
        self.offload_device = offload_device
        self.first_stage_model = AutoencoderKL(sd or {})
        self.patcher = _patcher_class()(self.first_stage_model, load_device=self.device,
                                        offload_device=offload_device)


def _part(sd, prefix):
    return {key[len(prefix):]: tensor for key, tensor in sd.items() if key.startswith(prefix)}


def _unet(unet_sd):
    """The UNet's module and the tensors to copy into it (the part's tensors in key order)."""
    tensors = [unet_sd[key] for key in sorted(unet_sd)]
    return comfy.model_base.BaseModel(len(tensors), tensors[0].numel()), tensors


def _copy_weights(model, tensors):
    with torch.no_grad():
        for block, tensor in zip(model.blocks, tensors):
            block.weight.copy_(tensor.reshape(-1))


def load_state_dict_guess_config(sd, output_vae=True, output_clip=True, output_clipvision=False,
                                 embedding_directory=None, output_model=True, model_options={}, te_model_options={},
                                 metadata=None, disable_dynamic=False):
    """``(model_patcher, clip, vae, clipvision)`` from a checkpoint's state dict, or None without a diffusion model."""
    unet_sd = _part(sd, UNET_PREFIX)
    if not unet_sd:
        return None
    model_patcher = _diffusion_model(unet_sd, disable_dynamic) if output_model else None
    vae = VAE(sd=_part(sd, VAE_PREFIX), metadata=metadata) if output_vae else None
    clip = None
    if output_clip:
        clip_sd = _part(sd, CLIP_PREFIX)
        if clip_sd:
            clip = CLIP(state_dict=clip_sd)
        else:
            logging.warning("no CLIP/text encoder weights in checkpoint, the text encoder model will not be loaded.")
    return (model_patcher, clip, vae, None)


def load_checkpoint_guess_config(ckpt_path, output_vae=True, output_clip=True, output_clipvision=False,
                                 embedding_directory=None, output_model=True, model_options={}, te_model_options={},
                                 disable_dynamic=False):
    """Load the checkpoint file ``ckpt_path``: ``(model_patcher, clip, vae, clipvision)``."""
    sd, metadata = comfy.utils.load_torch_file(ckpt_path, return_metadata=True)
    out = load_state_dict_guess_config(sd, output_vae, output_clip, output_clipvision, embedding_directory,
                                       output_model, model_options, te_model_options, metadata=metadata,
                                       disable_dynamic=disable_dynamic)
    if out is None:
        raise RuntimeError("ERROR: Could not detect model type of: {}".format(ckpt_path))
    return out


stand_in_version.apply_layer(globals())   # _patcher_class and _diffusion_model: how the version builds them
