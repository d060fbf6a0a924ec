"""Template and contract for a comfy_memx patch module (copy this shape; the contract tests enforce it).

What it wraps and why, which ComfyUI versions were checked, and which settings change it go in this docstring.

Contract:
1. ``patch(module)`` is idempotent: a second call does not double-wrap.
2. The original is saved (first one wins) before the ``setattr``; class attributes are read from the class dict.
3. ``unpatch(module)`` restores the identical objects and is idempotent; patch -> unpatch -> patch works.
   If another extension wrapped over us, unpatch leaves it in place and turns our wrapper into a pass-through.
4. Wrappers are invisible: same return value, same exceptions, every positional and keyword argument passed on
   untouched (new ComfyUI parameters just flow through).
5. comfy_memx's own bookkeeping runs inside ``try/except`` and goes to ``errors.internal_error`` (logged once per
   kind in production, re-raised in tests); it never fails a prompt.
6. A site missing from the running ComfyUI raises ``PatchSkipped(reason)`` for that site only; the others apply.
7. ``adopt(module)`` (optional) records state that existed before the patch (late activation).
8. ``comfy.model_management.cast_to`` is never touched (ComfyUI's hook_breaker restores it).
"""

from comfy_memx import wrapping  # noqa: F401  (real modules use wrapping.wrap through the registry)

NAME = "template"
TARGET = "some.comfy.module"
# dotted name inside TARGET -> factory(module, original, switch) returning the wrapper
SITES = {}


def patch(module):
    """Wrap every site of ``SITES`` in ``module``; returns {site: "patched" | PatchSkipped}."""
    from comfy_memx.registry import patch_sites
    return patch_sites(module, SITES)


def unpatch(module):
    """Restore every site of ``SITES`` in ``module``."""
    from comfy_memx.registry import unpatch_sites
    return unpatch_sites(module, SITES)
