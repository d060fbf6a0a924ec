"""Which package owns a module: a custom-node package, ComfyUI itself (``core``), or a top-level package.

A leak report is only useful if it says whose code to fix, so every holder chain carries the package that owns
its root.  Everything here reads ``sys.modules`` and module ``__dict__`` entries that are already loaded; it
imports nothing (in particular not ComfyUI's ``folder_paths``) and touches the filesystem only through
``os.path`` string operations.
"""

import os
import sys
from types import ModuleType

from comfy_memx.core import comfyui

CORE = "core"

# ModuleType's own __dict__ getter: reading it never runs a module-level __getattr__ (lazy-import shims do).
_MODULE_DICT = ModuleType.__dict__["__dict__"]


def module_namespace(module):
    """Return ``module.__dict__`` without running any attribute hook of the module (or ``{}`` if unreadable)."""
    try:
        return _MODULE_DICT.__get__(module)
    except Exception:
        return {}


def display_module_name(name):
    """Return the dotted name a person would recognise for a module called ``name`` in ``sys.modules``.

    # COMFY: nodes.py load_custom_node (0.3.64, 0.27.0) registers a custom-node package under its *directory
    path* (``/srv/ComfyUI/custom_nodes/some_pack``) and its submodules become ``/srv/.../some_pack.model``.
    Such names are shortened to the part after the last path separator (``some_pack.model``); other names are
    returned unchanged.
    """
    if not isinstance(name, str):
        return "?"
    cut = max(name.rfind("/"), name.rfind("\\"))
    return name[cut + 1:] if cut >= 0 else name


def default_comfy_root():
    """ComfyUI's own code folder in this process (``core.comfyui.comfy_root``: the tree its ``comfy`` package was
    imported from, else main.py's folder), or ``None`` when ComfyUI is not running here.

    Not ``folder_paths.base_path``: with ``--base-directory`` that is the user's folder, and ComfyUI's own modules
    (``folder_paths``, ``execution``, ``comfy.*``) would be named as packages of their own.
    """
    return comfyui.comfy_root()


def _norm(path):
    return os.path.normcase(os.path.abspath(path))


def _first_part_under(path, directory):
    """The first path component of ``path`` below ``directory``, or ``None`` if ``path`` is not inside it."""
    directory = directory.rstrip(os.sep)
    if not path.startswith(directory + os.sep):
        return None
    rest = path[len(directory) + 1:]
    return rest.split(os.sep, 1)[0] or None


def _strip_py(name):
    return name[:-3] if name.endswith(".py") else name


def _top_level_from_file(path):
    """Top-level importable name for a file, found via the longest ``sys.path`` entry that contains it."""
    best = None
    for entry in sys.path:
        if not isinstance(entry, str):
            continue
        directory = _norm(entry or os.curdir)
        part = _first_part_under(path, directory)
        if part is not None and (best is None or len(directory) > best[0]):
            best = (len(directory), part)
    if best is not None:
        return _strip_py(best[1])
    return _strip_py(os.path.basename(path))


def package_of(module_or_file, comfy_root=None):
    """Name the package that owns a module: the custom-node package, ``core``, or the top-level package.

    ``module_or_file`` is a module object, a module name present in ``sys.modules``, or a source file path.

    * a file inside a custom-node directory (a directory named ``custom_nodes``, or one of ComfyUI's configured
      custom-node paths) belongs to the directory (or single-file module) right under it: ``some_pack``;
    * a file inside ``comfy_root`` (default: :func:`default_comfy_root`) belongs to ``core``;
    * anything else belongs to its top-level package name (``torch``, ``comfy_memx``, ``threading``).

    Example::

        >>> package_of("/srv/ComfyUI/custom_nodes/some_pack/model.py")
        'some_pack'

    .. versionadded:: 0.1
    """
    name = None
    path = None
    module = module_or_file
    if isinstance(module_or_file, str):
        module = sys.modules.get(module_or_file)
        if module is None:
            if os.sep in module_or_file or "/" in module_or_file or module_or_file.endswith(".py"):
                path = module_or_file
            else:
                name = module_or_file
    if isinstance(module, ModuleType):
        namespace = module_namespace(module)
        name = namespace.get("__name__")
        path = namespace.get("__file__")
    if isinstance(path, str) and path:
        return _package_of_file(_norm(path), name, comfy_root)
    if isinstance(name, str) and name:
        return display_module_name(name).split(".", 1)[0]
    return "?"


