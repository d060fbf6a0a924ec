"""Wraps ComfyUI's ``execution`` module: prompt attribution, and the prompt worker's handling of free flags.

Sites:

* ``PromptExecutor.execute_async``: ComfyUI already publishes the executing (prompt_id, node_id) in
  ``comfy_execution.utils``; the node's class_type lives only in the prompt, which this wrapper hands to
  ``comfy_memx.ledger.attribution`` for the prompt's duration (``async def execute_async(self, prompt, prompt_id,
  extra_data={}, execute_outputs=[])`` in 0.3.64, 0.27.0 and 0.33.0; a synchronous variant is wrapped
  synchronously);
* ``get_output_data`` (one node's run, 0.3.64, 0.27.0 and 0.33.0): entries that the node removed from
  ``current_loaded_models`` behind ComfyUI's back (no unload reported) become unloads of reason ``dropped``
  asked for by that node (the ledger's ``node_ended``); costs a weakref snapshot of the few loaded
  entries per node, nothing when none is loaded;
* ``PromptQueue.set_flag`` / ``PromptQueue.get_flags`` and ``PromptExecutor.reset``: follow a ``/memx/free`` request
  to the worker run that reads its flags and through that run's cache reset (the surface's free-request desk).
  With no request waiting their subscribers only check one attribute.  # COMFY: ``PromptQueue.mutex`` is an ``RLock`` that
  ``set_flag`` and ``get_flags`` take (0.3.64, 0.27.0, 0.33.0); the ``get_flags`` wrapper holds it around the call.
  Before it takes that mutex, ``flags_reading`` marks the worker's point between prompts, where the leak wing runs
  the queued releases (``leaks.release.desk``; nothing queued: one attribute read).  # COMFY: the worker calls
  ``get_flags`` after every prompt and whenever ``q.get`` returns without one (woken, or its timeout).

Signals fired (``comfy_memx.core.signals``): ``prompt_started``/``prompt_ended``, ``node_starting``/``node_ended``,
``free_flag_set``, ``flags_reading``, ``flags_served``, ``cache_reset``; core (the replaced-wrapper audit), the
ledger (prompts, nodes, who set a free flag), the leak wing (the release desk), sharing (activity, for the idle
unload) and the surface (the free-request desk) subscribe.
Settings: ``COMFY_MEMX_DISABLE=execution`` (no class_type in owners; ``/memx/free`` cannot follow the worker).
"""

import inspect
import sys

from comfy_memx.core import signals
from comfy_memx.core.patching import Patch


def _prompt_arguments(args, kwargs):
    prompt = args[0] if args else kwargs.get("prompt")
    prompt_id = args[1] if len(args) > 1 else kwargs.get("prompt_id")
    return prompt_id, prompt


def _memx_execute_async(module, original, switch):
    if inspect.iscoroutinefunction(original):
        async def execute_async(self, *args, **kwargs):
            if not switch.on:
                return await original(self, *args, **kwargs)
            signals.prompt_started.fire(*_prompt_arguments(args, kwargs))
            try:
                return await original(self, *args, **kwargs)
            finally:
                signals.prompt_ended.fire()
        return execute_async

    def execute_async_sync(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        signals.prompt_started.fire(*_prompt_arguments(args, kwargs))
        try:
            return original(self, *args, **kwargs)
        finally:
            signals.prompt_ended.fire()
    return execute_async_sync


def _node_arguments(args, kwargs):
    """``(prompt_id, node_id, node)`` of a ``get_output_data(prompt_id, unique_id, obj, ...)`` call."""
    prompt_id = args[0] if args else kwargs.get("prompt_id")
    node_id = args[1] if len(args) > 1 else kwargs.get("unique_id")
    node = args[2] if len(args) > 2 else kwargs.get("obj")
    return prompt_id, node_id, node


def _memx_get_output_data(module, original, switch):
    if inspect.iscoroutinefunction(original):
        async def get_output_data(*args, **kwargs):
            if not switch.on:
                return await original(*args, **kwargs)
            signals.node_starting.fire(*_node_arguments(args, kwargs))
            try:
                return await original(*args, **kwargs)
            finally:
                signals.node_ended.fire(*_node_arguments(args, kwargs))
        return get_output_data

    def get_output_data_sync(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        signals.node_starting.fire(*_node_arguments(args, kwargs))
        try:
            return original(*args, **kwargs)
        finally:
            signals.node_ended.fire(*_node_arguments(args, kwargs))
    return get_output_data_sync


def _memx_set_flag(module, original, switch):
    def set_flag(self, *args, **kwargs):
        if switch.on:
            signals.free_flag_set.fire(self, args[0] if args else kwargs.get("name"), sys._getframe(1))
        return original(self, *args, **kwargs)
    return set_flag


def _memx_get_flags(module, original, switch):
    def get_flags(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        signals.flags_reading.fire(self, args[0] if args else kwargs.get("reset", True))
        mutex = getattr(self, "mutex", None)
        if mutex is None:
            flags = original(self, *args, **kwargs)
            signals.flags_served.fire(self, flags, args[0] if args else kwargs.get("reset", True))
            return flags
        with mutex:   # the subscribers see the flags at the moment they were read: no set_flag slips between
            flags = original(self, *args, **kwargs)
            signals.flags_served.fire(self, flags, args[0] if args else kwargs.get("reset", True))
        return flags
    return get_flags


def _memx_reset(module, original, switch):
    def reset(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if switch.on:
            signals.cache_reset.fire(self)
        return result
    return reset


class ExecutionPatch(Patch):
    """Prompt attribution and free-flag tracking in ComfyUI's ``execution`` module."""

    name = "execution"
    target = "execution"
    sites = {
        "PromptExecutor.execute_async": _memx_execute_async,
        "PromptExecutor.reset": _memx_reset,
        "get_output_data": _memx_get_output_data,
        "PromptQueue.set_flag": _memx_set_flag,
        "PromptQueue.get_flags": _memx_get_flags,
    }


PATCH = ExecutionPatch()
