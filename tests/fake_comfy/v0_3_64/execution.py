"""Stand-in for ComfyUI 0.3.64 ``execution.py``: PromptExecutor, PromptQueue and the output caches.

A prompt is ``{node_id: {"class_type": ..., "inputs": {...}}}`` with links ``[node_id, output_index]``.  Nodes
run in dependency order, each inside ``CurrentNodeContext``; outputs are cached across prompts by input
signature (so a loader's ModelPatcher stays alive as in ComfyUI).  Memory calls match the real executor:
``cleanup_models_gc()`` once per prompt after cache set-up, ``unload_all_models()`` in the OOM handler
(``isinstance(ex, OOM_EXCEPTION)``) and at the end when DISABLE_SMART_MEMORY.  No validation, subgraphs or UI.
"""
from comfy_memx.cli.demo_world.standin import extend

extend(globals(), "shared/execution")


class CacheType(Enum):
    CLASSIC = 0
    LRU = 1
    DEPENDENCY_AWARE = 2


class OutputCache(_SharedOutputCache):
    """Node outputs keyed by input signature (class and inputs, links resolved recursively).

    CLASSIC drops what the current prompt does not use, LRU keeps the ``lru_size`` most recent and
    DEPENDENCY_AWARE (``--cache-none``) keeps nothing across prompts.
    """

    def clean_unused(self):
        used = set(self.signatures.values())
        if self.cache_type in (CacheType.CLASSIC, CacheType.DEPENDENCY_AWARE):
            self.entries = {k: v for k, v in self.entries.items() if k in used and self.cache_type == CacheType.CLASSIC}
        elif self.cache_type == CacheType.LRU:
            while len(self.entries) > max(self.lru_size, len(used)):
                self.entries.pop(next(k for k in self.entries if k not in used))


class CacheSet:
    """The executor's caches; only ``outputs`` is modelled."""

    def __init__(self, cache_type=None, cache_size=None):
        cache_type = cache_type if isinstance(cache_type, CacheType) else CacheType.CLASSIC
        self.outputs = OutputCache(cache_type, cache_size or 0)
        self.all = [self.outputs]


class PromptExecutor(_SharedPromptExecutor):
    """Runs prompts, keeping node outputs cached between them."""

    def __init__(self, server, cache_type=False, cache_size=None):
        self.cache_size = cache_size
        self.cache_type = cache_type
        self.server = server if server is not None else _SilentServer()
        self.reset()

    def reset(self):
        """Drop every cached output (what ``/free`` with ``free_memory`` triggers)."""
        self.caches = CacheSet(cache_type=self.cache_type, cache_size=self.cache_size)
        self.objects = {}
        self.status_messages = []
        self.success = True

    async def execute_async(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        """Run ``prompt``; ``execute_outputs`` defaults to its OUTPUT_NODE nodes (or all nodes if none)."""
        nodes.interrupt_processing(False)
        self.server.client_id = extra_data.get("client_id")
        self.status_messages = []
        self.add_message("execution_start", {"prompt_id": prompt_id}, broadcast=False)
        with torch.inference_mode():
            self.caches.outputs.set_prompt(prompt)
            self.caches.outputs.clean_unused()
            cached_nodes = [n for n in prompt if self.caches.outputs.get(n) is not None]
            comfy.model_management.cleanup_models_gc()
            self.add_message("execution_cached", {"nodes": cached_nodes, "prompt_id": prompt_id}, broadcast=False)
            targets = list(execute_outputs) or [n for n in prompt if getattr(
                nodes.NODE_CLASS_MAPPINGS[prompt[n]["class_type"]], "OUTPUT_NODE", False)] or list(prompt)
            self.success = True
            for node_id in _dependency_order(prompt, targets):
                if self.caches.outputs.get(node_id) is not None:
                    continue
                if not await self._execute_node(prompt, prompt_id, node_id):
                    break
            else:
                self.add_message("execution_success", {"prompt_id": prompt_id}, broadcast=False)
            if self.cache_type == CacheType.DEPENDENCY_AWARE:
                self.caches.outputs.entries.clear()
            self.history_result = {"outputs": {}, "meta": {}}
            self.server.last_node_id = None
            if comfy.model_management.DISABLE_SMART_MEMORY:
                comfy.model_management.unload_all_models()

    async def _execute_node(self, prompt, prompt_id, node_id):
        class_type = prompt[node_id]["class_type"]
        class_def = nodes.NODE_CLASS_MAPPINGS[class_type]
        try:
            inputs = {name: self.caches.outputs.get(v[0])[v[1]] if _is_link(v) else v
                      for name, v in prompt[node_id]["inputs"].items()}
            obj = self.objects.get((node_id, class_type))
            if obj is None:
                obj = self.objects[(node_id, class_type)] = class_def()
            nodes.before_node_execution()
            result = await get_output_data(prompt_id, node_id, obj, inputs)
            if isinstance(result, dict):
                result = result.get("result", ())
            self.caches.outputs.set(node_id, tuple(result))
            return True
        except comfy.model_management.InterruptProcessingException:
            logging.info("Processing interrupted")
            self.add_message("execution_interrupted", {"prompt_id": prompt_id, "node_id": node_id}, broadcast=True)
        except Exception as ex:
            logging.error(f"!!! Exception during processing !!! {ex}")
            logging.error(traceback.format_exc())
            if isinstance(ex, comfy.model_management.OOM_EXCEPTION):
                logging.error("Got an OOM, unloading all loaded models.")
                comfy.model_management.unload_all_models()
            self.add_message("execution_error", {"prompt_id": prompt_id, "node_id": node_id, "node_type": class_type,
                                                 "exception_message": str(ex), "exception_type": type(ex).__name__},
                             broadcast=False)
        self.success = False
        return False
