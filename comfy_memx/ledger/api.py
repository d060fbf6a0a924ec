"""The ledger's one door: what its subscriptions (``ledger.subscriptions``, which ComfyUI's events reach through
``comfy_memx.core.signals``) and the other wings call of it, so that moving code between the ledger's modules never
touches a caller.

Models built: :func:`note_built` (a ModelPatcher ComfyUI built: a new model's record, or a clone's patcher).
Halves of ``core.signals`` pairs (a "before" returns the memo its "after" gets first): :func:`begin_load` /
:func:`end_load` (one ``load_models_gpu`` call; the entries it dropped silently), :func:`size_before_load` /
:func:`note_model_load`, :func:`state_before_unload` / :func:`note_model_unload`, :func:`enter_unload_scope` /
:func:`exit_unload_scope` (an unload scope: its reason and who asked), :func:`begin_prompt` (the prompt's node
class types), :func:`node_starting` / :func:`node_ended` (entries a node dropped).  Signals: :func:`adopt_loaded`
(late activation), :func:`note_prompt`, :func:`flag_set`, :func:`flags_served` (free flags), :func:`file_loaded`.

For the other wings: :func:`current_prompt_id` (the prompt running on this thread: the leak wing's reports name it),
:func:`modules_loading` (what the loads in progress on this thread are about to load: in use, not leaked) and
:func:`reload_view` (a record's reload causes: the surface shows them).
"""

import sys

from comfy_memx.core import pairs, signals
from comfy_memx.ledger import accounting, causes
from comfy_memx.ledger.accounting import (adopt_loaded, begin_load, end_load, enter_unload_scope,  # noqa: F401
                                          exit_unload_scope)
from comfy_memx.ledger.attribution import begin_prompt, current_prompt_id  # noqa: F401
from comfy_memx.ledger.causes import flags_served, note_flag_set as flag_set, note_prompt, reload_view  # noqa: F401
from comfy_memx.ledger.creation import on_built as note_built  # noqa: F401
from comfy_memx.ledger.fileloads import file_loaded  # noqa: F401


def size_before_load(entry):
    """The ``model_load`` pair's "before" half: the bytes ComfyUI's ``entry`` (a LoadedModel) has on its device, or
    None when it has no patcher (nothing to record)."""
    patcher = entry.model
    return patcher.loaded_size() if patcher is not None else None


def note_model_load(loaded_before, entry, seconds, caller_frame):
    """The ``model_load`` pair's "after" half: record ``LoadedModel.model_load`` of ``entry``: bytes moved (from
    ``loaded_before``), seconds, owner."""
    accounting.on_load(entry, entry.model, loaded_before, seconds, caller_frame)


def state_before_unload(entry):
    """The ``model_unload`` pair's "before" half: ``(entry.real_model, bytes on the device)``, read before the
    unload (which may clear the weakref), or None when ``entry`` has no model."""
    module_ref = entry.real_model
    return (module_ref, accounting.loaded_size(entry)) if module_ref is not None else None


def note_model_unload(before, entry, result, seconds, caller_frame):
    """The ``model_unload`` pair's "after" half: record the unload of ``entry``, full unless ComfyUI answered
    False."""
    module_ref, loaded_before = before
    accounting.note_model_unload(entry, module_ref, loaded_before, result is not False, seconds, caller_frame)


def node_starting(prompt_id, node_id, node):
    """The ``node`` pair's "before" half: a snapshot (by weakref) of ComfyUI's loaded entries before the node runs,
    or None when none is loaded."""
    model_management = sys.modules.get("comfy.model_management")
    if model_management is None or not model_management.current_loaded_models:
        return None
    return accounting.entries_snapshot(model_management)


def node_ended(snapshot, prompt_id, node_id, node):
    """The ``node`` pair's "after" half: the entries node ``node_id`` (the object ``node``) of ``prompt_id`` removed
    from ComfyUI's list behind ComfyUI's back become unloads of reason ``dropped`` asked for by that node."""
    accounting.note_dropped(sys.modules.get("comfy.model_management"), snapshot,
                            causes.node_requester(prompt_id, node_id, node))


def modules_loading():
    """The ids of the torch modules that the ``load_models_gpu`` calls in progress on this thread load (a node is
    about to use them); an empty set outside a load."""
    found = set()
    for call in signals.load.calls():
        for patcher in pairs.subjects(call):
            module = getattr(patcher, "model", None)
            if module is not None:
                found.add(id(module))
            del module
    return found
