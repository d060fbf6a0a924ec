"""The thread pools behind the routes: the read routes that build their answer per request (the timeline, the
metrics) run on :func:`reads`, everything that can take long (holder searches, ``/memx/free`` receipts, hand-off
calls to peers) on :func:`work`, never on asyncio's default executor, so a read never queues behind a search, a
receipt or a hung peer.  (``GET /memx/models`` answers from the event loop: ``surface.answers``.)

Both are created on first use and live for the process (daemon threads; a reset of the process state shuts them
down without waiting, they hold nothing).
"""

import concurrent.futures
import threading

from comfy_memx.core.state import STATE

READ_THREADS = 4
WORK_THREADS = 4


class Executors:
    """The routes' thread pools by name, made on first use (a part of the process state); a reset shuts them down
    without waiting (what they already run finishes)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pools = {}

    def pool(self, name, threads):
        """The pool ``name`` (``threads`` workers the first time it is asked for)."""
        with self._lock:
            pool = self._pools.get(name)
            if pool is None:
                pool = self._pools[name] = concurrent.futures.ThreadPoolExecutor(
                    threads, thread_name_prefix=f"comfy_memx-{name}")
            return pool

    def close(self):
        """Shut every pool down, without waiting."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.shutdown(wait=False)


def reads():
    """The executor of the read routes."""
    return STATE.part(Executors).pool("reads", READ_THREADS)


def work():
    """The executor of searches, receipts and hand-off calls."""
    return STATE.part(Executors).pool("work", WORK_THREADS)
