"""The GPU-sharing wing's one door: what its subscriptions (``sharing.subscriptions``) call of it, so that the wing's
modules can move without touching a subscription.  No other wing calls it, and it calls no other wing: its routes
are built with the route kit (``comfy_memx.routekit``), and its unloads go through the function the surface offers
when the server starts (the signal ``worker_unload_offered``).

:func:`serve` (routes and services on ComfyUI's server), :func:`prompt_started` / :func:`prompt_ended` (activity),
:func:`publish_held` (what a hand-off peer says it holds, after each prompt).
"""

import sys

from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.sharing import activity, handoff, idle, routes, worker
from comfy_memx.sharing.activity import prompt_ended, prompt_started  # noqa: F401


def serve(server):
    """Register this wing's routes on ComfyUI's ``server`` and start its services when configured: the idle unload
    and the hand-off registration.  How it unloads through ComfyUI's worker is offered by the surface
    (``worker_unload_offered``, see ``sharing.subscriptions``), so the two wings do not import each other."""
    routes.register(server)
    idle.start(server.prompt_queue)
    args = getattr(sys.modules.get("comfy.cli_args"), "args", None)
    handoff.start_safely(getattr(args, "port", None), getattr(args, "listen", None))


def publish_held():
    """After a prompt, with ``COMFY_MEMX_HANDOFF=host``: publish what this instance holds now (the bound of what its
    peers believe it freed)."""
    if STATE.config.handoff == "host":
        try:
            handoff.publish_held()
        except Exception as exc:   # a registry gone bad since the start: logged once, the prompt goes on
            internal_error("GPU hand-off registry", exc)
