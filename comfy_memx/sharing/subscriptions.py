"""The GPU-sharing wing's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` pair and signal it
subscribes to.

Imported by the bootstrap before any patch is applied: prompt activity (for the idle unload), what a hand-off peer
publishes after each prompt, a load short of room (asks idle peers first; subscribed while hand-off is on), the
server's start (its routes and services), and the worker's unload that the surface offers when its routes are up (how this wing unloads, without
importing the surface).  Each subscription does one job.
"""

from comfy_memx.core import signals
from comfy_memx.sharing import api as sharing
from comfy_memx.sharing import worker


def prompt_started(prompt_id, prompt):
    """A prompt starts: this instance is active (the memo says so to the other half)."""
    sharing.prompt_started()
    return True


def prompt_ended(_started):
    """The prompt of :func:`prompt_started` ended."""
    sharing.prompt_ended()


signals.prompt.subscribe(prompt_started, prompt_ended)
signals.prompt.subscribe(after=sharing.publish_held)


signals.routes_adding.subscribe(sharing.serve)


def follow_loads():
    """Hand-off registered this instance: from now on every load asks the idle peers for room first when the
    device is short of it.  Subscribed only then, so a server without hand-off pays nothing for it on each load."""
    signals.load.subscribe(sharing.before_load)


def unfollow_loads():
    """This instance left the hand-off registry: loads no longer call this wing."""
    signals.load.unsubscribe(sharing.before_load)
signals.worker_unload_offered.subscribe(worker.use)
