"""The production surface's one door: what the patch modules call of it (``patches/server.py``,
``patches/execution.py``), one small front over routes, metrics and the free-request desk.  No other wing calls it;
the surface reads the ledger, the leak wing and the pin wing through their own doors (their ``api`` modules).

Server: :func:`serve`, :func:`start_metrics`, :func:`stop_metrics`, :func:`unload_now` (handed to the sharing
wing).  Prompt worker (following a ``/memx/free``): :func:`flag_set`, :func:`read_flags`, :func:`reset_ended`.
"""

from comfy_memx.surface import metrics, routes
from comfy_memx.surface.freeing import flag_set, read_flags, reset_ended, unload_now  # noqa: F401


def serve(server):
    """Add comfy_memx's routes to ComfyUI's ``server`` (once); returns the paths served."""
    return routes.register(server)


def start_metrics():
    """Subscribe the Prometheus metrics to the event stream (off without prometheus_client)."""
    metrics.install()


def stop_metrics():
    """Unsubscribe the Prometheus metrics."""
    metrics.uninstall()
