"""Wraps ComfyUI's model management (``comfy.model_management``) to keep the ownership ledger.

Sites: ``load_models_gpu`` (notices the silent clone-replacement pop that bypasses ``model_unload``),
``LoadedModel.model_load`` (bytes moved, seconds, owner), ``LoadedModel.model_unload`` (bytes freed, partial or
full, refcounts), ``free_memory`` / ``unload_all_models`` / ``unload_model_and_clones`` (the unload reason) and
``cleanup_models_gc`` (leak reports, see ``comfy_memx.leaks.watch``).  Checked against ComfyUI 0.3.64 (3-parameter
``free_memory``, no ``unload_model_and_clones``) and 0.27.0 (6 parameters); every call site in ComfyUI goes through
the module attribute, so a module ``setattr`` also catches calls made inside the module.
# COMFY: ``cast_to`` is deliberately not wrapped: hook_breaker_ac10a0 restores it after custom nodes load.
Pairs run (``comfy_memx.core.signals``, each a before and an after half around ComfyUI's call): ``load``,
``model_load``, ``model_unload``, ``unload_scope``, ``collect``; signal fired: ``model_management_patched``; the
ledger, leaks, pins and sharing wings subscribe to them (their ``subscriptions.py``).
Settings: ``COMFY_MEMX_LEAK_MODE`` (off disables the cleanup_models_gc work), ``COMFY_MEMX_DISABLE=model_management``.
"""

import sys
from time import perf_counter

from comfy_memx.core import signals
from comfy_memx.core.patching import Patch


def _memx_load_models_gpu(mm, original, switch):
    load = signals.load
    getframe = sys._getframe

    def load_models_gpu(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        # ComfyUI's own list object goes to the subscribers; the pair keeps its models by weakref only
        models = args[0] if args else kwargs.get("models", ())
        call = load.before(mm, models, getframe(1))
        try:
            return original(*args, **kwargs)
        finally:
            load.after(call, mm, models)
            del call, models   # gone now, even when ComfyUI's exception keeps this frame in a traceback
    return load.runs_in(load_models_gpu)


def _memx_model_load(mm, original, switch):
    pair = signals.model_load
    getframe = sys._getframe

    def model_load(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        call = pair.before(self)
        start = perf_counter()
        result = original(self, *args, **kwargs)
        pair.after(call, self, perf_counter() - start, getframe(1))
        return result
    return model_load


def _memx_model_unload(mm, original, switch):
    pair = signals.model_unload
    getframe = sys._getframe

    def model_unload(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        call = pair.before(self)
        if call is None:   # no subscriber has anything to do after this unload
            return original(self, *args, **kwargs)
        start = perf_counter()
        result = original(self, *args, **kwargs)
        pair.after(call, self, result, perf_counter() - start, getframe(1))
        return result
    return model_unload


def _unload_scope(mm, original, switch, site):
    """A wrapper of ``site`` whose call is one unload scope: its subscribers choose the reason and note who asked."""
    scope = signals.unload_scope
    getframe = sys._getframe

    def wrapper(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        call = scope.before(mm, site, getframe(1))
        try:
            return original(*args, **kwargs)
        finally:
            scope.after(call, mm, site)
    return scope.runs_in(wrapper)


def _memx_free_memory(mm, original, switch):
    return _unload_scope(mm, original, switch, "free_memory")


def _memx_unload_all_models(mm, original, switch):
    return _unload_scope(mm, original, switch, "unload_all_models")


def _memx_unload_model_and_clones(mm, original, switch):
    return _unload_scope(mm, original, switch, "unload_model_and_clones")


def _memx_cleanup_models_gc(mm, original, switch):
    collect = signals.collect

    def cleanup_models_gc(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        call = collect.before(mm)
        try:
            return original(*args, **kwargs)
        finally:
            collect.after(call, mm)
    return cleanup_models_gc


class ModelManagementPatch(Patch):
    """The ledger's sites in ``comfy.model_management``."""

    name = "model_management"
    target = "comfy.model_management"
    sites = {
        "load_models_gpu": _memx_load_models_gpu,
        "LoadedModel.model_load": _memx_model_load,
        "LoadedModel.model_unload": _memx_model_unload,
        "free_memory": _memx_free_memory,
        "unload_all_models": _memx_unload_all_models,
        "unload_model_and_clones": _memx_unload_model_and_clones,
        "cleanup_models_gc": _memx_cleanup_models_gc,
    }

    def adopt(self, module):
        """Late activation: the models ComfyUI already holds are taken in (owner unknown)."""
        signals.model_management_patched.fire(module)


PATCH = ModelManagementPatch()
