"""The GPU-sharing wing's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` pair and signal it
subscribes to.

Imported by the bootstrap before any patch is applied: prompt activity (for the idle unload), what a hand-off peer
publishes after each prompt, the server's start (its routes and services), and the worker's unload that the surface
offers when its routes are up (how this wing unloads, without importing the surface).  Each subscription does one
job.  A load short of room asks the idle peers first: that "before" half is subscribed by ``sharing.handoff`` only
while this instance is registered for hand-off.
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
signals.worker_unload_offered.subscribe(worker.use)
