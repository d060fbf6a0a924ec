"""A custom node that binds ``load_models_gpu`` by name at import time, as some packs do.

Loaded before the comfy_memx node pack, it keeps ComfyUI's unwrapped function: comfy_memx's startup line must name
it as unreachable (tests/real/test_node_pack.py).  It adds no node.
"""

from comfy.model_management import load_models_gpu  # noqa: F401  (held, never called)

NODE_CLASS_MAPPINGS = {}
