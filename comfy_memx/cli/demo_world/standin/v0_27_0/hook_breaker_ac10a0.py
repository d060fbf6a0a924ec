"""Stand-in for ``hook_breaker_ac10a0.py``: main.py saves ``cast_to`` before custom nodes load and puts it back: the shared stand-in source (comfy_memx/cli/demo_world/base/hook_breaker_ac10a0.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/hook_breaker_ac10a0")
