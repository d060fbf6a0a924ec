"""The base of every patch module: one class per ComfyUI module that comfy_memx wraps.

A patch module (``patches/<area>.py`` in a checkout, ``comfy_memx/patches/<area>.py`` in a built package) defines a subclass of :class:`Patch` and an instance of it named
``PATCH``.  The subclass only declares ``name``, ``target`` (the ComfyUI module) and ``sites`` (dotted attribute ->
wrapper factory), and may override :meth:`Patch.after_patch`, :meth:`Patch.before_unpatch` and
:meth:`Patch.adopt`; the public :meth:`Patch.patch` and :meth:`Patch.unpatch` are owned here, as OpenTelemetry's
``BaseInstrumentor`` owns ``instrument()``/``uninstrument()``, so every patch keeps the same contract:

1. ``patch(module)`` is idempotent: a second call does not double-wrap.
2. The original is saved (first one wins) before the ``setattr``; class attributes are read from the class dict.
3. ``unpatch(module)`` restores the identical objects and is idempotent; patch -> unpatch -> patch works.  If another
   extension wrapped over us, unpatch leaves it in place and turns our wrapper into a pass-through.
4. Wrappers are invisible: same return value, same exceptions, every positional and keyword argument passed on
   untouched (new ComfyUI parameters just flow through).
5. A wrapper runs one pair of ``comfy_memx.core.signals`` around its ComfyUI call (its "before" half, the call, its
   "after" half) or fires one signal, and touches nothing else of a wing or of feature state; a patch module imports
   only ``comfy_memx.core``.  The wings subscribe at import (``comfy_memx/<wing>/subscriptions.py``), and every
   subscriber runs under one guard that sends an ``Exception`` to ``errors.internal_error`` (logged once per kind
   and counted in production, re-raised in tests), so comfy_memx's bookkeeping never fails a prompt;
   ``MemoryError``, ``RecursionError``, ``KeyboardInterrupt`` and ``SystemExit`` stay what they are.  What the
   "after" half needs from the "before" half is the pair's business (``comfy_memx.core.pairs``: memos, a record that
   always unwinds).  The one exception is the per-layer pin path (``pinned_memory``, ``dynamic_pins``), where the
   pin budget decides whether ComfyUI pins at all: those wrappers call the pin API through its guarded facade
   ``comfy_memx.pins.facade`` (``comfy_memx.core.guard``), whose every entry answers what ComfyUI does alone when
   the pin wing fails.
6. A site missing from the running ComfyUI is skipped with :class:`~comfy_memx.core.errors.PatchSkipped` (its
   reason); the other sites apply.
7. ``adopt(module)`` records state that existed before the patch (late activation; a cap set after import).
8. ``comfy.model_management.cast_to`` is never touched (ComfyUI's hook_breaker restores it).

A wrapper factory is called as ``factory(module, original, switch)`` and returns the wrapper; the wrapper must call
``original`` unchanged while ``switch.on`` is False.
"""

import functools

from comfy_memx.core import wrapping
from comfy_memx.core.errors import PatchSkipped


class Patch:
    """One ComfyUI module's wrappers; see the module docstring."""

    name = "template"
    target = "some.comfy.module"
    sites = {}

    def patch(self, module):
        """Wrap every site in ``module``; returns ``{site: "patched" | "already patched" | PatchSkipped}``."""
        results = {}
        for dotted, factory in self.sites.items():
            try:
                results[dotted] = wrapping.wrap(module, dotted, functools.partial(factory, module),
                                                site=(self.name, dotted))
            except PatchSkipped as skipped:
                results[dotted] = skipped
        self.after_patch(module)
        return results

    def unpatch(self, module):
        """Restore every site of ``module`` in reverse order; returns ``{site: result of wrapping.unwrap}``."""
        self.before_unpatch(module)
        return {dotted: wrapping.unwrap(module, dotted) for dotted in reversed(list(self.sites))}

    def after_patch(self, module):
        """Hook run after the sites were wrapped (start a subscriber, say); the default does nothing."""

    def before_unpatch(self, module):
        """Hook run before the sites are restored (put back a value :meth:`adopt` replaced); does nothing here."""

    def adopt(self, module):
        """Late activation: take in state ComfyUI created before the patch; the default does nothing."""
