"""The demo's world (the ComfyUI 0.27.0 stand-in), ``comfy/pinned_memory.py``: its source is
comfy_memx/cli/demo_world/standin/v0_27_0/comfy/pinned_memory.py."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "v0_27_0/comfy/pinned_memory")
