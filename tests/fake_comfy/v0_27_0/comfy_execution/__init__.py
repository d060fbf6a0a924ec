"""ComfyUI 0.27.0 stand-in, ``comfy_execution/__init__.py``: its source is
comfy_memx/cli/demo_world/standin/v0_27_0/comfy_execution/__init__.py."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "v0_27_0/comfy_execution/__init__")
