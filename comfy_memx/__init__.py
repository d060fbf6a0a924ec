"""comfy_memx: make ComfyUI's model memory visible and controllable without editing ComfyUI.

Start ComfyUI as ``python -m comfy_memx path/to/main.py [ComfyUI args]``, or set ``COMFY_MEMX=1`` with ComfyUI's
normal start command, or ``import comfy_memx.auto`` when embedding ComfyUI.  This module stays tiny on purpose: the
interpreter-startup hook imports it in every Python process of the environment, so it must import nothing
heavy (``_layout`` only finds ``comfy_memx.patches`` in a checkout, with modules Python has already loaded).

Subpackages: ``core`` (settings, process state, the patch machinery, events), ``routekit`` (what every wing's
routes are built with: answers, access, bodies, numbers, executors), ``ledger`` (who loaded what), ``leaks`` (leak
reports and strict mode), ``pins`` (pinned-memory cap and budget), ``surface`` (routes, metrics, ``/memx/free``),
``sharing`` (idle unload and the GPU hand-off), ``fleet`` (Prometheus rules and a Grafana dashboard), ``cli`` (the
launcher and its commands) and ``patches`` (one module per ComfyUI area wrapped).
"""

from comfy_memx import _layout
from comfy_memx._version import __version__

_layout.link_patches(__path__[0])

__all__ = ["__version__", "status"]


def status():
    """Return what comfy_memx did in this process: activation source, config, applied and skipped patch sites."""
    from comfy_memx.core import registry
    from comfy_memx.core.state import STATE
    return {"version": __version__, "source": STATE.source, "config": STATE.config.as_dict(),
            "patches": registry.site_status()}
