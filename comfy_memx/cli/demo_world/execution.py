"""Stand-in for ComfyUI's ``execution.py``: PromptExecutor, PromptQueue and the output caches (the cache types,
the executor's signature, the OOM test and the RAM-pressure step come from the version layer, at the end).

A prompt is ``{node_id: {"class_type": ..., "inputs": {...}}}`` with links ``[node_id, output_index]``.  Nodes
run in dependency order, each inside ``CurrentNodeContext``; outputs are cached across prompts by input
signature (so a loader's ModelPatcher stays alive as in ComfyUI).  Memory calls match the real executor:
``cleanup_models_gc()`` once per prompt after cache set-up, ``unload_all_models()`` in the OOM handler and at
the end when DISABLE_SMART_MEMORY, the version's step after each node.  No validation, subgraphs or UI.
"""

import asyncio
import copy
import heapq
import inspect
import logging
import threading
import time
import traceback
from enum import Enum
from typing import List, Literal, NamedTuple
import torch
import comfy.model_management
import nodes
import stand_in_version
from comfy_execution.utils import CurrentNodeContext

MAXIMUM_HISTORY_SIZE = 10000


def _freeze(value):
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def _is_link(value):
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


class _SharedOutputCache:
    """What ``OutputCache`` is in every stand-in version (each version's class adds the rest)."""

    def __init__(self, cache_type, lru_size=0):
        self.cache_type = cache_type
        self.lru_size = lru_size
        self.entries = {}
        self.signatures = {}

    def set_prompt(self, prompt):
        self.signatures = {}
        for node_id in prompt:
            self._signature(prompt, node_id)

    def _signature(self, prompt, node_id):
        if node_id not in self.signatures:
            node = prompt[node_id]
            inputs = tuple(sorted((name, ("link", self._signature(prompt, v[0]), v[1]) if _is_link(v) else _freeze(v))
                                  for name, v in node["inputs"].items()))
            self.signatures[node_id] = (node["class_type"], inputs)
        return self.signatures[node_id]

    def get(self, node_id):
        """Cached outputs of ``node_id`` for the current prompt's inputs, or None."""
        key = self.signatures.get(node_id)
        if key in self.entries:
            self.entries[key] = self.entries.pop(key)  # most recently used last
            return self.entries[key]
        return None

    def set(self, node_id, outputs):
        """Cache the outputs of ``node_id`` under its current input signature."""
        self.entries[self.signatures[node_id]] = outputs

    def clean_unused(self):
        """After a prompt: CLASSIC keeps what the prompt used, the version's UNCACHED type nothing, LRU the
        ``lru_size`` most recent entries (and everything the prompt used)."""
        used = set(self.signatures.values())
        if self.cache_type in (CacheType.CLASSIC, UNCACHED):
            self.entries = {k: v for k, v in self.entries.items() if k in used and self.cache_type == CacheType.CLASSIC}
        elif self.cache_type == CacheType.LRU:
            while len(self.entries) > max(self.lru_size, len(used)):
                self.entries.pop(next(k for k in self.entries if k not in used))


class _SharedCacheSet:
    """What ``CacheSet`` is in every stand-in version: only ``outputs`` is modelled (each version's class reads the
    LRU size from its own options)."""

    def _setup(self, cache_type, lru_size):
        cache_type = cache_type if isinstance(cache_type, CacheType) else CacheType.CLASSIC
        self.outputs = OutputCache(cache_type, lru_size)
        self.all = [self.outputs]


class _SilentServer:
    client_id = None
    last_node_id = None
    last_prompt_id = None

    def send_sync(self, event, data, sid=None):
        pass

    def queue_updated(self):
        pass


def _dependency_order(prompt, targets):
    order, seen = [], set()

    def visit(node_id):
        if node_id in seen:
            return
        seen.add(node_id)
        for value in prompt[node_id]["inputs"].values():
            if _is_link(value):
                visit(value[0])
        order.append(node_id)

    for node_id in targets:
        visit(node_id)
    return order


