"""Stand-in for ComfyUI's ``nodes.py``: a few core nodes for simulated models and the custom-node loader.

Core nodes: ``SimModelLoader`` (a ModelPatcher around a ``comfy.model_base.BaseModel`` of N tensors),
``SimModelClone`` (``patcher.clone()``, like a LoRA loader), ``SimSampler`` (``load_models_gpu([model])``,
optionally raising a CUDA OOM) and ComfyUI's ``CheckpointLoaderSimple`` (``comfy.sd``'s checkpoint loader).
``init_extra_nodes`` imports every pack in the ``custom_nodes`` folders (``folder_paths``) and merges its
NODE_CLASS_MAPPINGS without overriding core nodes, like the real loader.
"""
import importlib.util
import logging
import os
import sys
import time
import traceback

import torch

import comfy.model_base
import comfy.model_management
import comfy.model_patcher
import comfy.sd
import folder_paths
from comfy.cli_args import args


def before_node_execution():
    comfy.model_management.throw_exception_if_processing_interrupted()


def interrupt_processing(value=True):
    comfy.model_management.interrupt_current_processing(value)


class SimModelLoader:
    """Builds a model of ``tensor_count`` float32 tensors of ``tensor_numel`` elements (its output is cached)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tensor_count": ("INT", {"default": 8}), "tensor_numel": ("INT", {"default": 1024})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"

    def load(self, tensor_count=8, tensor_numel=1024):
        model = comfy.model_base.BaseModel(tensor_count, tensor_numel)
        mm = comfy.model_management
        return (comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device()),)


class SimModelClone:
    """Returns a clone of the input patcher (same torch module), as patch-applying nodes do."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "clone"

    def clone(self, model):
        return (model.clone(),)


class SimSampler:
    """Loads the model with ``load_models_gpu`` and reports its resident bytes; ``raise_oom`` simulates a CUDA OOM."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)},
                "optional": {"memory_required": ("INT", {"default": 0}), "raise_oom": ("BOOLEAN", {"default": False})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "sample"
    OUTPUT_NODE = True

    def sample(self, model, memory_required=0, raise_oom=False):
        comfy.model_management.load_models_gpu([model], memory_required=memory_required)
        if raise_oom:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return (model.loaded_size(),)


class CheckpointLoaderSimple:
    """ComfyUI's core checkpoint loader: ``comfy.sd.load_checkpoint_guess_config`` on a file of the checkpoints
    folder, answering its MODEL, CLIP and VAE."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ckpt_name": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load_checkpoint"

    def load_checkpoint(self, ckpt_name):
        ckpt_path = folder_paths.get_full_path_or_raise("checkpoints", ckpt_name)
        return comfy.sd.load_checkpoint_guess_config(ckpt_path, output_vae=True, output_clip=True)[:3]


NODE_CLASS_MAPPINGS = {"SimModelLoader": SimModelLoader, "SimModelClone": SimModelClone, "SimSampler": SimSampler,
                       "CheckpointLoaderSimple": CheckpointLoaderSimple}
NODE_DISPLAY_NAME_MAPPINGS = {}
LOADED_MODULE_DIRS = {}


def get_module_name(module_path):
    """The pack name: the file or directory name without a ``.py`` suffix or trailing separator."""
    base = os.path.basename(os.path.normpath(module_path))
    return os.path.splitext(base)[0] if os.path.isfile(module_path) else base


async def load_custom_node(module_path, ignore=set(), module_parent="custom_nodes"):
    """Import one pack (file or package) and merge its NODE_CLASS_MAPPINGS; False on any import error."""
    module_name = get_module_name(module_path)
    if os.path.isfile(module_path):
        sys_module_name = os.path.splitext(module_path)[0]
        init_path, module_dir = module_path, os.path.dirname(module_path)
    else:
        sys_module_name = module_path.replace(".", "_x_")
        init_path, module_dir = os.path.join(module_path, "__init__.py"), module_path
    try:
        logging.debug("Trying to load custom node {}".format(module_path))
        spec = importlib.util.spec_from_file_location(sys_module_name, init_path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[sys_module_name] = module
        spec.loader.exec_module(module)
        LOADED_MODULE_DIRS[module_name] = os.path.abspath(module_dir)
        if getattr(module, "NODE_CLASS_MAPPINGS", None) is None:
            logging.warning(f"Skip {module_path} module for custom nodes due to the lack of NODE_CLASS_MAPPINGS or comfy_entrypoint (need one).")
            return False
        for name, node_cls in module.NODE_CLASS_MAPPINGS.items():
            if name not in ignore:
                NODE_CLASS_MAPPINGS[name] = node_cls
                node_cls.RELATIVE_PYTHON_MODULE = "{}.{}".format(module_parent, module_name)
        NODE_DISPLAY_NAME_MAPPINGS.update(getattr(module, "NODE_DISPLAY_NAME_MAPPINGS", None) or {})
        return True
    except Exception as e:
        logging.warning(traceback.format_exc())
        logging.warning(f"Cannot import {module_path} module for custom nodes: {e}")
        return False


async def init_external_custom_nodes():
    """Load every pack found in the custom_nodes folders, honouring --disable-all-custom-nodes / whitelist."""
    base_node_names = set(NODE_CLASS_MAPPINGS.keys())
    for custom_node_path in folder_paths.get_folder_paths("custom_nodes"):
        if not os.path.isdir(custom_node_path):
            continue
        for possible_module in sorted(os.listdir(os.path.realpath(custom_node_path))):
            module_path = os.path.join(custom_node_path, possible_module)
            if possible_module == "__pycache__" or possible_module.startswith("."):
                continue
            if os.path.isfile(module_path) and os.path.splitext(module_path)[1] != ".py":
                continue
            if module_path.endswith(".disabled"):
                continue
            if args.disable_all_custom_nodes and possible_module not in args.whitelist_custom_nodes:
                logging.info(f"Skipping {possible_module} due to disable_all_custom_nodes and whitelist_custom_nodes")
                continue
            time_before = time.perf_counter()
            success = await load_custom_node(module_path, base_node_names, module_parent="custom_nodes")
            logging.debug("{:6.1f} seconds{}: {}".format(time.perf_counter() - time_before, "" if success else " (IMPORT FAILED)", module_path))


async def init_extra_nodes(init_custom_nodes=True, init_api_nodes=True):
    """Load custom nodes (there are no built-in extra or API nodes in the stand-in)."""
    if init_custom_nodes:
        await init_external_custom_nodes()
    else:
        logging.info("Skipping loading of custom nodes")
