"""Stand-in for ``comfy_execution/utils.py``: which prompt/node is executing, as a ContextVar: the shared stand-in source (comfy_memx/cli/demo_world/base/comfy_execution/utils.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy_execution/utils")
