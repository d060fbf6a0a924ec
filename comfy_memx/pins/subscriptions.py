"""The pin wing's reactions to ComfyUI's events that are not pin calls: every ``comfy_memx.core.signals`` signal it
subscribes to.

An unload may release pins behind the budget's back, so the budget settles to ComfyUI's counters after each one; a
load ends its protection from eviction when its call ends.  Both are subscribed only while a pin session runs
(:func:`follow_loads` when ``pins.session.start`` ran, :func:`unfollow_loads` when the session closes): a server
whose ComfyUI has no pinning or turned it off (0.3.64, ``MAX_PINNED_MEMORY`` not above 0) pays nothing for them on
each load and unload.  The pin calls themselves (ComfyUI asks for a pin, the budget grants, evicts or refuses) are
decisions on the per-layer hot path, called directly by ``patches/pinned_memory.py`` and ``patches/dynamic_pins.py`` through the guarded facade ``comfy_memx.pins.facade``.
"""

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.pins import api as pins
from comfy_memx.pins.context import PinSession


def settle_after_unload(entry, result, seconds, caller_frame):
    """Settle the budget to ComfyUI's counters (nothing while no budget runs)."""
    if STATE.existing_part(PinSession) is not None:
        pins.settle()


def end_load_protection(mm, models):
    """A ``load_models_gpu`` call ends: the budget stops sparing its models (nothing while no budget runs)."""
    if STATE.existing_part(PinSession) is not None:
        pins.end_load_protection()


def follow_loads():
    """A pin session started: from now on every unload settles the budget and every load ends its protection."""
    signals.model_unload.subscribe(after=settle_after_unload)
    signals.load.subscribe(after=end_load_protection)


def unfollow_loads():
    """The pin session closed: loads and unloads no longer call this wing."""
    signals.model_unload.unsubscribe(settle_after_unload)
    signals.load.unsubscribe(end_load_protection)
