"""When and where a release runs: on ComfyUI's prompt worker, between prompts, where ComfyUI's own ``/free`` runs.

A release cuts a pack's cache entry and collects garbage.  Run while a prompt runs, it can cut the entry that a
running node is about to use (a slow node holding a model the pack has just given it: the cut leaves the model
alive in the node and the pack without its entry).  So no release runs inside a prompt: every release (the route,
``/memx/free`` with ``release``, ``free --release``, the ``auto`` policy) is a :class:`Job` put on this desk, and
ComfyUI's prompt worker runs the jobs at its next point between prompts, with no node executing.

* **The point.**  ComfyUI's ``prompt_worker`` calls ``PromptQueue.get_flags()`` after every prompt and whenever it
  is woken (0.3.64, 0.27.0, 0.33.0 ``main.py``).  The ``get_flags`` wrapper fires ``flags_reading`` before it takes
  the queue's mutex; :func:`run_due` (the leak wing's subscriber) runs every queued job there, outside that mutex,
  on the worker's thread, and notes the worker (:func:`worker_seen`).
* **Waking the worker.**  An idle worker waits on the queue's condition (up to 1000 s); :func:`nudge` wakes it as
  the free desk does (``surface.freeing.nudge``), so a job submitted between prompts runs at once, and one
  submitted during a prompt runs right after it.  A wake-up sent while the worker is not waiting (it runs the
  desk's earlier jobs, or ComfyUI's collection after a free) is lost, so :func:`run_due` runs the list until it is
  empty, and a submit from another thread wakes the worker again while its job is still queued, at
  :data:`WAKE_AGAIN_S` (one timer thread at a time, stopping once the desk is empty or the worker is gone).
* **Who waits.**  A release someone asked for (``ask``) waits for its job, bounded by the caller's ``timeout``;
  when the time is up the job is withdrawn (:func:`withdraw`: nothing is cut later) unless the worker has already
  started it, and the caller answers 409 with ``Retry-After``.  ``auto`` jobs are queued and nobody waits.
* **No worker.**  A process that embeds ComfyUI without its prompt worker never calls ``get_flags``: while no worker
  was seen, a job runs inline on the submitting thread when no prompt runs (:func:`run_if_idle`), and otherwise at
  the end of the running prompt (``prompt_ended``, :func:`prompt_ended`).

Lock rule: :attr:`ReleaseDesk.lock` guards the job list only, is held for list operations, and no callback takes
it.  A job holds what its work holds (a ledger record, names and numbers), never a model.
"""

import contextlib
import threading
import weakref

from comfy_memx.core import callbacks
from comfy_memx.core.comfyui import running_prompt_ids
from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE

QUEUED, RUNNING, DONE, WITHDRAWN = "queued", "running", "done", "withdrawn"
#: seconds after a submit at which the worker is woken again while jobs are still queued (a busy worker reaches its
#: point between prompts after its prompt anyway; these cover an idle one that missed the first wake-up)
WAKE_AGAIN_S = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
MAX_ROUNDS = 16   # how many times run_due takes the list again when jobs arrived while it ran the last ones


class Job(callbacks.Completion):
    """One release job: ``work()`` run once between prompts; its ``result`` (a receipt, or a list of them).  It is
    :attr:`done` once it ran or was withdrawn."""

    def __init__(self, work, trigger, key=None):
        super().__init__("release-job callback")
        self.work = work
        self.trigger = trigger          # "http", "free" or "auto": who asked
        self.key = key                  # jobs of one key are queued once (auto: the model_id)
        self.state = QUEUED
        self.result = None

    def _finish(self, state):
        self.state = state
        self.complete()


class ReleaseDesk:
    """The queued release jobs of this process and the prompt worker that runs them (a part of the process state)."""

    def __init__(self):
        self.lock = threading.Lock()    # the job list only; no callback takes it
        self.jobs = []
        self.worker = None              # weakref to the thread seen at the worker's point between prompts
        self.queue = None               # weakref to the PromptQueue it serves (what :func:`nudge` wakes)
        self.prompts = 0                # prompts running now in this process (prompt_started/prompt_ended)
        self.local = threading.local()  # releasing_here()'s depth, per thread
        self.waking = False             # a wake-again timer is pending (one chain at a time)

    def close(self):
        """Withdraw every queued job (reset of the process state)."""
        with self.lock:
            jobs, self.jobs = self.jobs, []
        for job in jobs:
            job._finish(WITHDRAWN)


def desk():
    """This process's :class:`ReleaseDesk`."""
    return STATE.part(ReleaseDesk)


def submit(work, trigger, key=None):
    """Queue ``work()`` to run between prompts and return its :class:`Job`: wakes an idle worker; with no worker seen,
    runs it inline right away when no prompt runs.  A job of ``key`` already queued is returned instead of a
    second one."""
    books = desk()
    with books.lock:
        same = next((job for job in books.jobs if key is not None and job.key == key), None)
        if same is not None:
            return same
        job = Job(work, trigger, key)
        books.jobs.append(job)
    if worker_seen():
        if not _on_worker():
            nudge()
            _wake_again_later(books, 0)
    else:
        run_if_idle(job)
    return job


