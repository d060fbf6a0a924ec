"""The demo world's prompt executor: runs a prompt's nodes in order, caching outputs by their inputs.

As in ComfyUI, a node whose inputs did not change reuses its cached output, and outputs the current prompt does
not use are dropped, which is how a loader's ModelPatcher dies when the prompt changes.
"""

import asyncio

import comfy.model_management
import nodes
from comfy_execution.utils import ExecutionContext, current_executing_context


class PromptExecutor:
    """Executes prompts ``{node_id: {"class_type", "inputs"}}``; inputs ``[node_id, index]`` link to outputs."""

    def __init__(self, server=None):
        self.server = server
        self.outputs = {}  # (class_type, inputs key) -> outputs

    def execute(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        """Run ``prompt`` to completion."""
        asyncio.run(self.execute_async(prompt, prompt_id, extra_data, execute_outputs))

    async def execute_async(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        keys = {node_id: self._key(prompt, node_id) for node_id in prompt}
        self.outputs = {key: value for key, value in self.outputs.items() if key in keys.values()}
        comfy.model_management.cleanup_models_gc()
        results = {}
        for node_id in prompt:  # prompts here list every node after its inputs
            key = keys[node_id]
            if key not in self.outputs:
                node = prompt[node_id]
                inputs = {name: results[value[0]][value[1]] if isinstance(value, list) else value
                          for name, value in node["inputs"].items()}
                instance = nodes.NODE_CLASS_MAPPINGS[node["class_type"]]()
                token = current_executing_context.set(ExecutionContext(prompt_id, node_id))
                try:
                    self.outputs[key] = getattr(instance, instance.FUNCTION)(**inputs)
                finally:
                    current_executing_context.reset(token)
            results[node_id] = self.outputs[key]

    @staticmethod
    def _key(prompt, node_id):
        node = prompt[node_id]
        parts = [node["class_type"]]
        for name, value in sorted(node["inputs"].items()):
            parts.append((name, PromptExecutor._key(prompt, value[0]) if isinstance(value, list) else value))
        return tuple(parts)
