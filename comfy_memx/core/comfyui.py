"""Which ComfyUI comfy_memx runs in: its version, read without importing anything of ComfyUI."""

import ast
import os
import sys


def version_of_tree(tree):
    """``__version__`` from ``comfyui_version.py`` of a ComfyUI tree (read as text, not imported), or None."""
    path = os.path.join(tree, "comfyui_version.py")
    try:
        with open(path, encoding="utf-8") as f:
            body = ast.parse(f.read()).body
    except (OSError, SyntaxError, ValueError):
        return None
    for node in body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def running_version(model_management=None):
    """The version of the ComfyUI this process runs: ``comfyui_version.__version__`` if imported, else read from
    the tree that ``model_management`` (its ``comfy.model_management``) was imported from; None when unknown."""
    module = sys.modules.get("comfyui_version")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    path = getattr(model_management, "__file__", None)
    if not path:
        return None
    return version_of_tree(os.path.dirname(os.path.dirname(os.path.abspath(path))))
