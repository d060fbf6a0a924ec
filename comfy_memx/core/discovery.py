"""Which patch modules and wing subscriptions this installation has: the ``.py`` files of ``comfy_memx.patches``
(the package itself is imported: in a checkout its ``__init__`` adds the top-level ``patches/`` to its path; the
modules are not), and the ``subscriptions.py`` of each ``comfy_memx`` subpackage (so core names no wing).

Discovery must never silently find nothing: an installation that lost its patch modules (a wheel built without
them, a checkout without its ``patches/`` folder) would otherwise run ComfyUI unpatched and say nothing.
:func:`require_patches` turns that into a :class:`~comfy_memx.core.errors.SetupError` naming the cause; the
bootstrap calls it, so the launcher exits 2 and ``COMFY_MEMX=1`` logs one ERROR.
"""

import importlib
import os

from comfy_memx.core.errors import SetupError

PACKAGE = "comfy_memx.patches"
FIRST = "model_management"  # applied first: the other patches build on its ledger and reason scopes


def patches_dirs():
    """The folders of ``comfy_memx.patches`` ([] when the package itself cannot be found)."""
    try:
        package = importlib.import_module(PACKAGE)
    except ImportError:
        return []
    return [folder for folder in getattr(package, "__path__", ()) if os.path.isdir(folder)]


def patch_names(folders=None):
    """Names of the patch modules (``model_management`` first, then alphabetical); private ``_*`` files excluded."""
    names = set()
    for folder in patches_dirs() if folders is None else folders:
        try:
            entries = os.listdir(folder)
        except OSError:
            continue
        names.update(name[:-3] for name in entries if name.endswith(".py") and not name.startswith("_"))
    return tuple(sorted(names, key=lambda name: (name != FIRST, name)))


def subscription_modules():
    """``comfy_memx.<wing>.subscriptions`` for every subpackage of ``comfy_memx`` that has one, in name order (the
    order their subscribers run in for a signal they share)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    names = set()
    for entry in os.listdir(here):
        if not entry.startswith(("_", ".")) and os.path.isfile(os.path.join(here, entry, "subscriptions.py")):
            names.add(f"comfy_memx.{entry}.subscriptions")
    return tuple(sorted(names))


def require_patches(names):
    """Raise :class:`SetupError` naming the cause when ``names`` (from :func:`patch_names`) is empty."""
    if names:
        return
    folders = patches_dirs()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if folders:
        where = f"{PACKAGE} at {', '.join(folders)} holds no patch module"
    else:
        where = f"{PACKAGE} is missing from {here}"
    raise SetupError(f"{where}: this comfy_memx installation is incomplete (reinstall it from a complete "
                     f"checkout or its wheel: `python -m pip install --no-deps --force-reinstall path/to/comfy_memx`; "
                     "a node pack in custom_nodes/: clone or unzip the repository again; in a checkout, the patch "
                     "modules live in patches/ next to comfy_memx/)")
