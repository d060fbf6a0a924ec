"""Bounded work behind the routes: executors of their own, one holder search at a time, a CPU budget per minute.

* **Executors.**  The read routes (``GET /memx/models``, the metrics) run on :data:`READS`, everything that can take
  long (holder searches, ``/memx/free`` receipts, hand-off calls to peers) on :data:`WORK`, never on asyncio's
  default executor, so a read never queues behind a search, a receipt or a hung peer.  Both are created on first use
  and live for the process (daemon threads; a reset of the process state leaves them, they hold nothing).
* **One search at a time.**  :meth:`SearchGate.search` runs ``leaks.watch.search_now`` under one process-wide lock;
  a caller waits at most ``wait_s`` for it (HTTP: :data:`QUEUE_S`), then gets :class:`Busy` with the seconds to wait
  (the route answers 429 with ``Retry-After``).  At most :data:`MAX_WAITING` callers wait; the next is refused at
  once.
* **CPU budget.**  The thread CPU seconds of every gated search are added up over a sliding minute; once they reach
  ``COMFY_MEMX_SEARCH_CPU`` a search is refused (:class:`Busy` with the seconds until the oldest expires), and a search
  never gets more time than the budget has left (``search_now``'s ``budget_s``).

Lock rule: :attr:`SearchGate.lock` is taken only by HTTP-driven searches (never by a callback) and held across the
search; the small ``_books`` lock is held for list arithmetic only.
"""

import collections
import concurrent.futures
import math
import threading
import time

from comfy_memx.core.state import STATE

QUEUE_S = 2.0        # how long an HTTP search waits for the one before it
MAX_WAITING = 4      # searches waiting at once; one more is refused at once
WINDOW_S = 60.0      # the CPU budget's window
MIN_SEARCH_S = 0.05  # a search with less budget left than this is refused instead of run uselessly short
READ_THREADS = 4
WORK_THREADS = 4

_pools = {}
_pools_lock = threading.Lock()


def _pool(name, threads):
    with _pools_lock:
        pool = _pools.get(name)
        if pool is None:
            pool = _pools[name] = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix=f"comfy_memx-{name}")
        return pool


def reads():
    """The executor of the read routes."""
    return _pool("reads", READ_THREADS)


def work():
    """The executor of searches, receipts and hand-off calls."""
    return _pool("work", WORK_THREADS)


class Busy(Exception):
    """A gated search cannot run now; ``retry_after`` is the whole seconds to wait, ``why`` says what is spent."""

    def __init__(self, why, retry_after):
        super().__init__(why)
        self.why = why
        self.retry_after = max(1, int(math.ceil(retry_after)))


class SearchGate:
    """The single flight and CPU budget of on-demand holder searches (a part of the process state)."""

    def __init__(self):
        self.lock = threading.Lock()
        self._books = threading.Lock()
        self._spent = collections.deque()   # (monotonic end, cpu seconds) of the searches of the last window
        self._waiting = 0
        self._running_since = None
        self.counters = collections.Counter()  # searches, refused_busy, refused_budget, cpu_seconds

    def cpu_left(self, now=None):
        """CPU seconds the budget has left in the current window."""
        now = time.monotonic() if now is None else now
        with self._books:
            self._expire(now)
            return STATE.config.search_cpu - sum(cpu for _, cpu in self._spent)

    def _expire(self, now):
        while self._spent and self._spent[0][0] <= now - WINDOW_S:
            self._spent.popleft()

    def _budget_wait(self, now):
        """Seconds until enough of the window's CPU expires for a search to start."""
        with self._books:
            self._expire(now)
            left = STATE.config.search_cpu - sum(cpu for _, cpu in self._spent)
            wait = 0.0
            for end, cpu in self._spent:  # oldest first
                if left >= MIN_SEARCH_S:
                    break
                left += cpu
                wait = end + WINDOW_S - now
            return max(wait, 0.0) if left >= MIN_SEARCH_S else WINDOW_S

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
                with self._books:
                    self._spent.append((time.monotonic(), cpu))
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
