"""Stand-in for ``comfy/options.py``: main.py flips ``args_parsing`` on before anything imports cli_args: the shared stand-in source (comfy_memx/cli/demo_world/base/comfy/options.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy/options")
