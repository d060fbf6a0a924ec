"""Registers comfy_memx's routes (``/memx/models``, ``/memx/free``, ``/metrics``) on ComfyUI's own PromptServer.

Site: ``PromptServer.add_routes``.  ComfyUI's main.py creates ``PromptServer(loop)`` right after importing
``server``, then loads the custom nodes (which add their routes to ``PromptServer.instance.routes``), then calls
``add_routes()``, which hands ``self.routes`` to the aiohttp app (and copies each route under ``/api``).  Adding
ours at the start of ``add_routes`` puts them on the same port, after every custom node's, so a ``/metrics`` that
another pack serves is seen and left alone (comfy_memx's then lives at ``/memx/metrics`` only).  Checked against
ComfyUI 0.3.64 (server.py :796) and 0.27.0 (:1202).  Patching also subscribes the Prometheus metrics to the event
stream, so they count from the first load (``comfy_memx.surface.metrics``; off without prometheus_client).
Fronts called: ``comfy_memx.surface.api`` (routes, metrics, the worker's unload) and ``comfy_memx.sharing.api``
(its own hand-off routes, the idle unload and the hand-off registration, when configured).
Settings: ``COMFY_MEMX_DISABLE=server`` (no routes, no metrics), ``COMFY_MEMX_LEAK_BUDGET`` (the holder search of
each survivor in a /memx/free receipt).
"""

from comfy_memx.core.errors import internal_error
from comfy_memx.core.patching import Patch
from comfy_memx.sharing import api as sharing
from comfy_memx.surface import api as surface


def _memx_add_routes(module, original, switch):
    def add_routes(self, *args, **kwargs):
        if switch.on:
            try:
                surface.serve(self)
                sharing.serve(self, unload=surface.unload_now)
            except Exception as exc:
                internal_error("registering comfy_memx routes", exc)
        return original(self, *args, **kwargs)
    return add_routes


class ServerPatch(Patch):
    """comfy_memx's routes and metrics on ComfyUI's ``server.PromptServer``."""

    name = "server"
    target = "server"
    sites = {"PromptServer.add_routes": _memx_add_routes}

    def after_patch(self, module):
        """Start the metrics, so that they count from the first load."""
        try:
            surface.start_metrics()
        except Exception as exc:
            internal_error("starting comfy_memx metrics", exc)

    def before_unpatch(self, module):
        """Stop the metrics (routes already served stay until restart)."""
        surface.stop_metrics()


PATCH = ServerPatch()
