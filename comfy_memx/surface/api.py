"""The production surface's one door: what its subscriptions (``surface.subscriptions``) call of it, one small front
over routes, metrics and the free-request desk.  No other wing calls it; the surface reads the ledger, the leak wing
and the pin wing through their own doors (their ``api`` modules).

Server: :func:`serve`, :func:`start_metrics`, :func:`stop_metrics`, :func:`unload_now` (offered to the sharing
wing).  Prompt worker (following a ``/memx/free``): :func:`flag_set`, :func:`flags_served`, :func:`reset_ended`,
:func:`free_request_unload_ended`, :func:`requested_by`.
"""

from comfy_memx.surface import metrics, routes
from comfy_memx.surface.freeing import (flag_set, flags_served, free_request_unload_ended,  # noqa: F401
                                       requested_by, reset_ended, unload_now)


def serve(server):
    """Add comfy_memx's routes to ComfyUI's ``server`` (once); returns the paths served."""
    return routes.register(server)


def start_metrics():
    """Subscribe the Prometheus metrics to the event stream (off without prometheus_client)."""
    metrics.install()


def stop_metrics():
    """Unsubscribe the Prometheus metrics."""
    metrics.uninstall()
