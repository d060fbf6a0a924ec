"""Stand-in for ``comfy/utils.py``: only ``load_torch_file`` (importing this module is what first imports torch): the shared stand-in source (comfy_memx/cli/demo_world/base/comfy/utils.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy/utils")
