"""The surface's reactions to ComfyUI's events: every ``comfy_memx.core.signals`` signal it subscribes to.

Imported by the bootstrap before any patch is applied; each subscription does one job.  ComfyUI's server: the routes and metrics, and the worker's
unload offered to the sharing wing (``worker_unload_offered``), so neither wing imports the other.  ComfyUI's prompt
worker: the free-request desk follows a ``/memx/free`` through the flags, the unload and the cache reset.
"""

from comfy_memx.core import signals
from comfy_memx.surface import api as surface


@signals.routes_adding.subscribe
def serve(server):
    """Add comfy_memx's routes to ComfyUI's server."""
    surface.serve(server)


@signals.routes_adding.subscribe
def offer_worker_unload(server):
    """Offer the worker's unload to whoever needs it (the sharing wing's idle unload and hand-off)."""
    signals.worker_unload_offered.fire(surface.unload_now)


@signals.server_patched.subscribe
def start_metrics(module):
    """Subscribe the Prometheus metrics to the event stream, so that they count from the first load."""
    surface.start_metrics()


@signals.server_unpatching.subscribe
def stop_metrics(module):
    """Unsubscribe the Prometheus metrics."""
    surface.stop_metrics()


@signals.free_flag_set.subscribe
def flag_set(queue, name, caller_frame):
    """Remember a flag that someone else sets while a free request waits on it."""
    surface.flag_set(queue, name)


signals.flags_served.subscribe(surface.flags_served)


@signals.cache_reset.subscribe
def reset_ended(executor):
    """The worker's cache reset returned (the ``free_memory`` part of a run)."""
    surface.reset_ended()


signals.free_request_unload_ended.subscribe(surface.free_request_unload_ended)
signals.unload_requester.subscribe(surface.requested_by)
