"""The leak wing's front (what ``leaks.subscriptions`` hands ComfyUI's ``cleanup_models_gc`` to): one small front
over ``leaks.watch`` and ``leaks.release``.

:func:`suspects` (the loaded entries whose patcher is gone while the module lives, before ComfyUI's collection),
:func:`before_collect` and :func:`after_collect` (the report of the ones that survive it, then the ``auto`` release).
"""

from comfy_memx.core.state import STATE
from comfy_memx.leaks import watch
from comfy_memx.leaks.release import release_automatically
from comfy_memx.leaks.watch import before_collect, suspects  # noqa: F401


def after_collect(found):
    """Report the suspects that survived ComfyUI's collection; under ``COMFY_MEMX_RELEASE=auto``, release the ones
    an opted-in package holds, at once (``leaks.release``)."""
    watch.after_collect(found)
    if STATE.config.release == "auto":
        release_automatically([suspect.record for suspect in found])
