"""Post-import hooks: run a callback right after a named module finishes executing, without importing it early.

comfy_memx must not import ``comfy.*`` (or torch) before ComfyUI's main.py does: ``comfy.cli_args`` parses argv at
its first import and main.py sets CUDA environment variables before torch loads.  So instead of importing the
targets, :func:`when_imported` puts a finder on ``sys.meta_path`` that wraps the real loader of the watched module
and calls the callback after the module body ran (the wrapt ``when_imported`` idea).  If the module is already
imported, the callback runs at once.  A callback that raises is reported and never breaks the import.  The pending
callbacks are a part of the process state (:class:`PendingHooks`), dropped by ``STATE.reset()``.
"""

import sys
import threading

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE


class PendingHooks:
    """The callbacks waiting for their module's import, by module name (a part of the process state)."""

    def __init__(self):
        self.callbacks = {}
        self.lock = threading.RLock()


def _pending():
    return STATE.part(PendingHooks)


def when_imported(name, callback):
    """Call ``callback(module)`` once module ``name`` has been imported (now, if it already is)."""
    hooks = _pending()
    with hooks.lock:
        module = sys.modules.get(name)
        if module is None:
            hooks.callbacks.setdefault(name, []).append(callback)
            _install_finder()
            return
    _run(callback, module)


def discard(name=None):
    """Forget pending callbacks for ``name`` (all names when None); used when comfy_memx is switched off."""
    hooks = _pending()
    with hooks.lock:
        if name is None:
            hooks.callbacks.clear()
        else:
            hooks.callbacks.pop(name, None)


def pending():
    """Names of modules that still have callbacks waiting for their import."""
    hooks = _pending()
    with hooks.lock:
        return sorted(hooks.callbacks)


def _run(callback, module):
    try:
        callback(module)
    except Exception as exc:  # a hook must never break ComfyUI's import
        internal_error(f"post-import hook for {module.__name__}", exc)


def _fire(module):
    hooks = STATE.existing_part(PendingHooks)
    if hooks is None:
        return
    with hooks.lock:
        callbacks = hooks.callbacks.pop(module.__name__, [])
    for callback in callbacks:
        _run(callback, module)


def _install_finder():
    if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportFinder())


class _PostImportFinder:
    """Meta-path finder that only answers for watched module names, delegating the real search to the others."""

    def find_spec(self, fullname, path=None, target=None):
        hooks = STATE.existing_part(PendingHooks)
        if hooks is None or fullname not in hooks.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader)
                return spec
        return None

    def invalidate_caches(self):
        pass


class _HookedLoader:
    """Delegates to the real loader, then restores it on the module and fires the callbacks."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        # COMFY: tracebacks and importlib.resources look at module.__loader__; give them the real loader back.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        _fire(module)
