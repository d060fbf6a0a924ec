"""Which ComfyUI version a stand-in run imitates, and how that version's differences join the shared modules.

The stand-in is one base, this folder (every module, and the part of each that all versions share), and a version
layer per ComfyUI version.  A version is a folder put first on ``sys.path``, before this base: its own
``comfyui_version.py`` (which also tells this module which folder that is), its ``main.py`` and its
``version_layer/`` folder.  For ComfyUI 0.27.0 that folder is this base itself; the 0.3.64 one is
``tests/fake_comfy/v0_3_64``.

A base module whose versions differ calls :func:`apply_layer` where the version's part belongs (usually at its
end): it runs ``version_layer/<the module's path>`` in the module's own namespace, so what the version defines is
the module's, as if written into its file at that point.  A version without such a file has no part there.  A
``comfy`` module that only one version has is a plain module in that version's ``version_layer/comfy`` (the
``comfy`` package lists that folder in its ``__path__``).  Standard library only: the modules that call this run
before torch is imported.
"""
import os

import comfyui_version

ROOT = os.path.dirname(os.path.abspath(comfyui_version.__file__))   # the version's folder
LAYER = os.path.join(ROOT, "version_layer")


def layer_file(module_name):
    """The path of the version's part of the module named ``module_name`` (``__main__`` is main.py)."""
    name = "main" if module_name == "__main__" else module_name
    return os.path.join(LAYER, *name.split(".")) + ".py"


def apply_layer(namespace):
    """Run the version's part of the module whose globals are ``namespace`` in them; nothing when it has none.

    The module keeps its own docstring: the part's docstring describes the file, not the module."""
    path = layer_file(namespace["__name__"])
    if not os.path.isfile(path):
        return
    with open(path, encoding="utf-8") as handle:
        code = compile(handle.read(), path, "exec")
    docstring = namespace.get("__doc__")
    exec(code, namespace)
    namespace["__doc__"] = docstring
