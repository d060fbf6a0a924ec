"""main.py of the ComfyUI 0.3.64 stand-in: the base stand-in's main.py, run with this folder's version layer.

This folder is ComfyUI 0.3.64's version of the stand-in (tests/fake_comfy/README.md): its ``comfyui_version.py``
and ``version_layer/`` (what 0.3.64 does differently); every other module is the base's, the stand-in that ships in
comfy_memx (``comfy_memx/cli/demo_world``, of the comfy_memx this interpreter imports), which goes on ``sys.path``
right after this folder.  The base's main.py then runs in this module's namespace, so that run as a script or
imported as ``main`` this is ComfyUI 0.3.64's main module.
Run: ``python tests/fake_comfy/v0_3_64/main.py --cpu --quick-test-for-ci``.
"""
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_BASE = os.path.join(importlib.util.find_spec("comfy_memx").submodule_search_locations[0], "cli", "demo_world")
sys.path[:] = [_HERE, _BASE] + [entry for entry in sys.path if os.path.abspath(entry or os.curdir) not in (_HERE, _BASE)]

with open(os.path.join(_BASE, "main.py"), encoding="utf-8") as _base_main:
    exec(compile(_base_main.read(), _base_main.name, "exec"))
