"""Wraps ComfyUI's model management (``comfy.model_management``) to keep the ownership ledger.

Sites: ``load_models_gpu`` (notices the silent clone-replacement pop that bypasses ``model_unload``),
``LoadedModel.model_load`` (bytes moved, seconds, owner), ``LoadedModel.model_unload`` (bytes freed, partial or
full, refcounts), ``free_memory`` / ``unload_all_models`` / ``unload_model_and_clones`` (the unload reason) and
``cleanup_models_gc`` (leak reports, see ``comfy_memx.leaks.watch``).  Checked against ComfyUI 0.3.64 (3-parameter
``free_memory``, no ``unload_model_and_clones``) and 0.27.0 (6 parameters); every call site in ComfyUI goes through
the module attribute, so a module ``setattr`` also catches calls made inside the module.
# COMFY: ``cast_to`` is deliberately not wrapped: hook_breaker_ac10a0 restores it after custom nodes load.
Settings: ``COMFY_MEMX_LEAK_MODE`` (off disables the cleanup_models_gc work), ``COMFY_MEMX_DISABLE=model_management``.
"""

import sys
from time import perf_counter

from comfy_memx.core import registry
from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.core.state import STATE
from comfy_memx.leaks import watch as leakwatch
from comfy_memx.ledger import accounting
from comfy_memx.pins import api as pins
from comfy_memx.sharing import handoff


