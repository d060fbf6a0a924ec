"""The ledger's one door: what its subscriptions (``ledger.subscriptions``, which ComfyUI's events reach through
``comfy_memx.core.signals``) and the other wings call of it, so that moving code between the ledger's modules never
touches a caller.

Models built: :func:`note_built` (a ModelPatcher ComfyUI built: a new model's record, or a clone's patcher).
Loads: :func:`begin_load` / :func:`end_load` (one ``load_models_gpu`` call; the entries it dropped silently),
:func:`loaded_size`, :func:`note_model_load`, :func:`note_model_unload`, :func:`adopt_loaded` (late activation).
Unload scopes (their reason and who asked): :func:`begin_unload_scope` / :func:`begin_unload_all` /
:func:`end_unload_scope`.  Prompts and nodes: :func:`prompt_started` / :func:`prompt_ended`, :func:`node_starting` /
:func:`node_ended` (entries a node dropped).  Free flags: :func:`flag_set`, :func:`flags_served`.  Files:
:func:`file_loaded`.

For the other wings: :func:`current_prompt_id` (the prompt running on this thread: the leak wing's reports name it),
:func:`modules_loading` (what the loads in progress on this thread are about to load: in use, not leaked) and
:func:`reload_view` (a record's reload causes: the surface shows them).
"""

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.ledger import accounting, attribution, causes
from comfy_memx.ledger.accounting import (adopt_loaded, begin_load, end_load, loaded_size,  # noqa: F401
                                          note_model_unload)
from comfy_memx.ledger.attribution import current_prompt_id  # noqa: F401
from comfy_memx.ledger.creation import on_built as note_built  # noqa: F401
from comfy_memx.ledger.causes import flags_served, note_flag_set as flag_set, reload_view  # noqa: F401
from comfy_memx.ledger.fileloads import file_loaded  # noqa: F401


def note_model_load(entry, loaded_before, seconds, caller_frame):
    """Record ``LoadedModel.model_load`` of ComfyUI's ``entry``: bytes moved, seconds, owner."""
    accounting.on_load(entry, entry.model, loaded_before, seconds, caller_frame)


def begin_unload_scope(reason, caller_frame):
    """Enter a scope whose unloads have ``reason`` unless an enclosing scope already chose one (``free_memory``,
    ``unload_model_and_clones``); ``caller_frame`` asked for it."""
    accounting.push_reason(reason, keep_outer=True, frame=caller_frame)


def begin_unload_all(caller_frame, oom_test):
    """Enter the scope of an ``unload_all_models`` call from ``caller_frame``: ``oom`` while ``oom_test`` says an
    out-of-memory error is being handled, ``free_request`` from ComfyUI's prompt worker, else ``unload_all``."""
    try:
        reason = accounting.reason_for_unload_all(caller_frame, oom_test)
    except Exception as exc:
        internal_error("unload reason", exc)
        reason = "unload_all"
    accounting.push_reason(reason, frame=caller_frame)


def end_unload_scope():
    """Leave the scope entered by the matching ``begin_unload_*``."""
    accounting.pop_reason()


def prompt_started(prompt_id, prompt):
    """A prompt starts executing on this thread: its nodes' class types, the window of recent prompts."""
    attribution.begin_prompt(prompt_id, prompt)
    causes.note_prompt(prompt_id)


def prompt_ended():
    """The prompt of this thread ended."""
    attribution.end_prompt()


def node_starting(model_management):
    """Before a node runs: a snapshot (by weakref) of ComfyUI's loaded entries, or None when none is loaded."""
    if model_management is None or not model_management.current_loaded_models:
        return None
    return accounting.entries_snapshot(model_management)


def node_ended(model_management, snapshot, prompt_id, node_id, node):
    """After node ``node_id`` (the object ``node``) of ``prompt_id`` ran: the entries it removed from ComfyUI's list
    behind ComfyUI's back become unloads of reason ``dropped`` asked for by that node."""
    accounting.note_dropped(model_management, snapshot, causes.node_requester(prompt_id, node_id, node))


def modules_loading():
    """The ids of the torch modules that the ``load_models_gpu`` calls in progress on this thread load (a node is
    about to use them); an empty set outside a load."""
    found = set()
    for call in list(STATE.stacks.loads):
        for patcher in list(call.models or ()):
            module = getattr(patcher, "model", None)
            if module is not None:
                found.add(id(module))
            del module
    return found
