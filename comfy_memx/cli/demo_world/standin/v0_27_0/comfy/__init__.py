"""Test stand-in for the ``comfy`` package of a ComfyUI tree (see tests/fake_comfy/README.md): the shared stand-in source (comfy_memx/cli/demo_world/base/comfy/__init__.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy/__init__")
