"""The pin API as the pin patches call it: every function of ``comfy_memx.pins.api`` that
``patches/pinned_memory.py`` and ``patches/dynamic_pins.py`` call, behind core's guard (``comfy_memx.core.guard``),
each with what it answers when it fails: what ComfyUI does without comfy_memx.

* not budgeted (``budgeted`` False, ``decision_lock`` None, no grant from a ``before_*`` call): ComfyUI pins,
  unpins and registers as it would alone;
* eviction not reordered (``reorders_eviction`` False), and an MRU walk that failed (``FAILED``): ComfyUI's own walk
  runs;
* a layer's pin unknown (``layer_pin`` ``(None, True)``): ComfyUI's ``get_pin`` runs as it would alone;
* bookkeeping after ComfyUI's call (``after_*``, ``note_pin_check``, ``after_node_reset``): nothing;
* the cap not started (``start_budget`` None): ComfyUI keeps its own ``MAX_PINNED_MEMORY``; not stopped
  (``stop_budget`` None): the value stays.

The patches import this module, never ``pins.api`` itself, so no call of theirs into the pin wing is unguarded.
"""

from comfy_memx.core.guard import FAILED, Facade  # noqa: F401 (FAILED: the MRU walks' fallback, for the patches)
from comfy_memx.pins import api

PINS = Facade("pins", {
    "budgeted": (api.managing, False),
    "decision_lock": (api.pin_lock, None),
    "before_tensor_pin": (api.before_tensor_pin, None),
    "after_tensor_pin": (api.after_tensor_pin, None),
    "before_tensor_unpin": (api.before_tensor_unpin, None),
    "after_tensor_unpin": (api.after_tensor_unpin, None),
    "note_pin_check": (api.note_pin_check, None),
    "after_comfyui_eviction": (api.after_comfyui_eviction, None),
    "after_node_reset": (api.after_node_reset, None),
    "reorders_eviction": (api.reorders_eviction, False),
    "free_pins_mru": (api.free_pins_mru, FAILED),
    "free_registrations_mru": (api.free_registrations_mru, FAILED),
    "before_layer_pin": (api.before_layer_pin, None),
    "after_layer_pin": (api.after_layer_pin, None),
    "layer_pin": (api.layer_pin, (None, True)),
    "before_reregister": (api.before_reregister, None),
    "start_budget": (api.start_budget, None),
    "stop_budget": (api.stop_budget, None),
    "startup_line": (api.startup_line, None),
})
"""The guarded pin API (see the module docstring)."""

REFUSED = api.REFUSED
"""A ``before_*`` answer that makes a wrapper reply as ComfyUI does when it cannot pin (a constant, not a call)."""
