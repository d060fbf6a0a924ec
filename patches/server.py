"""Registers comfy_memx's routes (``/memx/models``, ``/memx/free``, ``/metrics``) on ComfyUI's own PromptServer.

Site: ``PromptServer.add_routes``.  ComfyUI's main.py creates ``PromptServer(loop)`` right after importing
``server``, then loads the custom nodes (which add their routes to ``PromptServer.instance.routes``), then calls
``add_routes()``, which hands ``self.routes`` to the aiohttp app (and copies each route under ``/api``).  Adding
ours at the start of ``add_routes`` puts them on the same port, after every custom node's, so a ``/metrics`` that
another pack serves is seen and left alone (comfy_memx's then lives at ``/memx/metrics`` only).  Checked against
ComfyUI 0.3.64 (server.py :796) and 0.27.0 (:1202).  Patching also subscribes the Prometheus metrics to the event
stream, so they count from the first load (``comfy_memx.surface.metrics``; off without prometheus_client).
Signals fired (``comfy_memx.core.signals``): ``routes_adding``, ``server_patched``, ``server_unpatching``; the
surface (routes, metrics, the worker's unload, which it offers to sharing) and sharing (its hand-off routes, the idle
unload and the hand-off registration, when configured) subscribe.
Settings: ``COMFY_MEMX_DISABLE=server`` (no routes, no metrics), ``COMFY_MEMX_LEAK_BUDGET`` (the holder search of
each survivor in a /memx/free receipt).
"""

from comfy_memx.core import signals
from comfy_memx.core.patching import Patch


def _memx_add_routes(module, original, switch):
    def add_routes(self, *args, **kwargs):
        if switch.on:
            signals.routes_adding.fire(self)
        return original(self, *args, **kwargs)
    return add_routes


class ServerPatch(Patch):
    """comfy_memx's routes and metrics on ComfyUI's ``server.PromptServer``."""

    name = "server"
    target = "server"
    sites = {"PromptServer.add_routes": _memx_add_routes}

    def after_patch(self, module):
        """Start the metrics, so that they count from the first load."""
        signals.server_patched.fire(module)

    def before_unpatch(self, module):
        """Stop the metrics (routes already served stay until restart)."""
        signals.server_unpatching.fire(module)


PATCH = ServerPatch()
