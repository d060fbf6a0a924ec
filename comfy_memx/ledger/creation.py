"""Models enter the ledger when ComfyUI builds them: the first ModelPatcher seen around a torch module is its creation.

ComfyUI's loaders (checkpoint, diffusion model, CLIP, VAE, ...) build a ModelPatcher around every model they make
(``patches/model_patcher.py`` fires ``patcher_built``), and ``ModelPatcher.clone`` builds another one around the
same module.  So the first patcher seen around a module creates the module's record, with ``created_by`` (the
:class:`~comfy_memx.ledger.attribution.Owner` of the node run that asked: prompt, node, class type, package) and
``created_at``, and the same owner as its ``owner`` until its first load names the loader; every later patcher (a
clone) is only remembered, by weakref, in the record.  A model that no sampler ever loads is known all the same:
``/memx/models`` lists it (state ``built``) and a free's receipt names it among the survivors when a pack keeps it.

Cost per patcher: a clone (every sampler, LoRA and patch node clones its model) is one dict lookup and one weakref
(``bench/wrappers.py`` measures it); a new model also walks the caller's stack once (the owner) and is measured once:
``comfy.model_management.module_size`` of the module, the function ComfyUI's own ``ModelPatcher.model_size`` uses
(one ``state_dict()``: milliseconds for a large model, once per model built), unless the patcher was given its size.
Its result is not stored on the patcher (``model_size()`` would cache it before a loader has loaded the weights, and
ComfyUI would later read that).  When the model is loaded, the load's own figure replaces it.  Nothing is kept but
weak references.
"""

import sys
import time

from comfy_memx.core.state import STATE
from comfy_memx.ledger.attribution import current_owner


def on_built(patcher, caller_frame):
    """ComfyUI built ``patcher`` (called from ``caller_frame``): the record of its module is created on first sight,
    with who built it, its size and a ``created`` event; a patcher around a module already known (a clone) is only
    remembered by weakref."""
    module = getattr(patcher, "model", None)
    if module is None or not type(module).__weakrefoffset__:
        return
    ledger = STATE.ledger
    record = ledger.find(module)
    if record is not None:
        record.add_patcher(patcher)
        return
    record = ledger.record_for(module)
    record.add_patcher(patcher)
    record.created_by = record.owner = current_owner(caller_frame)   # its owner until a load names the loader
    record.created_at = time.time()
    record.model_bytes = built_size(patcher, module)
    if STATE.events.wanted:
        STATE.events.emit("created", model=record.model, model_id=record.model_id, bytes=record.model_bytes,
                          created_by=record.created_by._asdict())


def built_size(patcher, module):
    """Bytes of the model a new ``patcher`` wraps, as ComfyUI's ``model_size()`` counts them, without storing them
    on the patcher; 0 when they cannot be read.

    # COMFY: ``ModelPatcher.size`` is the size the constructor was given (0: unknown), and ``model_size()`` falls back
    to ``comfy.model_management.module_size(self.model)`` (0.3.64, 0.27.0, 0.33.0)."""
    given = getattr(patcher, "size", 0)
    if type(given) is int and given > 0:
        return given
    measure = getattr(sys.modules.get("comfy.model_management"), "module_size", None)
    if measure is None or not hasattr(module, "state_dict"):
        return 0
    return int(measure(module) or 0)