def custom_node_dirs():
    """ComfyUI's custom-node directories, normalised (empty before ComfyUI's ``folder_paths`` is imported)."""
    return comfyui.custom_node_dirs()


def custom_node_package_of_file(path, dirs=None):
    """The custom-node package a source file belongs to by where it lies (``core.comfyui.pack_of_file``: under a
    custom-node folder, or under the target of a pack folder ComfyUI loaded through a link), whatever name its module
    was imported under; ``None`` when it lies in no custom-node package.

    ``dirs`` are ComfyUI's custom-node directories (default: read now); a caller asking for many files reads them
    once."""
    return comfyui.pack_of_file(path, dirs)


def custom_node_package_of_module(name):
    """The custom-node package of the module named ``name`` in ``sys.modules``, or ``None``."""
    module = sys.modules.get(name)
    if not isinstance(module, ModuleType):
        return None
    return custom_node_package_of_file(module_namespace(module).get("__file__"))


def custom_node_modules():
    """``[(name, module, package)]`` for every module in ``sys.modules`` loaded from a custom-node directory.

    A module counts when its ``__file__`` lies in a directory named ``custom_nodes`` or in one of ComfyUI's
    configured custom-node paths, as for :func:`package_of`; ``package`` is the name :func:`package_of` gives it.
    Reads only ``sys.modules`` and module ``__dict__`` entries (no module attribute hook runs); a module registered
    under several names is listed once, under its own ``__name__`` when that is one of them.

    .. versionadded:: 0.2
    """
    dirs = comfyui.custom_node_dirs()
    found = {}
    for name, module in list(sys.modules.items()):
        if not isinstance(module, ModuleType):
            continue
        namespace = module_namespace(module)
        package = custom_node_package_of_file(namespace.get("__file__"), dirs)
        if package is None:
            continue
        key = id(namespace)
        if key not in found or namespace.get("__name__") == name:
            found[key] = (name, module, package)
    return list(found.values())


class _Loaded:
    """The last answer of :func:`custom_node_packages` and what it was computed from."""
    key, packages = None, frozenset()


def custom_node_packages():
    """The names of the custom-node packages loaded in this process, as holder chains name them: the package of
    every module in ``sys.modules`` whose file lies in one (:func:`custom_node_modules`).

    Cheap to ask often (the release engine asks it of every holder): the answer is kept until ``sys.modules``
    changes (its size and the sum of its modules' ids, read at C speed), then computed again."""
    modules = sys.modules
    key = (len(modules), sum(map(id, list(modules.values()))), comfyui.custom_node_dirs())
    if key != _Loaded.key:
        _Loaded.packages = frozenset(package for _, _, package in custom_node_modules())
        _Loaded.key = key
    return _Loaded.packages


def is_custom_node_package(name):
    """True when ``name`` is a custom-node package loaded in this process (see :func:`custom_node_packages`);
    ``core``, ``comfy_memx`` run from site-packages and other top-level packages are not."""
    return name in custom_node_packages()


def _package_of_file(path, module_name, comfy_root):
    package = comfyui.pack_of_file(path)
    if package is not None:
        return package
    roots = (comfy_root,) if comfy_root is not None else (default_comfy_root(), comfyui.main_folder())
    if any(root and _first_part_under(path, _norm(root)) is not None for root in roots):
        return CORE
    if isinstance(module_name, str) and module_name and "/" not in module_name and "\\" not in module_name:
        top = module_name.split(".", 1)[0]
        if top != "__main__":
            return top
    return _top_level_from_file(path)
