"""The leak wing's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` signal it subscribes to.

Imported by the bootstrap before any patch is applied.  ``cleanup_models_gc`` is where ComfyUI warns about a model
whose patcher is gone while its module lives: the suspects are found before ComfyUI's collection (kept in this
thread's ``STATE.stacks.pending`` for the other half) and reported after it, with the holders that keep them alive.
With ``COMFY_MEMX_LEAK_MODE=off`` or nothing loaded, neither half does any work.
"""

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.leaks import api as leaks


def _key(mm):
    return ("collect", id(mm))


@signals.collect_starting.subscribe
def before_collect(mm):
    """Find the suspects (loaded entries whose patcher is gone while the module lives) and probe the new ones."""
    if STATE.config.leak_mode == "off" or not mm.current_loaded_models:
        return
    found = leaks.suspects(mm)
    if found:
        STATE.stacks.pending[_key(mm)] = found
        leaks.before_collect(found)


@signals.collect_ended.subscribe
def after_collect(mm):
    """Report the suspects that survived ComfyUI's collection (nothing when none was found before it)."""
    found = STATE.stacks.pending.pop(_key(mm), None)
    if found:
        leaks.after_collect(found)
