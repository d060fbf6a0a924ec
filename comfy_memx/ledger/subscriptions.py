"""The ledger's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` pair and signal it subscribes to, in
one place.

Imported by the bootstrap before any patch is applied.  Each subscription does one job.  What the "after" half of a
call needs from its "before" half is the memo the "before" returns (the bytes an entry had before ``model_load``,
a node's snapshot, a load's :class:`~comfy_memx.ledger.accounting.LoadBooks`, an unload scope's reason), kept by
the pair, which unwinds it whatever happens; a "before" that failed leaves nothing, and its "after" then does
nothing, so one fault is reported once.
"""

from comfy_memx.core import signals
from comfy_memx.ledger import api as ledger

signals.load.subscribe(ledger.begin_load, ledger.end_load)
signals.model_load.subscribe(ledger.size_before_load, ledger.note_model_load)
signals.model_unload.subscribe(ledger.state_before_unload, ledger.note_model_unload)
signals.unload_scope.subscribe(ledger.enter_unload_scope, ledger.exit_unload_scope)
signals.model_management_patched.subscribe(ledger.adopt_loaded)
signals.prompt.subscribe(ledger.begin_prompt)
signals.node.subscribe(ledger.node_starting, ledger.node_ended)


@signals.patcher_built.subscribe
def patcher_built(patcher, caller_frame):
    """ComfyUI built a ModelPatcher: a new model enters the ledger with who built it; a clone's patcher is noted."""
    ledger.note_built(patcher, caller_frame)


@signals.prompt.subscribe
def count_prompt(prompt_id, prompt):
    """A prompt starts: it enters the window of recent prompts (the reload-thrash rule)."""
    ledger.note_prompt(prompt_id)


@signals.free_flag_set.subscribe
def flag_set(queue, name, caller_frame):
    """Remember who set the free flag ``name`` (the requester of the worker's unloads)."""
    ledger.flag_set(name, caller_frame)


@signals.flags_served.subscribe
def flags_served(queue, flags, reset):
    """The worker read its flags: the setters of the ones it serves now become its unloads' requesters."""
    ledger.flags_served(flags)


signals.file_loaded.subscribe(ledger.file_loaded)
