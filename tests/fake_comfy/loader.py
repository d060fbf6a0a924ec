"""Import a fake ComfyUI shape as if its directory were the ComfyUI root, and build simulated models.

Every shape runs the same base, the demo's world that ships in comfy_memx (``comfy_memx/cli/demo_world``, taken from
the comfy_memx this process imports, so a wheel install runs its own copy), with the real top-level module names
(``comfy``, ``execution``, ``nodes``, ...).  A shape's folder, first on ``sys.path`` and the base after it, holds its
``comfyui_version.py``, ``main.py`` and ``version_layer/`` (what that version does differently): 0.27.0's folder is
the base itself, 0.3.64's is ``v0_3_64`` here.  Two shapes cannot live in one process at the same time: every switch
purges the previous one from ``sys.modules``.  Nothing here imports torch or comfy at import time.
"""
import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.abspath(importlib.util.find_spec("comfy_memx.cli.demo_world").submodule_search_locations[0])
SHAPES = {"0.3.64": os.path.join(HERE, "v0_3_64"), "0.27.0": BASE}
PACKS_DIR = os.path.join(HERE, "packs")
_TOP_LEVEL = ("comfy", "comfy_execution", "execution", "nodes", "comfyui_version", "main", "folder_paths",
              "hook_breaker_ac10a0", "server", "stand_in_version")


def shape_root(version):
    """The folder of a shape (its main.py and comfyui_version.py), for running its main.py in a subprocess or
    reading its version; to import it, put :func:`shape_paths` first on ``sys.path``."""
    return SHAPES[version]


def shape_paths(version):
    """The ``sys.path`` entries that make the shape importable, in order: its folder, then the base."""
    return list(dict.fromkeys([SHAPES[version], BASE]))


def purge_fake_comfy():
    """Forget every module of every shape (and custom-node packs they loaded, with the folders those put on
    ``sys.path``) so the next import is fresh.

    comfy_memx's own modules stay, though the 0.27.0 shape's folder is a package of comfy_memx too."""
    roots = tuple(os.path.join(root, "") for root in SHAPES.values()) + (os.path.join(PACKS_DIR, ""),)
    for name, module in list(sys.modules.items()):
        top = name.split(".", 1)[0]
        path = getattr(module, "__file__", None) or ""
        if top in _TOP_LEVEL or (top != "comfy_memx" and os.path.abspath(path).startswith(roots)):
            del sys.modules[name]
    # the shapes, and the folders packs put on sys.path to import their modules under top-level names
    sys.path[:] = [p for p in sys.path if p not in SHAPES.values() and not str(p).startswith(roots[-1])]


def use_fake_comfy(version):
    """Put the ``version`` shape at ``sys.path[0]``, import it fresh and return its ``comfy.model_management``.

    ``comfy.cli_args`` is imported with argv parsing off, so ``args`` holds the defaults (simulated GPU).
    """
    purge_fake_comfy()
    importlib.invalidate_caches()
    sys.path[:0] = shape_paths(version)
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