async def get_output_data(prompt_id, unique_id, obj, input_data_all, execution_block_cb=None, pre_execute_cb=None):
    """Run one node's function (ComfyUI's module-level ``get_output_data``: every node's run goes through it)."""
    function = getattr(obj, type(obj).FUNCTION)
    with CurrentNodeContext(prompt_id, unique_id, 0 if input_data_all else None):
        result = function(**input_data_all)
        if inspect.isawaitable(result):
            result = await result
    return result


class _PromptLinks:
    """The outputs that the nodes of one prompt still to run link to, held from when they are known until the last
    node that reads them has had its turn.  ComfyUI's ExecutionList keeps them so for its pending nodes, which is why
    a RAM-pressure eviction of the output cache in the middle of a prompt never takes a node's inputs away."""

    def __init__(self, prompt, order):
        self.prompt = prompt
        self.held = {}
        self.readers = {}
        for node_id in order:
            for producer in self.producers(node_id):
                self.readers[producer] = self.readers.get(producer, 0) + 1

    def producers(self, node_id):
        """The node ids that ``node_id`` links to, once each."""
        return {v[0] for v in self.prompt[node_id]["inputs"].values() if _is_link(v)}

    def known(self, node_id, outputs):
        """``node_id``'s outputs for this prompt (found in the cache or just produced)."""
        if self.readers.get(node_id):
            self.held[node_id] = outputs

    def inputs(self, node_id):
        """``node_id``'s input values: its links resolved from what this prompt holds."""
        return {name: self.held[v[0]][v[1]] if _is_link(v) else v for name, v in self.prompt[node_id]["inputs"].items()}

    def turn_over(self, node_id):
        """``node_id`` has run (or was cached): let go of the outputs no node still to run reads."""
        for producer in self.producers(node_id):
            self.readers[producer] -= 1
            if not self.readers[producer]:
                self.held.pop(producer, None)


