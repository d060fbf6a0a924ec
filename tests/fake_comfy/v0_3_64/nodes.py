"""Stand-in for ComfyUI's ``nodes.py``: a few core nodes for simulated models and the custom-node loader: the shared stand-in source (comfy_memx/cli/demo_world/base/nodes.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/nodes")
