"""comfy_memx as a ComfyUI custom-node pack: this repository cloned (or unzipped) into ``ComfyUI/custom_nodes/``.

ComfyUI-Manager's git-URL install, ``comfy node install`` and a manual clone all put the repository there, and
ComfyUI imports this file while it loads custom nodes.  It adds no node (``NODE_CLASS_MAPPINGS`` is empty); it
activates comfy_memx late (``comfy_memx/nodepack.py``) and serves the memory panel from ``WEB_DIRECTORY``.  The pack
folder's own ``comfy_memx`` is imported unless one is already imported (the launcher, ``COMFY_MEMX=1``); the pack
folder never stays on ``sys.path``, so ``patches``, ``tests`` or ``bench`` never become top-level modules.  Nothing
here raises into ComfyUI's node loading, and nothing happens when this file is imported outside ComfyUI.
"""

import logging
import os
import sys

NODE_CLASS_MAPPINGS = {}
NODE_DISPLAY_NAME_MAPPINGS = {}
WEB_DIRECTORY = "./comfy_memx/web"
__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]

PACK_DIR = os.path.dirname(os.path.abspath(__file__))
# The module of ComfyUI that loads custom nodes (load_custom_node): without it this file was imported by something
# else (pytest collects a folder with an __init__.py as a package, tools scan packs) and activates nothing.
COMFYUI_NODE_LOADER = "nodes"


def _import_comfy_memx():
    """Import the comfy_memx package; returns (module, whether it was imported before this pack).

    ComfyUI registers a pack in ``sys.modules`` under its folder's path, and some versions under the bare folder
    name: with the folder named ``comfy_memx`` that entry is this file, not the package, so it is replaced."""
    existing = sys.modules.get("comfy_memx")
    if existing is not None and getattr(existing, "__dict__", None) is globals():
        del sys.modules["comfy_memx"]
        existing = None
    if existing is not None:
        return existing, True
    sys.path.insert(0, PACK_DIR)
    try:
        import comfy_memx
    finally:
        try:
            sys.path.remove(PACK_DIR)
        except ValueError:
            pass
    return comfy_memx, False


def _activate():
    if COMFYUI_NODE_LOADER not in sys.modules:
        return
    try:
        _, imported_before = _import_comfy_memx()
        from comfy_memx import nodepack
        nodepack.activate(PACK_DIR, imported_before)
    except Exception as exc:  # never break ComfyUI's custom-node loading
        logging.getLogger("comfy_memx").error(
            "comfy_memx node pack (%s): start-up failed (%r); comfy_memx is NOT active, ComfyUI runs unpatched",
            PACK_DIR, exc)


_activate()
