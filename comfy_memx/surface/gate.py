"""Bounded work behind the routes: executors of their own, one holder search at a time, a CPU budget per minute.

* **Executors.**  The read routes (``GET /memx/models``, the metrics) run on :data:`READS`, everything that can take
  long (holder searches, ``/memx/free`` receipts, hand-off calls to peers) on :data:`WORK`, never on asyncio's
  default executor, so a read never queues behind a search, a receipt or a hung peer.  Both are created on first use
  and live for the process (daemon threads; a reset of the process state leaves them, they hold nothing).
* **One search at a time.**  :meth:`SearchGate.search` runs ``leaks.watch.search_now`` under one process-wide lock;
  a caller waits at most ``wait_s`` for it (HTTP: :data:`QUEUE_S`), then gets :class:`Busy` with the seconds to wait
  (the route answers 429 with ``Retry-After``).  At most :data:`MAX_WAITING` callers wait; the next is refused at
  once.
* **CPU budget.**  The thread CPU seconds of every gated search are taken from a bucket refilled at
  ``COMFY_MEMX_SEARCH_CPU`` per minute that holds at most one search's worth; an empty bucket refuses a search
  (:class:`Busy` with the seconds until it holds enough), and a search never gets more time than the bucket holds
  (``search_now``'s ``budget_s``).

Lock rule: :attr:`SearchGate.lock` is taken only by HTTP-driven searches (never by a callback) and held across the
search; the small ``_books`` lock is held for list arithmetic only.
"""

import collections
import concurrent.futures
import math
import threading
import time

from comfy_memx.core.errors import MemxError
from comfy_memx.core.state import STATE

QUEUE_S = 2.0        # how long an HTTP search waits for the one before it
MAX_WAITING = 4      # searches waiting at once; one more is refused at once
WINDOW_S = 60.0      # the CPU budget's window
MIN_SEARCH_S = 0.05  # a search with less budget left than this is refused instead of run uselessly short
READ_THREADS = 4
WORK_THREADS = 4

class Executors:
    """The surface's thread pools by name, made on first use (a part of the process state); a reset shuts them down
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


class Busy(MemxError):
    """A gated search cannot run now; ``retry_after`` is the whole seconds to wait, ``why`` says what is spent."""

    def __init__(self, why, retry_after):
        super().__init__(why)
        self.why = why
        self.retry_after = max(1, int(math.ceil(retry_after)))


class SearchGate:
    """The single flight and CPU budget of on-demand holder searches (a part of the process state).

    The budget is a bucket of CPU seconds refilled at ``COMFY_MEMX_SEARCH_CPU / 60`` per second and holding at most
    one search's worth (``COMFY_MEMX_LEAK_BUDGET``, at least :data:`MIN_SEARCH_S`): searches never take more than
    that share of a core, averaged over any stretch of time, and never come in a burst longer than one search.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self._books = threading.Lock()
        self._tokens = None                 # CPU seconds available now (None: full, set on first use)
        self._filled = time.monotonic()
        self._waiting = 0
        self._running_since = None
        self.counters = collections.Counter()  # searches, refused_busy, refused_budget, cpu_seconds

    @staticmethod
    def _rate():
        return float(STATE.config.search_cpu) / WINDOW_S

    @staticmethod
    def _capacity():
        return max(MIN_SEARCH_S, min(float(STATE.config.leak_budget), float(STATE.config.search_cpu)))

    def cpu_left(self, now=None):
        """CPU seconds the budget holds now (at most one search's worth)."""
        now = time.monotonic() if now is None else now
        with self._books:
            if self._tokens is None:
                self._tokens = self._capacity()
            self._tokens = min(self._capacity(), self._tokens + (now - self._filled) * self._rate())
            self._filled = now
            return self._tokens

    def _spend(self, cpu):
        self.cpu_left()
        with self._books:
            self._tokens -= cpu

    def _budget_wait(self, now):
        """Seconds until the bucket holds enough for a search to start."""
        missing = MIN_SEARCH_S - self.cpu_left(now)
        return max(0.0, missing) / self._rate()

    def refuse_early(self):
        """Raise :class:`Busy` at once when a search could not start now anyway (the budget is empty, or as many
        callers wait as may); cheap enough for the event loop, so a refused request costs no executor hop."""
        now = time.monotonic()
        if self.cpu_left(now) < MIN_SEARCH_S:
            self.counters["refused_budget"] += 1
            raise Busy("cpu_budget", self._budget_wait(now))
        if self._waiting >= MAX_WAITING:
            self.counters["refused_busy"] += 1
            raise Busy("busy", self._retry_busy())

    def search(self, record, ignore=(), wait_s=QUEUE_S):
        """Run ``leaks.watch.search_now(record, ignore, budget_s)`` when the lock and the CPU budget allow; raises
        :class:`Busy` otherwise.  Blocking: call it on :func:`work`."""
        from comfy_memx.leaks import watch as leakwatch
        now = time.monotonic()
        if self.cpu_left(now) < MIN_SEARCH_S:
            self.counters["refused_budget"] += 1
            raise Busy("cpu_budget", self._budget_wait(now))
        with self._books:
            if self._waiting >= MAX_WAITING:
                self.counters["refused_busy"] += 1
                raise Busy("busy", self._retry_busy())
            self._waiting += 1
        try:
            if not self.lock.acquire(timeout=max(0.0, wait_s)):
                self.counters["refused_busy"] += 1
                raise Busy("busy", self._retry_busy())
        finally:
            with self._books:
                self._waiting -= 1
        try:
            left = self.cpu_left()
            if left < MIN_SEARCH_S:
                self.counters["refused_budget"] += 1
                raise Busy("cpu_budget", self._budget_wait(time.monotonic()))
            budget = min(float(STATE.config.leak_budget), left)
            self._running_since = time.monotonic()
            cpu_before = time.thread_time()
            try:
                return leakwatch.search_now(record, ignore=ignore, budget_s=budget)
            finally:
                cpu = time.thread_time() - cpu_before
                self._spend(cpu)
                self.counters["searches"] += 1
                self.counters["cpu_seconds"] += cpu
                self._running_since = None
        finally:
            self.lock.release()

    def _retry_busy(self):
        since = self._running_since
        elapsed = time.monotonic() - since if since is not None else 0.0
        return max(1.0, float(STATE.config.leak_budget) - elapsed)


def gate():
    """This process's :class:`SearchGate`."""
    return STATE.part(SearchGate)
