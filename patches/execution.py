"""Wraps ``execution.PromptExecutor.execute_async`` so loads can be attributed to a prompt's node class_type.

ComfyUI already publishes the executing (prompt_id, node_id) in ``comfy_execution.utils``; the node's class_type
lives only in the prompt, which this wrapper hands to ``comfy_memx.ledger.attribution`` for the prompt's duration.
Checked against ComfyUI 0.3.64 and 0.27.0 (both ``async def execute_async(self, prompt, prompt_id, extra_data={},
execute_outputs=[])``); a synchronous variant is wrapped synchronously.
"""

import inspect

from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.ledger import attribution


def _prompt_arguments(args, kwargs):
    prompt = args[0] if args else kwargs.get("prompt")
    prompt_id = args[1] if len(args) > 1 else kwargs.get("prompt_id")
    return prompt, prompt_id


def _begin(args, kwargs):
    try:
        prompt, prompt_id = _prompt_arguments(args, kwargs)
        attribution.begin_prompt(prompt_id, prompt)
    except Exception as exc:
        internal_error("prompt attribution", exc)


def _memx_execute_async(module, original, switch):
    if inspect.iscoroutinefunction(original):
        async def execute_async(self, *args, **kwargs):
            if not switch.on:
                return await original(self, *args, **kwargs)
            _begin(args, kwargs)
            try:
                return await original(self, *args, **kwargs)
            finally:
                attribution.end_prompt()
        return execute_async

    def execute_async_sync(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        _begin(args, kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            attribution.end_prompt()
    return execute_async_sync


class ExecutionPatch(Patch):
    """Prompt attribution in ComfyUI's ``execution`` module."""

    name = "execution"
    target = "execution"
    sites = {"PromptExecutor.execute_async": _memx_execute_async}


PATCH = ExecutionPatch()
