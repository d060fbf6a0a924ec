"""Which ComfyUI comfy_memx runs in (its version, read without importing anything of ComfyUI), which
custom-node package a source file belongs to, and whether ComfyUI's prompt queue has work."""

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


CUSTOM_NODES_DIR = "custom_nodes"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # this comfy_memx
# comfy_memx's own files: the package, and in a node-pack checkout the patches beside it and the pack's entry
OWN_FILES = (os.path.join(_PACKAGE_DIR, ""), os.path.join(os.path.dirname(_PACKAGE_DIR), "patches", ""),
             os.path.join(os.path.dirname(_PACKAGE_DIR), "__init__.py"))


def package_of_file(filename):
    """The folder (or single-file module name) right under a custom_nodes directory in ``filename``, else None.

    comfy_memx's own files are no package even when it is installed as a node pack under ``custom_nodes/``: its
    frames between a node and a load are not a pack the load came ``via``."""
    if not filename or CUSTOM_NODES_DIR not in filename or os.path.abspath(filename).startswith(OWN_FILES):
        return None
    parts = os.path.normpath(filename).split(os.sep)
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] == CUSTOM_NODES_DIR:
            name = parts[i + 1]
            return name[:-3] if name.endswith(".py") else name
    return None


def queue_busy(queue):
    """True when ComfyUI's prompt queue has a prompt running or waiting (read under the queue's own mutex)."""
    if queue is None:
        return False
    with queue.mutex:
        return bool(getattr(queue, "queue", None) or getattr(queue, "currently_running", None))


def running_prompt_ids():
    """The ids of the prompts ComfyUI's worker is running now (``PromptServer.instance.prompt_queue``'s
    ``currently_running`` items are ``(number, prompt_id, ...)``); empty when there is no server or none runs."""
    server = sys.modules.get("server")
    instance = getattr(getattr(server, "PromptServer", None), "instance", None)
    running = getattr(getattr(instance, "prompt_queue", None), "currently_running", None)
    if not isinstance(running, dict):
        return set()
    return {item[1] for item in list(running.values())
            if isinstance(item, (tuple, list)) and len(item) > 1 and isinstance(item[1], str)}
