"""Template of a comfy_memx patch module (copy this shape; the contract is in ``comfy_memx.core.patching``).

What it wraps and why, which ComfyUI versions were checked, which signals it fires and which settings change it go
in this docstring.  A patch module holds its sites and their wrappers, and each wrapper runs one pair of
``comfy_memx.core.signals`` around its ComfyUI call (or fires one signal for a one-phase event; a wrapper of a
*stacked* pair keeps the record in its local ``call`` and is returned as ``pair.runs_in(wrapper)``, which is where
the pair finds its calls in progress): it imports only
``comfy_memx.core``, and the bookkeeping itself lives in the wings that subscribe
(``comfy_memx/<wing>/subscriptions.py``), never here.
"""

import sys

from comfy_memx.core import signals
from comfy_memx.core.patching import Patch


def _memx_some_function(module, original, switch):
    def some_function(*args, **kwargs):
        if not switch.on:
            return original(*args, **kwargs)
        call = signals.some_call.before(module, sys._getframe(1))   # the pair's halves; the guard is the pair's
        try:
            return original(*args, **kwargs)
        finally:
            signals.some_call.after(call, module)
    return some_function


class TemplatePatch(Patch):
    """What this patch is for, in one line."""

    name = "template"
    target = "some.comfy.module"
    sites = {"some_function": _memx_some_function}


PATCH = TemplatePatch()
