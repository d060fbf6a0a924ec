"""The leak wing's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` signal it subscribes to.

Imported by the bootstrap before any patch is applied.  ``cleanup_models_gc`` is where ComfyUI warns about a model
whose patcher is gone while its module lives: the suspects are found before ComfyUI's collection (kept in this
thread's ``STATE.stacks.pending`` for the other half) and reported after it, with the holders that keep them alive.
With ``COMFY_MEMX_LEAK_MODE=off`` or nothing loaded, neither half does any work.

A model that a full ``model_unload`` takes out of ComfyUI's loaded list is never warned about: it is watched by
weakref (``leaks.unwarned``) and looked at after the next ``cleanup_models_gc``, when a full collection ran since.

Releases run on ComfyUI's prompt worker between prompts: at ``flags_reading`` (the worker about to read its free
flags, after every prompt and whenever it is woken), or, in a process without a prompt worker, at a prompt's end.
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
    """Report the suspects that survived ComfyUI's collection (nothing when none was found before it), then the
    unloaded models that survived a full collection while held (nothing when none is watched)."""
    found = STATE.stacks.pending.pop(_key(mm), None)
    if found:
        leaks.after_collect(found)
    leaks.check_unloaded(mm)


def _unload_key(entry):
    return ("leak_unload", id(entry))


@signals.model_unloading.subscribe
def before_unload(entry):
    """Keep ``entry``'s ``real_model`` weakref (the unload may clear it) for the other half."""
    if STATE.config.leak_mode != "off":
        STATE.stacks.pending[_unload_key(entry)] = entry.real_model


@signals.model_loaded.subscribe
def after_load(entry, seconds, caller_frame):
    """A model ComfyUI loads again is in use: a leak found after its unload is over (``leaks.unwarned``)."""
    leaks.loaded_again(entry)


@signals.model_unloaded.subscribe
def after_unload(entry, result, seconds, caller_frame):
    """A full unload took the model out of ComfyUI's loaded list: watch it (by weakref) for the next collection."""
    module_ref = STATE.stacks.pending.pop(_unload_key(entry), None)
    if module_ref is not None and result is not False:
        leaks.note_unloaded(module_ref)


@signals.flags_reading.subscribe
def between_prompts(queue, reset):
    """ComfyUI's prompt worker is between prompts (about to read its free flags): run the queued releases there
    (``leaks.release.desk``; nothing queued: one attribute read)."""
    if reset:
        leaks.releases_due(queue)


@signals.prompt_started.subscribe
def prompt_started(prompt_id, prompt):
    """Count the prompt: without a prompt worker, no release runs while one runs."""
    leaks.prompt_started()


@signals.prompt_ended.subscribe
def prompt_ended():
    """Without a prompt worker, a prompt's end is the point between prompts where the queued releases run."""
    leaks.prompt_ended()
