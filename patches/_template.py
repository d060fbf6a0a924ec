"""Template of a comfy_memx patch module (copy this shape; the contract is in ``comfy_memx.core.patching``).

What it wraps and why, which ComfyUI versions were checked, and which settings change it go in this docstring.
"""

from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch


def _memx_some_function(module, original, switch):
    def some_function(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        try:
            pass  # comfy_memx's bookkeeping
        except Exception as exc:
            internal_error("some bookkeeping", exc)
        return result
    return some_function


class TemplatePatch(Patch):
    """What this patch is for, in one line."""

    name = "template"
    target = "some.comfy.module"
    sites = {"some_function": _memx_some_function}


PATCH = TemplatePatch()
