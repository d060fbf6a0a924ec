"""The demo's world (the ComfyUI 0.27.0 stand-in), ``execution.py``: its source is
comfy_memx/cli/demo_world/standin/v0_27_0/execution.py."""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "v0_27_0/execution")


class DemoPromptExecutor(PromptExecutor):  # noqa: F821  (defined by the part above)
    """The stand-in's executor with no server to send messages to (the demo runs prompts directly)."""

    def __init__(self, server=None, cache_type=False, cache_args=None):
        super().__init__(server, cache_type=cache_type, cache_args=cache_args)


PromptExecutor = DemoPromptExecutor
