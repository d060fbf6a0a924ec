"""The pin wing's reactions to ComfyUI's events that are not pin calls: every ``comfy_memx.core.signals`` signal it
subscribes to.

Imported by the bootstrap before any patch is applied.  An unload may release pins behind the budget's back, so
the budget settles to ComfyUI's counters after each one (when it runs at all); a load ends its protection from
eviction when its call ends.  The pin calls themselves (ComfyUI
asks for a pin, the budget grants, evicts or refuses) are decisions on the per-layer hot path, called directly by
``patches/pinned_memory.py`` and ``patches/dynamic_pins.py`` through the guarded facade ``comfy_memx.pins.facade``.
"""

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.pins import api as pins
from comfy_memx.pins.context import PinSession


def settle_after_unload(entry, result, seconds, caller_frame):
    """Settle the budget to ComfyUI's counters (nothing while no budget runs)."""
    if STATE.existing_part(PinSession) is not None:
        pins.settle()


signals.model_unload.subscribe(after=settle_after_unload)


def end_load_protection(mm, models):
    """A ``load_models_gpu`` call ends: the budget stops sparing its models (nothing while no budget runs)."""
    if STATE.existing_part(PinSession) is not None:
        pins.end_load_protection()


signals.load.subscribe(after=end_load_protection)
