"""comfy_memx.leaks.release.desk without a server: where and when a release job runs.

The prompt worker is a thread of the test that waits on a queue's condition as ComfyUI's ``prompt_worker`` does
(``q.get(timeout)``, then ``get_flags``: its point between prompts), so every step below is deterministic."""

import threading

from comfy_memx.leaks.release import desk


class Queue:
    """ComfyUI's PromptQueue as far as waking its worker goes."""

    def __init__(self):
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)


class Worker:
    """ComfyUI's prompt worker: waits on the queue's condition, then reaches its point between prompts."""

    def __init__(self, queue):
        self.queue, self.stop, self.points = queue, False, 0
        self.thread = threading.Thread(target=self.loop, name="prompt_worker", daemon=True)
        self.seen = threading.Event()

    def loop(self):
        while not self.stop:
            desk.run_due(self.queue)    # what the flags_reading subscriber does
            self.points += 1
            self.seen.set()
            with self.queue.not_empty:
                self.queue.not_empty.wait(30)

    def start(self):
        self.thread.start()
        assert self.seen.wait(10)
        return self

    def close(self):
        self.stop = True
        with self.queue.mutex:
            self.queue.not_empty.notify()
        self.thread.join(10)


def recorder():
    ran = []

    def work():
        ran.append(threading.current_thread().name)
        return {"outcome": "released"}
    return ran, work


def test_without_a_worker_a_job_runs_inline_when_no_prompt_runs():
    ran, work = recorder()
    job = desk.submit(work, "http")
    assert job.done and job.state == desk.DONE and job.result == {"outcome": "released"}
    assert ran == [threading.current_thread().name] and desk.queued() == 0


def test_without_a_worker_a_job_waits_for_the_running_prompt_to_end():
    ran, work = recorder()
    desk.prompt_started()
    job = desk.submit(work, "auto")
    assert not job.done and ran == [] and desk.queued() == 1
    assert desk.run_if_idle(job) is False          # a prompt runs: not here either
    desk.prompt_ended()
    assert job.done and ran == [threading.current_thread().name]


def test_with_a_worker_a_job_is_queued_woken_and_run_on_the_worker_between_prompts():
    worker = Worker(Queue()).start()
    try:
        assert desk.worker_seen()
        ran, work = recorder()
        job = desk.submit(work, "http")             # from another thread: the worker is nudged
        assert job.wait(10) and ran == ["prompt_worker"]
        assert desk.run_if_idle(job) is False
    finally:
        worker.close()
    assert not desk.worker_seen()                   # its thread ended: none is seen any more


def test_a_withdrawn_job_never_runs_and_a_running_one_cannot_be_withdrawn():
    queue = Queue()
    worker = Worker(queue).start()
    try:
        gate, entered = threading.Event(), threading.Event()

        def slow():
            entered.set()
            assert gate.wait(10)
            return "slow"
        with queue.mutex:                           # hold the worker off until both are queued
            running = desk.submit(slow, "http")
            ran, work = recorder()
            later = desk.submit(work, "http")
        assert entered.wait(10)                     # the worker took both and runs the first
        assert desk.withdraw(running) is False and desk.withdraw(later) is False
        gate.set()
        assert later.wait(10) and ran == ["prompt_worker"]
    finally:
        worker.close()
    ran, work = recorder()
    desk.prompt_started()                           # no worker now, and a prompt runs: the job waits
    job = desk.submit(work, "http")
    assert desk.withdraw(job) is True and job.done and job.state == desk.WITHDRAWN
    desk.prompt_ended()
    assert ran == [] and job.result is None


def test_a_key_is_queued_once_and_releasing_here_holds_the_auto_policy_back():
    desk.prompt_started()
    first = desk.submit(lambda: 1, "auto", key="M#1")
    assert desk.submit(lambda: 2, "auto", key="M#1") is first and desk.queued() == 1
    assert not desk.auto_held()
    with desk.releasing_here():
        assert desk.auto_held()
        holder = []
        thread = threading.Thread(target=lambda: holder.append(desk.auto_held()))
        thread.start()
        thread.join()
        assert holder == [False]                    # on this thread only
    assert not desk.auto_held()
    desk.prompt_ended()
    assert first.result == 1


class PausingWorker(Worker):
    """A worker that waits as long as ComfyUI's (1000 s, here 600) and can be held between its point between prompts
    and its wait (where ComfyUI runs its collection after a free): a wake-up sent then finds nobody waiting."""

    def __init__(self, queue):
        super().__init__(queue)
        self.hold, self.held, self.go = False, threading.Event(), threading.Event()

    def loop(self):
        while not self.stop:
            desk.run_due(self.queue)
            self.points += 1
            self.seen.set()
            if self.hold:
                self.hold = False
                self.held.set()
                self.go.wait(10)
            with self.queue.not_empty:
                if not self.stop:
                    self.queue.not_empty.wait(600)


def test_a_job_submitted_while_the_worker_runs_another_runs_in_the_same_pass():
    worker = PausingWorker(Queue()).start()
    try:
        ran, later_work = recorder()
        later = []

        def first_work():   # another thread submits while the worker is busy here: its wake-up is lost
            submitter = threading.Thread(target=lambda: later.append(desk.submit(later_work, "auto")))
            submitter.start()
            submitter.join(10)
            return {"outcome": "released"}
        first = desk.submit(first_work, "http")
        assert first.wait(10)
        assert later and later[0].wait(10) and ran == ["prompt_worker"]
    finally:
        worker.close()


def test_a_wake_up_that_finds_the_worker_not_waiting_is_sent_again():
    worker = PausingWorker(Queue())
    worker.hold = True
    worker.start()
    try:
        assert worker.held.wait(10)
        ran, work = recorder()
        job = desk.submit(work, "auto")   # the worker is past its point and not yet waiting: this wake-up is lost
        worker.go.set()
        assert job.wait(10) and ran == ["prompt_worker"] and desk.queued() == 0
    finally:
        worker.close()
