"""Import a fake ComfyUI shape as if its directory were the ComfyUI root, and build simulated models.

Each shape (``v0_3_64``, ``v0_27_0``) is a directory with the real top-level module names (``comfy``,
``execution``, ``nodes``, ...), so two shapes cannot live in one process at the same time: every switch purges
the previous one from ``sys.modules``.  Nothing here imports torch or comfy at import time.
"""
import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = {"0.3.64": os.path.join(HERE, "v0_3_64"), "0.27.0": os.path.join(HERE, "v0_27_0")}
PACKS_DIR = os.path.join(HERE, "packs")
_TOP_LEVEL = ("comfy", "comfy_execution", "execution", "nodes", "comfyui_version", "main", "folder_paths",
              "hook_breaker_ac10a0", "server")


def shape_root(version):
    """The directory of a shape, for ``sys.path[0]`` or for running its main.py in a subprocess."""
    return SHAPES[version]


def purge_fake_comfy():
    """Forget every module of every shape (and custom-node packs they loaded) so the next import is fresh."""
    roots = tuple(SHAPES.values()) + (PACKS_DIR,)
    for name, module in list(sys.modules.items()):
        top = name.split(".", 1)[0]
        path = getattr(module, "__file__", None) or ""
        if top in _TOP_LEVEL or os.path.abspath(path).startswith(roots):
            del sys.modules[name]
    sys.path[:] = [p for p in sys.path if p not in SHAPES.values()]


def use_fake_comfy(version):
    """Put the ``version`` shape at ``sys.path[0]``, import it fresh and return its ``comfy.model_management``.

    ``comfy.cli_args`` is imported with argv parsing off, so ``args`` holds the defaults (simulated GPU).
    """
    purge_fake_comfy()
    importlib.invalidate_caches()
    sys.path.insert(0, SHAPES[version])
    return importlib.import_module("comfy.model_management")


def make_model(tensor_count=8, tensor_numel=1024):
    """A fresh ``comfy.model_base.BaseModel`` of the imported shape (float32 tensors)."""
    return importlib.import_module("comfy.model_base").BaseModel(tensor_count, tensor_numel)


def make_patcher(tensor_count=8, tensor_numel=1024, model=None):
    """A ModelPatcher of the imported shape, loading to the current torch device, offloading to CPU."""
    mm = sys.modules["comfy.model_management"]
    patcher_mod = importlib.import_module("comfy.model_patcher")
    model = make_model(tensor_count, tensor_numel) if model is None else model
    return patcher_mod.ModelPatcher(model, load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())
