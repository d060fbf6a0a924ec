"""Which ComfyUI comfy_memx runs in (its version, read without importing anything of ComfyUI), where ComfyUI's own
code lives, which custom-node package a source file belongs to, and whether ComfyUI's prompt queue has work.

A file belongs to a custom-node package by where it lies, whatever name its module was imported under (ComfyUI
registers a directory pack under the folder's absolute path; a pack that puts its folder on ``sys.path`` imports
its modules under top-level names): the folder (or single-file module) right under one of ComfyUI's custom-node
folders (``folder_paths``' ``custom_nodes`` entry: ``<base>/custom_nodes`` and what extra_model_paths.yaml adds) or
under any folder named ``custom_nodes``; for a pack ComfyUI loaded through a symbolic link, also under the link's
target.  ComfyUI's own code is the tree its ``comfy`` package was imported from, not ``folder_paths.base_path``:
with ``--base-directory`` (Desktop, most Docker images) that is the user's folder, and ComfyUI's modules lie elsewhere.
Everything here reads ``sys.modules`` and module dictionaries already loaded and imports nothing of ComfyUI.
"""

import ast
import os
import sys
from types import ModuleType


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
    """The custom-node package ``filename`` belongs to (:func:`pack_of_file`), else None.

    comfy_memx's own files are no package even when it is installed as a node pack under ``custom_nodes/``: its
    frames between a node and a load are not a pack the load came ``via``."""
    package = pack_of_file(filename)
    if package is None or os.path.abspath(filename).startswith(OWN_FILES):
        return None
    return package


_MODULE_DICT = ModuleType.__dict__["__dict__"]   # reading it never runs a module's own __getattr__


def _module_file(module):
    """``module.__file__`` read from its dictionary (no attribute hook runs), or None."""
    if not isinstance(module, ModuleType):
        return None
    try:
        path = _MODULE_DICT.__get__(module).get("__file__")
    except Exception:
        return None
    return path if isinstance(path, str) and path else None


def comfy_root():
    """The folder of ComfyUI's own code in this process: the tree ``comfy.model_management`` was imported from (the
    parent of its ``comfy`` package), else the folder of a ``main.py`` run as ``__main__``; None when ComfyUI does
    not run here.  What lies under it and under no custom-node folder is ComfyUI's (``core``)."""
    path = _module_file(sys.modules.get("comfy.model_management"))
    if path is not None:
        return os.path.dirname(os.path.dirname(os.path.abspath(path)))
    return main_folder()


def main_folder():
    """The folder of ComfyUI's ``main.py`` in this process (the module ``main``, or ``__main__`` when it is a
    ``main.py``), or None.  In a ComfyUI tree it is :func:`comfy_root`; an entry script kept apart from the tree
    (as the 0.3.64 stand-in's) is ComfyUI's own code too."""
    for name in ("main", "__main__"):
        path = _module_file(sys.modules.get(name))
        if path is not None and os.path.basename(path) == "main.py":
            return os.path.dirname(os.path.abspath(path))
    return None


class _Layout:
    """The last answers of :func:`custom_node_dirs` and :func:`_linked_packs`, each ``(what it was computed from,
    the answer)`` in one attribute (module-level caches: an answer is computed again when what it reads changed, so
    none needs a reset, and a reader on another thread sees a key with its own answer)."""
    dirs = (None, ())
    links = (None, ())


def _normcase(path):
    return os.path.normcase(os.path.abspath(path))


def custom_node_dirs():
    """ComfyUI's custom-node folders (``folder_paths.folder_names_and_paths["custom_nodes"]``), normalised, each
    ending with a separator; empty before ComfyUI's ``folder_paths`` is imported.

    # COMFY: ``folder_paths`` sets ``<base_path>/custom_nodes``; extra_model_paths.yaml can add folders of any name."""
    try:
        namespace = _MODULE_DICT.__get__(sys.modules["folder_paths"])
        entry = namespace["folder_names_and_paths"]["custom_nodes"]
        raw = tuple(path for path in entry[0] if isinstance(path, str) and path)
    except Exception:
        return ()
    known, dirs = _Layout.dirs
    if raw != known:
        dirs = tuple(os.path.join(_normcase(path), "") for path in raw)
        _Layout.dirs = (raw, dirs)
    return dirs


def _linked_packs(dirs):
    """``((target folder + separator, package), ...)`` for the directory packs ComfyUI loaded through a symbolic
    link, longest target first; computed again only when ComfyUI loaded another pack.

    # COMFY: ``nodes.LOADED_MODULE_DIRS`` maps each loaded pack's name to its folder as ComfyUI found it (0.3.64,
    0.27.0, 0.33.0); it only grows."""
    nodes = sys.modules.get("nodes")
    try:
        loaded = _MODULE_DICT.__get__(nodes).get("LOADED_MODULE_DIRS") if isinstance(nodes, ModuleType) else None
    except Exception:
        loaded = None
    if type(loaded) is not dict:
        return ()
    key = (id(loaded), len(loaded), dirs)
    known, links = _Layout.links
    if key != known:
        found = []
        for folder in [path for path in list(loaded.values()) if isinstance(path, str)]:
            place = os.path.join(_normcase(folder), "")
            package = _pack_by_place(place, dirs)
            target = os.path.join(_normcase(os.path.realpath(folder)), "")
            if package is not None and target != place:
                found.append((target, package))
        links = tuple(sorted(found, key=lambda pair: -len(pair[0])))
        _Layout.links = (key, links)
    return links


def _pack_by_place(path, dirs):
    """The first path part under one of ``dirs`` or under the outermost folder named ``custom_nodes`` of the
    normalised ``path`` (``.py`` stripped), or None when ``path`` lies in no custom-node folder or is that folder."""
    for directory in dirs:
        if path.startswith(directory):
            rest = path[len(directory):]
            break
    else:
        marker = os.sep + CUSTOM_NODES_DIR + os.sep
        at = path.find(marker)
        if at < 0:
            return None
        rest = path[at + len(marker):]
    name, below, _ = rest.partition(os.sep)
    if not name or (not below and not name.endswith(".py")):   # the folder itself, or a file that is no module
        return None
    return name[:-3] if name.endswith(".py") else name


def pack_of_file(filename, dirs=None):
    """The custom-node package a source file lies in, or None: the folder (or single-file module, ``.py`` stripped)
    right under one of ComfyUI's custom-node folders or under a folder named ``custom_nodes``, or the package of a
    pack ComfyUI loaded through a symbolic link whose target holds the file.  ``dirs``: :func:`custom_node_dirs`
    when a caller asking for many files read them once.  comfy_memx's own files count here (see
    :func:`package_of_file`)."""
    if not isinstance(filename, str) or not filename:
        return None
    dirs = custom_node_dirs() if dirs is None else dirs
    path = _normcase(filename)
    if CUSTOM_NODES_DIR in path or (dirs and path.startswith(dirs)):
        package = _pack_by_place(path, dirs)
        if package is not None:
            return package
    for target, package in _linked_packs(dirs):
        if path.startswith(target):
            return package
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
