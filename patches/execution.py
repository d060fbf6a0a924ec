"""Wraps ComfyUI's ``execution`` module: prompt attribution, and the prompt worker's handling of free flags.

Sites:

* ``PromptExecutor.execute_async``: ComfyUI already publishes the executing (prompt_id, node_id) in
  ``comfy_execution.utils``; the node's class_type lives only in the prompt, which this wrapper hands to
  ``comfy_memx.ledger.attribution`` for the prompt's duration (``async def execute_async(self, prompt, prompt_id,
  extra_data={}, execute_outputs=[])`` in 0.3.64, 0.27.0 and 0.33.0; a synchronous variant is wrapped
  synchronously);
* ``get_output_data`` (one node's run, 0.3.64, 0.27.0 and 0.33.0): entries that the node removed from
  ``current_loaded_models`` behind ComfyUI's back (no unload reported) become unloads of reason ``dropped``
  asked for by that node (``comfy_memx.ledger.api.node_ended``); costs a weakref snapshot of the few loaded
  entries per node, nothing when none is loaded;
* ``PromptQueue.set_flag`` / ``PromptQueue.get_flags`` and ``PromptExecutor.reset``: follow a ``/memx/free`` request
  to the worker run that reads its flags and through that run's cache reset (``comfy_memx.surface.freeing``).
  With no request waiting they only check one attribute.  # COMFY: ``PromptQueue.mutex`` is an ``RLock`` that
  ``set_flag`` and ``get_flags`` take (0.3.64, 0.27.0, 0.33.0); the ``get_flags`` wrapper holds it around the call.

Fronts called: ``comfy_memx.ledger.api`` (prompts, nodes, who set a free flag), ``comfy_memx.sharing.api``
(activity, for the idle unload), ``comfy_memx.surface.api`` (the free-request desk).
Settings: ``COMFY_MEMX_DISABLE=execution`` (no class_type in owners; ``/memx/free`` cannot follow the worker).
"""

import inspect
import sys

from comfy_memx.core import registry
from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.ledger import api as ledger
from comfy_memx.sharing import api as sharing
from comfy_memx.surface import api as surface


def _prompt_arguments(args, kwargs):
    prompt = args[0] if args else kwargs.get("prompt")
    prompt_id = args[1] if len(args) > 1 else kwargs.get("prompt_id")
    return prompt, prompt_id


def _audit_sites():
    try:
        registry.audit()
    except Exception as exc:
        internal_error("replaced-wrapper audit", exc)


def _begin(args, kwargs):
    _audit_sites()
    try:
        prompt, prompt_id = _prompt_arguments(args, kwargs)
        ledger.prompt_started(prompt_id, prompt)
        sharing.prompt_started()
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
                ledger.prompt_ended()
                sharing.prompt_ended()
        return execute_async

    def execute_async_sync(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        _begin(args, kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            ledger.prompt_ended()
            sharing.prompt_ended()
    return execute_async_sync


def _node_arguments(args, kwargs):
    """``(prompt_id, node_id, node)`` of a ``get_output_data(prompt_id, unique_id, obj, ...)`` call."""
    prompt_id = args[0] if args else kwargs.get("prompt_id")
    node_id = args[1] if len(args) > 1 else kwargs.get("unique_id")
    node = args[2] if len(args) > 2 else kwargs.get("obj")
    return prompt_id, node_id, node


def _memx_get_output_data(module, original, switch):
    def watch(args, kwargs):
        mm = sys.modules.get("comfy.model_management")
        try:
            snapshot = ledger.node_starting(mm)
            return (mm, snapshot) if snapshot is not None else None
        except Exception as exc:
            internal_error("dropped-entry tracking", exc)
            return None

    def settle(watched, args, kwargs):
        _audit_sites()   # a node may have replaced one of our sites (ComfyUI-MultiGPU does, from its loaders)
        if watched is None:
            return
        try:
            mm, snapshot = watched
            ledger.node_ended(mm, snapshot, *_node_arguments(args, kwargs))
        except Exception as exc:
            internal_error("dropped-entry tracking", exc)

    if inspect.iscoroutinefunction(original):
        async def get_output_data(*args, **kwargs):
            if not switch.on:
                return await original(*args, **kwargs)
            watched = watch(args, kwargs)
            try:
                return await original(*args, **kwargs)
            finally:
                settle(watched, args, kwargs)
        return get_output_data

    def get_output_data_sync(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        watched = watch(args, kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            settle(watched, args, kwargs)
    return get_output_data_sync


def _memx_set_flag(module, original, switch):
    def set_flag(self, *args, **kwargs):
        if switch.on:
            try:
                name = args[0] if args else kwargs.get("name")
                surface.flag_set(self, name)
                ledger.flag_set(name, sys._getframe(1))
            except Exception as exc:
                internal_error("free flag tracking", exc)
        return original(self, *args, **kwargs)
    return set_flag


def _memx_get_flags(module, original, switch):
    def get_flags(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        flags = surface.read_flags(self, original, args, kwargs)
        try:
            ledger.flags_served(flags)
        except Exception as exc:
            internal_error("free flag tracking", exc)
        return flags
    return get_flags


def _memx_reset(module, original, switch):
    def reset(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if switch.on:
            try:
                surface.reset_ended()
            except Exception as exc:
                internal_error("free request tracking", exc)
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
