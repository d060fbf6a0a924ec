"""The demo's world (the ComfyUI 0.27.0 stand-in), ``nodes.py``: its source is
comfy_memx/cli/demo_world/standin/v0_27_0/nodes.py."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "v0_27_0/nodes")

import asyncio  # noqa: E402

_load_custom_node_async = load_custom_node  # noqa: F821  (defined by the part above)


def load_custom_node(module_path, ignore=set(), module_parent="custom_nodes"):
    """The demo loads its pack outside any event loop: the stand-in's loader coroutine, run to completion."""
    return asyncio.run(_load_custom_node_async(module_path, ignore, module_parent))


class DemoModelLoader(SimModelLoader):  # noqa: F821
    """``SimModelLoader`` under the demo prompt's input names (``tensors``, ``numel``)."""

    def load(self, tensors=8, numel=1024):
        return super().load(tensor_count=tensors, tensor_numel=numel)


NODE_CLASS_MAPPINGS["SimModelLoader"] = DemoModelLoader  # noqa: F821
