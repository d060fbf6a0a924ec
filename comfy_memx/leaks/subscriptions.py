"""The leak wing's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` pair it subscribes to.

Imported by the bootstrap before any patch is applied.  Each subscription does one job, so that one failing never
disables another: reporting ComfyUI's warned leaks, releasing them (``COMFY_MEMX_RELEASE=auto``) and looking at the
models unloaded earlier are three subscriptions of ``cleanup_models_gc``.

``cleanup_models_gc`` is where ComfyUI warns about a model whose patcher is gone while its module lives: the
suspects are found before ComfyUI's collection (the memo of the ``collect`` pair) and reported after it, with the
holders that keep them alive.  With ``COMFY_MEMX_LEAK_MODE=off`` or nothing loaded, neither half does any work.

A model that a full ``model_unload`` takes out of ComfyUI's loaded list is never warned about: it is watched by
weakref (``leaks.unwarned``) and looked at after the next ``cleanup_models_gc``, when a full collection ran since.

Releases run on ComfyUI's prompt worker between prompts: at ``flags_reading`` (the worker about to read its free
flags, after every prompt and whenever it is woken), or, in a process without a prompt worker, at a prompt's end.
"""

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.leaks import api as leaks


def before_collect(mm):
    """Find the suspects (loaded entries whose patcher is gone while the module lives) and probe the new ones; the
    suspects are the memo (None when there is none)."""
    if STATE.config.leak_mode == "off" or not mm.current_loaded_models:
        return None
    found = leaks.suspects(mm)
    if not found:
        return None
    leaks.before_collect(found)
    return found


def report_survivors(found, mm):
    """Report the suspects that survived ComfyUI's collection."""
    leaks.after_collect(found)


def release_survivors(mm):
    """Under ``COMFY_MEMX_RELEASE=auto``: release the warned leaks that an opted-in package holds (``leaks.release``)
    among the entries ComfyUI's collection left without a patcher."""
    if STATE.config.release == "auto" and STATE.config.leak_mode != "off" and mm.current_loaded_models:
        leaks.release_automatically([suspect.record for suspect in leaks.suspects(mm)])


signals.collect.subscribe(before_collect, report_survivors)
signals.collect.subscribe(after=release_survivors)
signals.collect.subscribe(after=leaks.check_unloaded)


def before_unload(entry):
    """Keep ``entry``'s ``real_model`` weakref (the unload may clear it) for the other half."""
    return entry.real_model if STATE.config.leak_mode != "off" else None


def watch_unloaded(module_ref, entry, result, seconds, caller_frame):
    """A full unload took the model out of ComfyUI's loaded list: watch it (by weakref) for the next collection."""
    if result is not False:
        leaks.note_unloaded(module_ref)


signals.model_unload.subscribe(before_unload, watch_unloaded)


def after_load(entry, seconds, caller_frame):
    """A model ComfyUI loads again is in use: a leak found after its unload is over (``leaks.unwarned``)."""
    leaks.loaded_again(entry)


signals.model_load.subscribe(after=after_load)


def between_prompts(queue, reset):
    """ComfyUI's prompt worker is between prompts (about to read its free flags): run the queued releases there
    (``leaks.release.desk``; nothing queued: one attribute read)."""
    if reset:
        leaks.releases_due(queue)


signals.flags_reading.subscribe(between_prompts)


def prompt_begins(prompt_id, prompt):
    """Count the prompt: without a prompt worker, no release runs while one runs (the memo: it was counted)."""
    leaks.prompt_started()
    return True


def prompt_over(counted):
    """Without a prompt worker, a prompt's end is the point between prompts where the queued releases run."""
    leaks.prompt_ended()


signals.prompt.subscribe(prompt_begins, prompt_over)
