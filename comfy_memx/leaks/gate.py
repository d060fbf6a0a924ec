"""Bounded holder searches that nobody's prompt pays for: one at a time, within a CPU budget per minute.

Every holder search that runs outside a prompt's own ``COMFY_MEMX_LEAK_BUDGET`` allowance goes through this gate:
the search route, a ``/memx/free`` receipt's survivors, the never-warned check that a free, an idle unload or a
hand-off runs after its collection (``leaks.unwarned``), a release's search of a survivor's next holder and the
``auto`` policy's searches before it tries a model again (``leaks.release``).  So whatever a caller without the
token makes the server do (a loop of ``/memx/free``, say) costs at most ``COMFY_MEMX_SEARCH_CPU`` CPU seconds of
searching per minute, counted by the gate's own books.

* **One search at a time.**  :meth:`SearchGate.run` runs its work (a holder search:
  ``leaks.watch.gated_search``) under one process-wide lock; a caller waits at
  most ``wait_s`` for it (HTTP: :data:`QUEUE_S`), then gets :class:`Busy` with the seconds to wait (the routes
  answer 429 with ``Retry-After``).  At most :data:`MAX_WAITING` callers wait; the next is refused at once.
* **CPU budget.**  The thread CPU seconds of every gated search are taken from a bucket refilled at
  ``COMFY_MEMX_SEARCH_CPU`` per minute that holds at most one search's worth; an empty bucket refuses a search
  (:class:`Busy` with the seconds until it holds enough), and a search never gets more time than the bucket holds
  (the ``budget_s`` handed to the work).
* **Executors.**  A gated search a route asks for runs on the routes' work executor (``routekit.executors.work()``),
  never on the event loop; the others run where their caller runs (a receipt's thread, the prompt worker between
  prompts), waiting at most the ``wait_s`` they pass.

Lock rule: :attr:`SearchGate.lock` is taken only by these searches (never by a callback) and held across the
search; the small ``_books`` lock is held for arithmetic only.
"""

import collections
import math
import threading
import time
import weakref

from comfy_memx.core.errors import MemxError
from comfy_memx.core.state import STATE

QUEUE_S = 2.0        # how long an HTTP search waits for the one before it
MAX_WAITING = 4      # searches waiting at once; one more is refused at once
WINDOW_S = 60.0      # the CPU budget's window
MIN_SEARCH_S = 0.05  # a search with less budget left than this is refused instead of run uselessly short


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
        self._last = weakref.WeakKeyDictionary()   # ledger record -> its last gated search (dies with the record)

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

    def remember(self, record, found):
        """Keep what a gated search of ``record``'s model found (``leaks.watch.gated_search``), for
        :meth:`last_search`; dies with the record."""
        self._last[record] = {"holder": found.get("holder"), "result": (found.get("search") or {}).get("result"),
                              "time": time.time()}

    def run(self, work, wait_s=QUEUE_S):
        """Call ``work(budget_s)`` (a holder search that keeps within ``budget_s`` CPU seconds) when the lock and the
        CPU budget allow, and charge the CPU seconds this thread spent in it to the budget; returns what ``work``
        returned.  Raises :class:`Busy` when it cannot run within ``wait_s`` seconds or the budget is spent."""
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
                return work(budget)
            finally:
                cpu = time.thread_time() - cpu_before
                self._spend(cpu)
                self.counters["searches"] += 1
                self.counters["cpu_seconds"] += cpu
                self._running_since = None
        finally:
            self.lock.release()

    def charge(self, cpu):
        """Count ``cpu`` seconds of a search that ran outside :meth:`run` and outside any prompt (a leak ComfyUI
        warned about during a free, searched where ComfyUI's collection needs it) against the budget."""
        self._spend(cpu)
        self.counters["searches"] += 1
        self.counters["cpu_seconds"] += cpu

    def last_search(self, record):
        """What the last gated search of ``record``'s model found: ``{"holder", "result", "time"}``, or None when
        none ran (the panel names this holder on a model that is not a known leak, say a survivor of a free)."""
        return self._last.get(record)

    def _retry_busy(self):
        since = self._running_since
        elapsed = time.monotonic() - since if since is not None else 0.0
        return max(1.0, float(STATE.config.leak_budget) - elapsed)


def gate():
    """This process's :class:`SearchGate`."""
    return STATE.part(SearchGate)
