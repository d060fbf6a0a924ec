"""Work that other threads wait for and are called back by (a release job, a free request)."""

import threading

from comfy_memx.core.errors import internal_error


class Completion:
    """Done once, waited for with a timeout, with done-callbacks run on the thread that completes it.

    ``site`` names the callbacks' errors (logged once and counted, so one failing callback never keeps the others
    from running).  Callbacks must not block or take a lock the waiting thread holds (``loop.call_soon_threadsafe``).
    """

    def __init__(self, site):
        self._site = site
        self._event = threading.Event()
        self._callbacks = []

    @property
    def done(self):
        """True once :meth:`complete` ran."""
        return self._event.is_set()

    def wait(self, timeout):
        """Block until :attr:`done` or ``timeout`` seconds passed; returns :attr:`done`."""
        return self._event.wait(timeout)

    def add_done_callback(self, callback):
        """Call ``callback()`` once done (on the thread that completes it); at once when it already is."""
        self._callbacks.append(callback)
        if self.done:
            self._drain()

    def complete(self):
        """Mark done and run the callbacks."""
        self._event.set()
        self._drain()

    def _drain(self):
        # newest first; a thread adding one meanwhile is served by whichever thread pops it
        while self._callbacks:
            try:
                callback = self._callbacks.pop()
            except IndexError:
                return
            try:
                callback()
            except Exception as exc:
                internal_error(self._site, exc)
