"""The GPU-sharing wing's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` signal it subscribes to.

Imported by the bootstrap before any patch is applied: prompt activity (for the idle unload), a load short of room
(asks idle peers first), the server's start (its routes and services), and the worker's unload that the surface
offers when its routes are up (how this wing unloads, without importing the surface).
"""

from comfy_memx.core import signals
from comfy_memx.sharing import api as sharing
from comfy_memx.sharing import worker


@signals.prompt_started.subscribe
def prompt_started(prompt_id, prompt):
    """A prompt starts: this instance is active."""
    sharing.prompt_started()


@signals.prompt_ended.subscribe
def prompt_ended():
    """A prompt ended."""
    sharing.prompt_ended()


@signals.load_starting.subscribe
def before_load(mm, models, caller_frame):
    """With ``COMFY_MEMX_HANDOFF=host``, ask the idle peers on this device for room for ``models``."""
    sharing.before_load(mm, models)


signals.routes_adding.subscribe(sharing.serve)
signals.worker_unload_offered.subscribe(worker.use)
