"""Stand-in for ``comfy_execution/utils.py``: which prompt/node is executing, as a ContextVar."""
import contextvars
from typing import NamedTuple, Optional


class ExecutionContext(NamedTuple):
    """The node being executed: prompt id, node id and list index (None when the node has no inputs)."""
    prompt_id: str
    node_id: str
    list_index: Optional[int]


current_executing_context = contextvars.ContextVar("current_executing_context", default=None)


def get_executing_context():
    """Return the ExecutionContext of the node running in this thread/task, or None outside a node."""
    return current_executing_context.get(None)


class CurrentNodeContext:
    """Context manager that marks ``node_id`` of ``prompt_id`` as executing for the code inside it."""

    def __init__(self, prompt_id, node_id, list_index=None):
        self.context = ExecutionContext(prompt_id, node_id, list_index)
        self._reset_token = None

    def __enter__(self):
        self._reset_token = current_executing_context.set(self.context)
        return self

    def __exit__(self, *exc_info):
        current_executing_context.reset(self._reset_token)