def _memx_load_models_gpu(mm, original, switch):
    load_stack, load_call, load_scopes, load_scope = (accounting.load_stack, accounting.LoadCall,
                                                      accounting.load_scopes, accounting.LoadScope)
    announced = []  # the startup line is logged at the first load at the latest (announce() itself runs once)

    def load_models_gpu(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        if not announced:
            announced.append(True)
            registry.announce()
        before = accounting.loaded_entry_refs(mm) if mm.current_loaded_models else None
        # ComfyUI's own list object goes to the load scope; no local of ours holds it (nor the models)
        scope = load_scope(args[0] if args else kwargs.get("models", ()), sys._getframe(1))
        scopes = load_scopes()
        scopes.append(scope)
        if STATE.config.handoff == "host":
            try:
                handoff.before_load(mm, scope.models)
            except Exception as exc:
                internal_error("GPU hand-off", exc)
        loads = load_stack() if STATE.publish_loads else None
        if loads is not None:
            loads.append(load_call(scope.models))
        try:
            return original(*args, **kwargs)
        finally:
            if before:
                try:
                    _note_clone_replacements(mm, before, scope)
                except Exception as exc:
                    internal_error("clone-replacement accounting", exc)
            scopes.pop()
            if loads is not None:
                loads.pop()
    return load_models_gpu


def _note_clone_replacements(mm, before, scope):
    # COMFY: load_models_gpu pops entries whose patcher is a clone of a model being loaded and detaches them
    # without model_unload (0.3.64, 0.27.0, 0.33.0); such an entry left the list (and may already be gone) while its
    # module lives on, often under a new entry for the clone.  Full unloads during the call are in ``unloaded``.
    remaining = {id(entry) for entry in mm.current_loaded_models}
    for entry_ref, module_ref in before:
        entry = entry_ref() if entry_ref is not None else None
        if entry is not None:
            if id(entry) in remaining or entry.real_model is None:
                continue
        elif entry_ref is None or scope.unloaded is not None and id(module_ref) in scope.unloaded:
            continue
        module = module_ref()
        if module is None:
            continue
        patcher = entry.model if entry is not None else None
        del entry
        refcounts = {"patcher": accounting.external_refcount(sys.getrefcount(patcher)) if patcher is not None else 0,
                     "module": accounting.external_refcount(sys.getrefcount(module))}
        loaded = patcher.loaded_size() if patcher is not None else int(getattr(module, "model_loaded_weight_memory", 0))
        accounting.note_unloaded(module_ref)
        accounting.on_unload(patcher, module, loaded, loaded, True, 0.0, refcounts, scope.frame,
                             reason="clone_replaced")
        del module, patcher


def _memx_model_load(mm, original, switch):
    def model_load(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        try:
            before = _loaded_size(self)
        except Exception as exc:
            internal_error("load accounting", exc)
            before = 0
        start = perf_counter()
        result = original(self, *args, **kwargs)
        seconds = perf_counter() - start
        try:
            accounting.on_load(self, self.model, before, seconds, sys._getframe(1))
        except Exception as exc:
            internal_error("load accounting", exc)
        return result
    return model_load


def _loaded_size(entry):
    """Bytes of ``entry``'s model on its device, read without keeping its patcher in a local variable."""
    patcher = entry.model
    return patcher.loaded_size() if patcher is not None else 0


def _memx_model_unload(mm, original, switch):
    def model_unload(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        module_ref = self.real_model
        try:
            before = _loaded_size(self)
        except Exception as exc:
            internal_error("unload accounting", exc)
            before = 0
        start = perf_counter()
        result = original(self, *args, **kwargs)
        seconds = perf_counter() - start
        try:
            _note_unload(self, module_ref, before, result is not False, seconds, sys._getframe(1))
            if STATE.publish_loads:   # a pin budget runs: an unload may have released pins behind its back
                pins.settle()
        except Exception as exc:
            internal_error("unload accounting", exc)
        return result
    return model_unload


def _note_unload(entry, module_ref, before, fully, seconds, caller_frame):
    module = module_ref() if module_ref is not None else None
    if module is None:
        return
    if fully:
        accounting.note_unloaded(module_ref)
    patcher = entry.model
    after = patcher.loaded_size() if patcher is not None else 0
    refcounts = {"patcher": accounting.external_refcount(sys.getrefcount(patcher)) if patcher is not None else 0,
                 "module": accounting.external_refcount(sys.getrefcount(module))}
    accounting.on_unload(patcher, module, before, after, fully, seconds, refcounts, caller_frame)


def _scoped_reason(reason, original, switch):
    """A wrapper whose unloads have ``reason`` unless an enclosing scope already chose one (hot path: inlined)."""
    reason_stack = accounting.reason_stack

    def wrapper(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        stack = reason_stack()
        stack.append(stack[-1] if stack else (reason, sys._getframe(1)))
        try:
            return original(*args, **kwargs)
        finally:
            stack.pop()
    return wrapper


def _memx_free_memory(mm, original, switch):
    return _scoped_reason("memory_pressure", original, switch)


def _oom_test(mm):
    if hasattr(mm, "is_oom"):
        return mm.is_oom
    oom_type = getattr(mm, "OOM_EXCEPTION", None)
    return (lambda exc: isinstance(exc, oom_type)) if isinstance(oom_type, type) else None


def _memx_unload_all_models(mm, original, switch):
    oom_test = _oom_test(mm)

    def unload_all_models(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        caller = sys._getframe(1)
        try:
            reason = accounting.reason_for_unload_all(caller, oom_test)
        except Exception as exc:
            internal_error("unload reason", exc)
            reason = "unload_all"
        accounting.push_reason(reason, frame=caller)
        del caller
        try:
            return original(*args, **kwargs)
        finally:
            accounting.pop_reason()
    return unload_all_models


def _memx_unload_model_and_clones(mm, original, switch):
    return _scoped_reason("other", original, switch)


def _memx_cleanup_models_gc(mm, original, switch):
    def cleanup_models_gc(*args, **kwargs):
        if not switch.on or not mm.current_loaded_models or STATE.config.leak_mode == "off":
            return original(*args, **kwargs)
        try:
            found = leakwatch.suspects(mm)
            if found:
                leakwatch.before_collect(found)
        except Exception as exc:
            internal_error("leak detection", exc)
            found = []
        if not found:
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        try:
            leakwatch.after_collect(found)
        except Exception as exc:
            internal_error("leak report", exc)
        return result
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
        """Late activation: put the models ComfyUI already holds into the ledger (owner unknown)."""
        for entry in list(getattr(module, "current_loaded_models", ())):
            patcher = entry.model
            module_obj = entry.real_model() if entry.real_model is not None else None
            if patcher is None or module_obj is None:
                continue
            record = STATE.ledger.record_for(module_obj)
            record.add_patcher(patcher)
            record.patcher_id = id(patcher)
            record.device = str(getattr(entry, "device", None))
            record.loaded_bytes = patcher.loaded_size()
            record.touch()
            del module_obj


PATCH = ModelManagementPatch()
