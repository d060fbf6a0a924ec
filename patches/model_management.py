"""Wraps ComfyUI's model management (``comfy.model_management``) to keep the ownership ledger.

Sites: ``load_models_gpu`` (notices the silent clone-replacement pop that bypasses ``model_unload``),
``LoadedModel.model_load`` (bytes moved, seconds, owner), ``LoadedModel.model_unload`` (bytes freed, partial or
full, refcounts), ``free_memory`` / ``unload_all_models`` / ``unload_model_and_clones`` (the unload reason) and
``cleanup_models_gc`` (leak reports, see ``comfy_memx.leaks.watch``).  Checked against ComfyUI 0.3.64 (3-parameter
``free_memory``, no ``unload_model_and_clones``) and 0.27.0 (6 parameters); every call site in ComfyUI goes through
the module attribute, so a module ``setattr`` also catches calls made inside the module.
# COMFY: ``cast_to`` is deliberately not wrapped: hook_breaker_ac10a0 restores it after custom nodes load.
Fronts called: ``comfy_memx.ledger.api``, ``comfy_memx.leaks.api``, ``comfy_memx.pins.api`` (an unload settles the
pin budget), ``comfy_memx.sharing.api`` (a load short of room asks idle peers first).
Settings: ``COMFY_MEMX_LEAK_MODE`` (off disables the cleanup_models_gc work), ``COMFY_MEMX_DISABLE=model_management``.
"""

import functools
import sys
from time import perf_counter

from comfy_memx.core import registry
from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.core.state import STATE
from comfy_memx.leaks import api as leaks
from comfy_memx.ledger import api as ledger
from comfy_memx.pins import api as pins
from comfy_memx.sharing import api as sharing


def _memx_load_models_gpu(mm, original, switch):
    announced = []  # the startup line is logged at the first load at the latest (announce() itself runs once)

    def load_models_gpu(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        if not announced:
            announced.append(True)
            registry.announce()
        # ComfyUI's own list object goes to the load call; no local of ours holds it (nor the models)
        call = ledger.begin_load(mm, args[0] if args else kwargs.get("models", ()), sys._getframe(1))
        try:
            sharing.before_load(mm, call.models)
        except Exception as exc:
            internal_error("GPU hand-off", exc)
        try:
            return original(*args, **kwargs)
        finally:
            try:
                ledger.end_load(mm, call)
            except Exception as exc:
                internal_error("clone-replacement accounting", exc)
    return load_models_gpu


def _bytes_before(entry, kind):
    """ComfyUI's ``entry`` bytes on its device before its call (0 when reading them fails: our bug, logged)."""
    try:
        return ledger.loaded_size(entry)
    except Exception as exc:
        internal_error(kind, exc)
        return 0


def _memx_model_load(mm, original, switch):
    def model_load(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        before = _bytes_before(self, "load accounting")
        start = perf_counter()
        result = original(self, *args, **kwargs)
        seconds = perf_counter() - start
        try:
            ledger.note_model_load(self, before, seconds, sys._getframe(1))
        except Exception as exc:
            internal_error("load accounting", exc)
        return result
    return model_load


def _memx_model_unload(mm, original, switch):
    def model_unload(self, *args, **kwargs):
        if not switch.on:
            return original(self, *args, **kwargs)
        module_ref = self.real_model
        before = _bytes_before(self, "unload accounting")
        start = perf_counter()
        result = original(self, *args, **kwargs)
        seconds = perf_counter() - start
        try:
            ledger.note_model_unload(self, module_ref, before, result is not False, seconds, sys._getframe(1))
            if STATE.pin_budget_running:   # an unload may have released pins behind the budget's back
                pins.settle()
        except Exception as exc:
            internal_error("unload accounting", exc)
        return result
    return model_unload


def _unload_scope(original, switch, begin):
    """A wrapper whose call is one unload scope, entered by ``begin(caller_frame)`` (its reason, who asked)."""
    def wrapper(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        begin(sys._getframe(1))
        try:
            return original(*args, **kwargs)
        finally:
            ledger.end_unload_scope()
    return wrapper


def _memx_free_memory(mm, original, switch):
    """Unloads for ``memory_pressure`` unless an enclosing scope already chose a reason."""
    return _unload_scope(original, switch, functools.partial(ledger.begin_unload_scope, "memory_pressure"))


def _oom_test(mm):
    if hasattr(mm, "is_oom"):
        return mm.is_oom
    oom_type = getattr(mm, "OOM_EXCEPTION", None)
    return (lambda exc: isinstance(exc, oom_type)) if isinstance(oom_type, type) else None


def _memx_unload_all_models(mm, original, switch):
    """Unloads for ``oom``, ``free_request`` (ComfyUI's worker) or ``unload_all``."""
    oom_test = _oom_test(mm)
    return _unload_scope(original, switch, lambda caller_frame: ledger.begin_unload_all(caller_frame, oom_test))


def _memx_unload_model_and_clones(mm, original, switch):
    """Unloads for ``other`` unless an enclosing scope already chose a reason."""
    return _unload_scope(original, switch, functools.partial(ledger.begin_unload_scope, "other"))


def _memx_cleanup_models_gc(mm, original, switch):
    def cleanup_models_gc(*args, **kwargs):
        if not switch.on or not mm.current_loaded_models or STATE.config.leak_mode == "off":
            return original(*args, **kwargs)
        try:
            found = leaks.suspects(mm)
            if found:
                leaks.before_collect(found)
        except Exception as exc:
            internal_error("leak detection", exc)
            found = []
        if not found:
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        try:
            leaks.after_collect(found)
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
        ledger.adopt_loaded(module)


PATCH = ModelManagementPatch()
