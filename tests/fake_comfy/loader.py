"""Import a fake ComfyUI shape as if its directory were the ComfyUI root, and build simulated models.

Each shape is a directory with the real top-level module names (``comfy``, ``execution``, ``nodes``, ...): 0.3.64
is ``v0_3_64`` here, 0.27.0 is the demo's world that ships in comfy_memx (``comfy_memx/cli/demo_world``, taken from
the comfy_memx this process imports, so a wheel install runs its own copy).  Two shapes cannot live in one process
at the same time: every switch purges the previous one from ``sys.modules``.  Nothing here imports torch or comfy
at import time.
"""
import importlib
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO_WORLD = importlib.util.find_spec("comfy_memx.cli.demo_world").submodule_search_locations[0]
SHAPES = {"0.3.64": os.path.join(HERE, "v0_3_64"), "0.27.0": os.path.abspath(DEMO_WORLD)}
PACKS_DIR = os.path.join(HERE, "packs")
_TOP_LEVEL = ("comfy", "comfy_execution", "execution", "nodes", "comfyui_version", "main", "folder_paths",
              "hook_breaker_ac10a0", "server")


def shape_root(version):
    """The directory of a shape, for ``sys.path[0]`` or for running its main.py in a subprocess."""
    return SHAPES[version]


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
