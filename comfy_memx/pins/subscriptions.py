"""The pin wing's reactions to ComfyUI's events that are not pin calls.

None is subscribed at import: the budget's reactions to loads and unloads (a load ends its protection from
eviction, an unload settles the budget to ComfyUI's counters) are subscribed by ``pins.loadscope`` only while a pin
session runs, so a server whose ComfyUI pins nothing pays nothing for them on each load and unload.  The pin calls
themselves (ComfyUI asks for a pin, the budget grants, evicts or refuses) are decisions on the per-layer hot path,
called directly by ``patches/pinned_memory.py`` and ``patches/dynamic_pins.py`` through the guarded facade
``comfy_memx.pins.facade``.
"""

from comfy_memx.pins import loadscope  # noqa: F401 (its subscriptions follow the pin session; see above)