@contextlib.contextmanager
def releasing_here():
    """Within this block, on this thread, the ``auto`` policy queues nothing: a free that releases its survivors
    itself records their leaks here, and one release of each is enough."""
    local = desk().local
    local.releasing = getattr(local, "releasing", 0) + 1
    try:
        yield
    finally:
        local.releasing -= 1


def auto_held():
    """True inside :func:`releasing_here` on this thread."""
    books = STATE.existing_part(ReleaseDesk)
    return bool(books is not None and getattr(books.local, "releasing", 0))


def withdraw(job):
    """Take ``job`` off the desk if the worker has not started it (nothing of it runs later); returns True when it
    did, False when it is running or done."""
    books = desk()
    with books.lock:
        if job.state != QUEUED or job not in books.jobs:
            return False
        books.jobs.remove(job)
    job._finish(WITHDRAWN)
    return True


def queued():
    """How many release jobs wait for the worker."""
    books = STATE.existing_part(ReleaseDesk)
    return len(books.jobs) if books is not None else 0


def run_due(queue=None):
    """Run every queued job now, in order, on this thread (the prompt worker between prompts: ``flags_reading``,
    the queue's mutex not held); notes this thread as the worker and ``queue`` as what :func:`nudge` wakes."""
    books = desk()
    me = threading.current_thread()
    if queue is not None and (books.worker is None or books.worker() is not me or books.queue() is not queue):
        books.worker, books.queue = weakref.ref(me), weakref.ref(queue)
    for _ in range(MAX_ROUNDS):   # jobs submitted while these ran: their wake-up came while the worker was busy
        if not books.jobs:
            break
        _run(_take(books))


def prompt_started():
    """A prompt began on some thread (counted, so that a process without a worker runs no job inside it)."""
    desk().prompts += 1


def prompt_ended():
    """A prompt ended: without a prompt worker, this is the point between prompts where the queued jobs run."""
    books = desk()
    books.prompts = max(0, books.prompts - 1)
    if not worker_seen() and books.jobs:
        _run(_take(books))


def run_if_idle(job):
    """Run ``job`` now on this thread when no prompt worker was seen and no prompt runs (a process that embeds
    ComfyUI without its worker); returns True when it ran it.  With a worker, the worker runs it."""
    if worker_seen() or prompt_running():
        return False
    books = desk()
    with books.lock:
        if job.state != QUEUED or job not in books.jobs:
            return False
        books.jobs.remove(job)
        job.state = RUNNING
    _run([job])
    return True


def worker_seen():
    """True when ComfyUI's prompt worker has reached its point between prompts in this process and still lives."""
    books = STATE.existing_part(ReleaseDesk)
    thread = books.worker() if books is not None and books.worker is not None else None
    return thread is not None and thread.is_alive()


def prompt_running():
    """True while a prompt runs: ComfyUI's queue has one running, or a prompt started and has not ended."""
    books = STATE.existing_part(ReleaseDesk)
    return bool(running_prompt_ids()) or bool(books is not None and books.prompts)


def nudge():
    """Wake an idle prompt worker so that it reaches its point between prompts (a busy one reaches it after its
    prompt); returns True when there was a worker's queue to wake."""
    books = STATE.existing_part(ReleaseDesk)
    queue = books.queue() if books is not None and books.queue is not None else None
    if queue is None or getattr(queue, "mutex", None) is None or getattr(queue, "not_empty", None) is None:
        return False
    with queue.mutex:
        queue.not_empty.notify()
    return True


def _wake_again_later(books, attempt):
    """Start the timer that wakes the worker again at ``WAKE_AGAIN_S[attempt]`` unless one is pending."""
    with books.lock:
        if attempt == 0 and books.waking:
            return
        books.waking = attempt < len(WAKE_AGAIN_S)
    if not books.waking:
        return
    timer = threading.Timer(WAKE_AGAIN_S[attempt], _wake_again, (books, attempt))
    timer.daemon = True
    timer.name = "comfy_memx-release-wake"
    timer.start()


def _wake_again(books, attempt):
    try:
        if books.jobs and worker_seen() and STATE.existing_part(ReleaseDesk) is books:
            nudge()
            _wake_again_later(books, attempt + 1)
            return
    except Exception as exc:
        internal_error("release desk wake-up", exc)
    with books.lock:
        books.waking = False


def _on_worker():
    books = STATE.existing_part(ReleaseDesk)
    return books is not None and books.worker is not None and books.worker() is threading.current_thread()


def _take(books):
    with books.lock:
        jobs, books.jobs = books.jobs, []
        for job in jobs:
            job.state = RUNNING
    return jobs


def _run(jobs):
    for job in jobs:
        try:
            job.result = job.work()
        except Exception as exc:   # a failed release loses nothing: the caller answers without a receipt
            internal_error(f"release job ({job.trigger})", exc, answered=job.trigger != "auto")
        finally:
            job.work = None
            job._finish(DONE)
