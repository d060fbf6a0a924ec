"""How this wing unloads: through ComfyUI's prompt worker, by the function the surface offers when the server starts.

The idle unload and a hand-off to a peer unload exactly as ``POST /memx/free`` does (the flags and the worker's
run, never an unload behind the worker's back).  That machinery is the surface's (``surface.freeing``); sharing
does not import it but is handed it when the server starts (:func:`use`, subscribed to ``worker_unload_offered``), so the two wings never lean on each other.
"""

from comfy_memx.core.errors import SetupError
from comfy_memx.core.state import STATE

WAIT_FOR_WORKER_S = 120.0


class Worker:
    """The unload function this process was given (a part of the process state)."""

    def __init__(self):
        self.unload = None   # callable(queue, origin, timeout) -> receipt dict


def use(unload):
    """Unload through ``unload(queue, origin, timeout)`` from now on (the surface offers its own)."""
    STATE.part(Worker).unload = unload


def unload(queue, origin, timeout=WAIT_FOR_WORKER_S):
    """Ask ComfyUI's worker to unload its models and wait for its run; the receipt (``origin`` becomes the unloads'
    ``requested_by``).  Raises :class:`SetupError` when no unload function was passed in (the server never
    started)."""
    function = STATE.part(Worker).unload
    if function is None:
        raise SetupError("comfy_memx's sharing wing was not given the worker's unload (the server patch did not run)")
    return function(queue, origin, timeout)
