"""The ledger's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` signal it subscribes to, in one place.

Imported by the bootstrap before any patch is applied.  What the "after" half of a call needs from its "before"
half stays here, in this thread's ``STATE.stacks``: the ``load_models_gpu`` call (``loads``, matched by ComfyUI's
models list), the bytes an entry had before ``model_load``/``model_unload`` and a node's snapshot (``pending``, by
the entry's or node's id).  A "before" that failed leaves nothing, and its "after" then does nothing, so one fault
is reported once.
"""

import sys

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.ledger import api as ledger

UNLOAD_SCOPE_REASONS = {"free_memory": "memory_pressure", "unload_model_and_clones": "other"}
"""The reason of an unload scope that keeps an enclosing scope's (``unload_all_models`` chooses its own)."""


@signals.patcher_built.subscribe
def patcher_built(patcher, caller_frame):
    """ComfyUI built a ModelPatcher: a new model enters the ledger with who built it; a clone's patcher is noted."""
    ledger.note_built(patcher, caller_frame)


@signals.load_starting.subscribe
def begin_load(mm, models, caller_frame):
    """A ``load_models_gpu`` call begins: push its ``LoadCall``."""
    ledger.begin_load(mm, models, caller_frame)


@signals.load_ended.subscribe
def end_load(mm, models):
    """The ``load_models_gpu`` call for ``models`` ended: the entries it dropped silently, then pop it."""
    ledger.end_load(mm, models)


@signals.model_loading.subscribe
def before_model_load(entry):
    """Remember the bytes ``entry`` has on its device before ComfyUI's ``model_load``."""
    STATE.stacks.pending[("load", id(entry))] = ledger.loaded_size(entry)


@signals.model_loaded.subscribe
def after_model_load(entry, seconds, caller_frame):
    """Record the load of ``entry`` (nothing when its "before" failed)."""
    before = STATE.stacks.pending.pop(("load", id(entry)), None)
    if before is not None:
        ledger.note_model_load(entry, before, seconds, caller_frame)


@signals.model_unloading.subscribe
def before_model_unload(entry):
    """Remember ``entry``'s ``real_model`` weakref (the unload may clear it) and its bytes before the unload."""
    STATE.stacks.pending[("unload", id(entry))] = (entry.real_model, ledger.loaded_size(entry))


@signals.model_unloaded.subscribe
def after_model_unload(entry, result, seconds, caller_frame):
    """Record the unload of ``entry``: full unless ComfyUI answered False (nothing when its "before" failed)."""
    before = STATE.stacks.pending.pop(("unload", id(entry)), None)
    if before is not None:
        module_ref, loaded_before = before
        ledger.note_model_unload(entry, module_ref, loaded_before, result is not False, seconds, caller_frame)


def _oom_test(mm):
    if hasattr(mm, "is_oom"):
        return mm.is_oom
    oom_type = getattr(mm, "OOM_EXCEPTION", None)
    return (lambda exc: isinstance(exc, oom_type)) if isinstance(oom_type, type) else None


@signals.unload_scope_entered.subscribe
def enter_unload_scope(mm, site, caller_frame):
    """Enter the unload scope of ``site``: ``unload_all_models`` chooses ``oom``, ``free_request`` or
    ``unload_all``; the others keep an enclosing scope's reason or have their own."""
    if site == "unload_all_models":
        ledger.begin_unload_all(caller_frame, _oom_test(mm))
    else:
        ledger.begin_unload_scope(UNLOAD_SCOPE_REASONS.get(site, "other"), caller_frame)


@signals.unload_scope_exited.subscribe
def exit_unload_scope(mm, site):
    """Leave the innermost unload scope."""
    ledger.end_unload_scope()


@signals.model_management_patched.subscribe
def adopt_loaded(mm):
    """Late activation: the models ComfyUI already holds enter the ledger (owner unknown)."""
    ledger.adopt_loaded(mm)


@signals.prompt_started.subscribe
def prompt_started(prompt_id, prompt):
    """Attribute this thread's loads to ``prompt_id`` and its nodes' class types."""
    ledger.prompt_started(prompt_id, prompt)


@signals.prompt_ended.subscribe
def prompt_ended():
    """The prompt of this thread ended."""
    ledger.prompt_ended()


def _node_key(node_id, node):
    return ("node", id(node), node_id)


@signals.node_starting.subscribe
def node_starting(prompt_id, node_id, node):
    """Snapshot (by weakref) ComfyUI's loaded entries before the node runs, when any is loaded."""
    snapshot = ledger.node_starting(sys.modules.get("comfy.model_management"))
    if snapshot is not None:
        STATE.stacks.pending[_node_key(node_id, node)] = snapshot


@signals.node_ended.subscribe
def node_ended(prompt_id, node_id, node):
    """The entries the node removed from ComfyUI's list behind its back become ``dropped`` unloads."""
    snapshot = STATE.stacks.pending.pop(_node_key(node_id, node), None)
    if snapshot is not None:
        ledger.node_ended(sys.modules.get("comfy.model_management"), snapshot, prompt_id, node_id, node)


@signals.free_flag_set.subscribe
def flag_set(queue, name, caller_frame):
    """Remember who set the free flag ``name`` (the requester of the worker's unloads)."""
    ledger.flag_set(name, caller_frame)


@signals.flags_served.subscribe
def flags_served(queue, flags, reset):
    """The worker read its flags: the setters of the ones it serves now become its unloads' requesters."""
    ledger.flags_served(flags)


@signals.file_loaded.subscribe
def file_loaded(utils, args, kwargs, result, seconds, caller_frame):
    """A ``load_torch_file`` call returned: its ``file_load`` event."""
    ledger.file_loaded(utils, args, kwargs, result, seconds, caller_frame)
