"""Stand-in for ``comfy/model_base.py``: ``BaseModel`` is a plain torch module of N equal weight tensors: the shared stand-in source (comfy_memx/cli/demo_world/base/comfy/model_base.py), as it is."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/comfy/model_base")
