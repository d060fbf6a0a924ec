"""Done-callbacks of a piece of work that other threads wait for (a release job, a free request)."""

from comfy_memx.core.errors import internal_error


def drain(callbacks, site):
    """Pop and call every callback of the list ``callbacks`` (newest first; a thread adding one meanwhile is served
    by whichever thread pops it), each failure logged and counted under ``site``, so that one failing callback never
    keeps the others from running.  Callbacks must not block (``loop.call_soon_threadsafe``)."""
    while callbacks:
        try:
            callback = callbacks.pop()
        except IndexError:
            return
        try:
            callback()
        except Exception as exc:
            internal_error(site, exc)
