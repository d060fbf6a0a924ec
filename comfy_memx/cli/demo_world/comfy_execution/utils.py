"""Which prompt and node are executing: the context that ComfyUI publishes and comfy_memx reads."""

import contextvars
from typing import NamedTuple


class ExecutionContext(NamedTuple):
    """The prompt and node running now."""
    prompt_id: str
    node_id: str


current_executing_context = contextvars.ContextVar("current_executing_context", default=None)


def get_executing_context():
    """The :class:`ExecutionContext` of the node running now, or None."""
    return current_executing_context.get()
