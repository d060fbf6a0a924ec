"""comfy_memx: make ComfyUI's model memory visible and controllable without editing ComfyUI.

Start ComfyUI as ``python -m comfy_memx path/to/main.py [ComfyUI args]``, or set ``COMFY_MEMX=1`` with ComfyUI's
normal start command, or ``import comfy_memx.auto`` when embedding ComfyUI.  This module stays tiny on purpose: the
interpreter-startup hook imports it in every Python process of the environment, so it must import nothing.
"""

__version__ = "0.1.0"


def status():
    """Return what comfy_memx did in this process: activation source, config, applied and skipped patch sites."""
    from comfy_memx import registry, runtime
    return {"version": __version__, "source": runtime.source, "config": runtime.config.as_dict(),
            "patches": registry.site_status()}
