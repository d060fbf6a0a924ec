"""Makes ``comfy_memx.patches`` importable from a checkout, where the patch modules live in the top-level ``patches/``.

Installed copies (a wheel, ``pip install .``) hold ``comfy_memx/patches/`` itself: setup.py maps the package there,
and an editable install's finder maps it to the checkout's ``patches/``.  A checkout used without installing it (the
repository cloned into ComfyUI's ``custom_nodes/``, or put on ``sys.path`` by the tests) has no such folder, and a
symlink would not survive a zip download or a ``core.symlinks=false`` clone (Git's default on Windows).  So when
``comfy_memx/patches`` is absent and ``../patches/__init__.py`` is there, :func:`link_patches` puts a finder on
``sys.meta_path`` that answers for ``comfy_memx.patches`` alone; ``patches`` never becomes a top-level package.
"""

import os
import sys

PACKAGE = "comfy_memx.patches"


def checkout_patches_dir(package_dir):
    """``package_dir/../patches`` when ``package_dir`` (a comfy_memx folder) lacks ``patches/`` and sits in a
    checkout that has it; else None."""
    if os.path.isdir(os.path.join(package_dir, "patches")):
        return None
    folder = os.path.join(os.path.dirname(package_dir), "patches")
    return folder if os.path.isfile(os.path.join(folder, "__init__.py")) else None


class CheckoutPatchesFinder:
    """Meta-path finder for ``comfy_memx.patches`` in a checkout: the package from ``folder`` (its submodules are
    then found through the package's ``__path__``).  It answers only while ``comfy_memx`` is the copy it was made
    for, so another comfy_memx imported later in the process never gets this checkout's patches."""

    def __init__(self, package_dir, folder):
        self.package_dir = package_dir
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != PACKAGE:
            return None
        parent = sys.modules.get("comfy_memx")
        parent_dirs = [os.path.abspath(p) for p in getattr(parent, "__path__", ())]
        if self.package_dir not in parent_dirs:
            return None
        import importlib.util  # here, not at the top: comfy_memx's own import stays free of it
        return importlib.util.spec_from_file_location(PACKAGE, os.path.join(self.folder, "__init__.py"),
                                                      submodule_search_locations=[self.folder])

    def invalidate_caches(self):
        pass


def link_patches(package_dir):
    """Install the :class:`CheckoutPatchesFinder` for ``package_dir`` when it is a checkout's comfy_memx (once)."""
    package_dir = os.path.abspath(package_dir)
    folder = checkout_patches_dir(package_dir)
    if folder is None:
        return None
    for finder in sys.meta_path:
        if isinstance(finder, CheckoutPatchesFinder) and finder.package_dir == package_dir:
            return finder
    finder = CheckoutPatchesFinder(package_dir, folder)
    sys.meta_path.insert(0, finder)
    return finder
