"""Template of a comfy_memx patch module (copy this shape; the contract is in ``comfy_memx.core.patching``).

What it wraps and why, which ComfyUI versions were checked, which fronts it calls and which settings change it go
in this docstring.  A patch module holds its sites, their wrappers and one front call per event: the bookkeeping
itself lives in the wing (``comfy_memx.<wing>.api``), never here.
"""

from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.ledger import api as ledger


def _memx_some_function(module, original, switch):
    def some_function(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        result = original(*args, **kwargs)
        try:
            ledger.some_event(args, kwargs, result)  # one front call per event
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