class _SharedPromptExecutor:
    """What ``PromptExecutor`` is in every stand-in version (each version's class adds the rest)."""

    def add_message(self, event, data, broadcast):
        """Record a status message and send it to the client, if any."""
        data = {**data, "timestamp": int(time.time() * 1000)}
        self.status_messages.append((event, data))
        if self.server.client_id is not None or broadcast:
            self.server.send_sync(event, data, self.server.client_id)

    def execute(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        """Synchronous wrapper the prompt worker calls."""
        asyncio.run(self.execute_async(prompt, prompt_id, extra_data, execute_outputs))

    def _start(self, server, cache_type):
        """What every version's ``__init__`` does once it has stored its cache options."""
        self.cache_type = cache_type
        self.server = server if server is not None else _SilentServer()
        self.reset()

    def reset(self):
        """Drop every cached output (what ``/free`` with ``free_memory`` triggers)."""
        self.caches = self._new_caches()
        self.objects = {}
        self.status_messages = []
        self.success = True

    async def execute_async(self, prompt, prompt_id, extra_data={}, execute_outputs=[]):
        """Run ``prompt``; ``execute_outputs`` defaults to its OUTPUT_NODE nodes (or all nodes if none)."""
        nodes.interrupt_processing(False)
        self.server.client_id = extra_data.get("client_id")
        self.status_messages = []
        self.add_message("execution_start", {"prompt_id": prompt_id}, broadcast=False)
        with self._ram_pressure() as after_node:
            with torch.inference_mode():
                self.caches.outputs.set_prompt(prompt)
                self.caches.outputs.clean_unused()
                cached_nodes = [n for n in prompt if self.caches.outputs.get(n) is not None]
                comfy.model_management.cleanup_models_gc()
                self.add_message("execution_cached", {"nodes": cached_nodes, "prompt_id": prompt_id}, broadcast=False)
                targets = list(execute_outputs) or [n for n in prompt if getattr(
                    nodes.NODE_CLASS_MAPPINGS[prompt[n]["class_type"]], "OUTPUT_NODE", False)] or list(prompt)
                self.success = True
                order = _dependency_order(prompt, targets)
                links = _PromptLinks(prompt, order)
                for node_id in order:
                    cached = self.caches.outputs.get(node_id)
                    if cached is None:
                        if not await self._execute_node(prompt, prompt_id, node_id, links):
                            break
                        after_node()
                    else:
                        links.known(node_id, cached)
                    links.turn_over(node_id)
                else:
                    self.add_message("execution_success", {"prompt_id": prompt_id}, broadcast=False)
                if self.cache_type == UNCACHED:
                    self.caches.outputs.entries.clear()
                self.history_result = {"outputs": {}, "meta": {}}
                self.server.last_node_id = None
                if comfy.model_management.DISABLE_SMART_MEMORY:
                    comfy.model_management.unload_all_models()

    async def _execute_node(self, prompt, prompt_id, node_id, links):
        class_type = prompt[node_id]["class_type"]
        class_def = nodes.NODE_CLASS_MAPPINGS[class_type]
        try:
            inputs = links.inputs(node_id)
            obj = self.objects.get((node_id, class_type))
            if obj is None:
                obj = self.objects[(node_id, class_type)] = class_def()
            nodes.before_node_execution()
            result = await get_output_data(prompt_id, node_id, obj, inputs)
            if isinstance(result, dict):
                result = result.get("result", ())
            outputs = tuple(result)
            self.caches.outputs.set(node_id, outputs)
            links.known(node_id, outputs)
            return True
        except comfy.model_management.InterruptProcessingException:
            logging.info("Processing interrupted")
            self.add_message("execution_interrupted", {"prompt_id": prompt_id, "node_id": node_id}, broadcast=True)
        except Exception as ex:
            logging.error(f"!!! Exception during processing !!! {ex}")
            logging.error(traceback.format_exc())
            if oom_detected(ex):
                logging.error("Got an OOM, unloading all loaded models.")
                comfy.model_management.unload_all_models()
            self.add_message("execution_error", {"prompt_id": prompt_id, "node_id": node_id, "node_type": class_type,
                                                 "exception_message": str(ex), "exception_type": type(ex).__name__},
                             broadcast=False)
        self.success = False
        return False


class PromptQueue:
    """The prompt queue shared by the server and ``main.prompt_worker``; flags carry ``/free`` requests."""

    class ExecutionStatus(NamedTuple):
        status_str: Literal["success", "error"]
        completed: bool
        messages: List[str]

    def __init__(self, server):
        self.server = server
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.task_counter = 0
        self.queue = []
        self.currently_running = {}
        self.history = {}
        self.flags = {}

    def put(self, item):
        """Queue ``(number, prompt_id, prompt, extra_data, outputs_to_execute, sensitive)``."""
        with self.mutex:
            heapq.heappush(self.queue, item)
            self.server.queue_updated()
            self.not_empty.notify()

    def get(self, timeout=None):
        """Next ``(item, item_id)``, or None if ``timeout`` passes (or a flag is set) with the queue empty."""
        with self.not_empty:
            while len(self.queue) == 0:
                self.not_empty.wait(timeout=timeout)
                if timeout is not None and len(self.queue) == 0:
                    return None
            item = heapq.heappop(self.queue)
            i = self.task_counter
            self.currently_running[i] = copy.deepcopy(item)
            self.task_counter += 1
            self.server.queue_updated()
            return (item, i)

    def task_done(self, item_id, history_result, status, process_item=None):
        """Move a finished prompt from running to history."""
        with self.mutex:
            prompt = self.currently_running.pop(item_id)
            if len(self.history) > MAXIMUM_HISTORY_SIZE:
                self.history.pop(next(iter(self.history)))
            if process_item is not None:
                prompt = process_item(prompt)
            self.history[prompt[1]] = {"prompt": prompt, "outputs": {},
                                       "status": copy.deepcopy(status._asdict()) if status is not None else None}
            self.history[prompt[1]].update(history_result)
            self.server.queue_updated()

    def get_tasks_remaining(self):
        with self.mutex:
            return len(self.queue) + len(self.currently_running)

    def set_flag(self, name, data):
        """Set a flag for the worker and wake it."""
        with self.mutex:
            self.flags[name] = data
            self.not_empty.notify()

    def get_flags(self, reset=True):
        """The pending flags (cleared unless ``reset`` is False)."""
        with self.mutex:
            if reset:
                ret = self.flags
                self.flags = {}
                return ret
            return self.flags.copy()


stand_in_version.apply_layer(globals())
