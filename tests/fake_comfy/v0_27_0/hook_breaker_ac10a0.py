"""ComfyUI 0.27.0 stand-in, ``hook_breaker_ac10a0.py``: its source is
comfy_memx/cli/demo_world/standin/v0_27_0/hook_breaker_ac10a0.py."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "v0_27_0/hook_breaker_ac10a0")
