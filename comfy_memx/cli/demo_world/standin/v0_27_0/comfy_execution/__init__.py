"""Test stand-in for ComfyUI's ``comfy_execution`` package: the shared stand-in source (comfy_memx/cli/demo_world/base/comfy_execution/__init__.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy_execution/__init__")
