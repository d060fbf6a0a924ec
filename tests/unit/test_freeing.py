"""comfy_memx.surface.freeing without a server: which worker run serves a request, withdrawal, and the receipt.

The worker side is driven step by step, as ComfyUI's prompt worker runs it after each prompt (``get_flags``, then
``unload_all_models`` for ``unload_models``, ``PromptExecutor.reset`` for ``free_memory``, then ``gc.collect``), so
every interleaving below is deterministic.
"""

import gc
import queue as queue_module
import sys
import threading
import types
import weakref

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.ledger import subscriptions as ledger_subscriptions  # noqa: F401  (the unload scope's reason)
from comfy_memx.surface import freeing
from comfy_memx.surface import subscriptions  # noqa: F401  (the desk follows the worker through its signals)

HELD = []


class Model:
    """Stands in for a torch module (the ledger only needs a weakref-able object with a class name)."""


class Queue:
    """ComfyUI's PromptQueue as far as flags go (0.3.64, 0.27.0 and 0.33.0 agree on this part)."""

    def __init__(self):
        self.mutex = threading.RLock()
        self.not_empty = threading.Condition(self.mutex)
        self.flags = {}
        self.queue = []
        self.currently_running = {}

    def set_flag(self, name, data):
        with self.mutex:
            freeing.flag_set(self, name)  # what the set_flag wrapper does
            self.flags[name] = data
            self.not_empty.notify()

    def _get_flags(self, reset=True):
        with self.mutex:
            if reset:
                ret = self.flags
                self.flags = {}
                return ret
            return self.flags.copy()

    def get_flags(self, reset=True):
        with self.mutex:   # what the get_flags wrapper does, with the surface's subscriber
            flags = self._get_flags(reset)
            freeing.flags_served(self, flags, reset)
        return flags

    def get(self, timeout=None):
        with self.not_empty:
            while not self.queue:
                self.not_empty.wait(timeout=timeout)
                if timeout is not None and not self.queue:
                    return None
            return self.queue.pop(0)


class Worker:
    """ComfyUI's prompt worker, one step at a time on one thread of its own (a run belongs to its thread)."""

    def __init__(self, queue):
        self.queue = queue
        self.read = None
        self._steps = queue_module.Queue()
        self._done = queue_module.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="prompt_worker")
        self.thread.start()

    def _serve(self):
        while True:
            steps = self._steps.get()
            for step in steps:
                step()
            self._done.put(True)

    def on_thread(self, *steps):
        self._steps.put(steps)
        assert self._done.get(timeout=10)

    def read_flags(self):
        self.read = self.queue.get_flags()

    def unload(self):
        if self.read.get("unload_models", self.read.get("free_memory", False)):
            self.prompt_worker()

    @staticmethod
    def prompt_worker():
        """ComfyUI's worker (by its name: its ``unload_all_models`` serves free flags) running ``unload_all_models``,
        whose ``free_memory`` keeps the outer scope's reason."""
        mm = types.SimpleNamespace()
        outer = signals.unload_scope.before(mm, "unload_all_models", sys._getframe())
        inner = signals.unload_scope.before(mm, "free_memory", sys._getframe())
        signals.unload_scope.after(inner, mm, "free_memory")
        signals.unload_scope.after(outer, mm, "unload_all_models")

    def reset(self):
        if self.read.get("free_memory"):
            freeing.reset_ended()

    def turn(self, *between):
        """One worker turn after a prompt: read the flags, act on them, collect garbage."""
        self.on_thread(self.read_flags, *between, self.unload, self.reset, gc.collect)


def observing(monkeypatch):
    from comfy_memx.core import registry
    monkeypatch.setattr(registry, "is_patched", lambda name, site: True)


def test_a_request_is_served_by_the_run_that_reads_its_flags(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    worker = Worker(queue)
    ticket = freeing.submit(queue, unload_models=True, free_memory=True)
    woken = []
    ticket.add_done_callback(lambda: woken.append(threading.get_ident()))
    try:
        assert queue.flags == {"unload_models": True, "free_memory": True} and ticket.state == "waiting"
        states = []
        worker.on_thread(worker.read_flags, lambda: states.append(ticket.state), worker.unload,
                         lambda: states.append(ticket.state), worker.reset, lambda: states.append(ticket.state),
                         lambda: gc.collect(1), lambda: states.append(ticket.state))
        assert states == ["unloading", "resetting", "collecting", "collecting"] and not ticket.done
        gc.collect()                                   # a full collection, but not on the worker's thread
        assert not ticket.done
        worker.on_thread(gc.collect)
        assert ticket.done and ticket.state == "done"
        assert ticket.run.thread_id == worker.thread.ident and woken == [worker.thread.ident]
        assert queue.flags == {}
    finally:
        freeing.end(ticket)
    assert freeing._on_gc not in gc.callbacks


def test_a_run_that_read_the_flags_just_before_the_request_is_not_its_own(monkeypatch):
    """Another client's /free is read by the worker; our request arrives while that run unloads: it must wait for
    the next run, and its flags must still be set for it."""
    observing(monkeypatch)
    queue = Queue()
    worker = Worker(queue)
    queue.set_flag("unload_models", True)            # ComfyUI's own POST /free from another client
    tickets = []
    worker.turn(lambda: tickets.append(freeing.submit(queue, unload_models=False, free_memory=True)))
    ticket = tickets[0]
    try:
        assert not ticket.done and ticket.state == "waiting" and queue.flags == {"free_memory": True}
        worker.turn()
        assert ticket.done and ticket.run.free_memory and queue.flags == {}
    finally:
        freeing.end(ticket)


def test_a_request_that_times_out_withdraws_only_its_own_flags(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    mine = freeing.submit(queue, unload_models=True, free_memory=True)
    other = freeing.submit(queue, unload_models=True, free_memory=False)
    queue.set_flag("free_memory", True)               # another client's /free while ours wait
    freeing.end(mine)
    assert mine.withdrawn and mine.state == "withdrawn"
    assert queue.flags == {"unload_models": True, "free_memory": True}  # still wanted by `other` and the client
    freeing.end(other)
    assert queue.flags == {"free_memory": True}       # the client's flag stays, ours is gone
    lonely = freeing.submit(queue, unload_models=True, free_memory=False)
    freeing.end(lonely)
    assert queue.flags == {"free_memory": True} and not freeing.waiting()


def test_a_flag_that_was_already_set_before_the_request_is_never_withdrawn(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    queue.set_flag("unload_models", True)
    ticket = freeing.submit(queue, unload_models=True, free_memory=False)
    freeing.end(ticket)
    assert queue.flags == {"unload_models": True}


def test_two_requests_at_once_share_the_run_that_reads_both(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    worker = Worker(queue)
    first = freeing.submit(queue, unload_models=True, free_memory=False)
    second = freeing.submit(queue, unload_models=True, free_memory=True)
    try:
        worker.turn()
        assert first.done and second.done and first.run is second.run
        assert first.run.unload_models and first.run.free_memory
    finally:
        freeing.end(first)
        freeing.end(second)


def test_a_request_made_while_a_prompt_runs_is_served_after_it(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    worker = Worker(queue)
    queue.currently_running[0] = ("prompt",)
    ticket = freeing.submit(queue)
    try:
        assert freeing.prompt_running(queue) and ticket.state == "waiting"
        queue.currently_running.clear()               # the prompt finishes; the worker reads the flags next
        worker.turn()
        assert ticket.done
    finally:
        freeing.end(ticket)


def test_nudge_wakes_a_worker_waiting_on_the_queue_without_setting_flags_again(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    ticket = freeing.submit(queue)
    queue.flags.clear()                               # as if the wake-up of set_flag was missed and flags read
    got = []
    waiter = threading.Thread(target=lambda: got.append(queue.get(timeout=30)))
    waiter.start()
    try:
        for _ in range(200):
            assert freeing.nudge(ticket)
            waiter.join(0.05)
            if not waiter.is_alive():
                break
        assert not waiter.is_alive() and got == [None] and queue.flags == {}
    finally:
        freeing.end(ticket)
    assert freeing.nudge(ticket) is False


def test_the_gc_hook_never_waits_for_the_desks_lock(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    worker = Worker(queue)
    ticket = freeing.submit(queue)
    desk = STATE.part(freeing.FreeDesk)
    try:
        worker.on_thread(worker.read_flags, worker.unload, worker.reset)
        with desk.lock:                               # e.g. another request registering right now
            worker.on_thread(gc.collect)              # the worker's collection ends the run regardless
        assert ticket.done
    finally:
        freeing.end(ticket)


def test_unloads_of_the_run_are_collected_from_the_event_stream(monkeypatch):
    observing(monkeypatch)
    queue = Queue()
    worker = Worker(queue)
    ticket = freeing.submit(queue)
    try:
        STATE.events.emit("unload", model="M", model_id="M#9", reason="free_request", bytes=5, device="cpu")

        def prompt_worker():   # ComfyUI's worker, by its name: its unload_all_models serves free flags
            mm = types.SimpleNamespace()
            scope = signals.unload_scope.before(mm, "unload_all_models", sys._getframe())
            STATE.events.emit("unload", model="M", model_id="M#1", reason="free_request", bytes=7, device="cuda:0")
            STATE.events.emit("unload", model="M", model_id="M#2", reason="other", bytes=3, device="cuda:0")
            signals.unload_scope.after(scope, mm, "unload_all_models")

        def unload_with_events():
            prompt_worker()
        worker.on_thread(worker.read_flags, unload_with_events, worker.reset, gc.collect)
        assert ticket.done
        assert ticket.run.unloads == [{"model": "M", "model_id": "M#1", "bytes": 7, "device": "cuda:0"}]
    finally:
        freeing.end(ticket)
    assert not STATE.events.wanted


def test_receipt_names_released_and_leaked_models_and_bounds_the_searches(monkeypatch):
    observing(monkeypatch)
    gone, kept_a, kept_b = Model(), Model(), Model()
    for model in (gone, kept_a, kept_b):
        STATE.ledger.record_for(model).model_bytes = 100
    HELD.extend([kept_a, kept_b])
    for model in (kept_a, kept_b):
        STATE.ledger.find(model).leak = {"stage": "rooted", "prompt_id": None, "time": 0.0, "last_prompt": None,
                                         "last_seen": 0.0, "sightings": 1, "searches": 0, "referrers": [],
                                         "search": None, "next_check": 1, "refs": None}
    gone_id = STATE.ledger.find(gone).model_id
    refs = [weakref.ref(m) for m in (kept_a, kept_b)]
    del model, kept_a, kept_b
    from comfy_memx.leaks import gate
    real_spend = gate.SearchGate._spend

    spent = []

    def spend_all(searches, cpu):      # the probes of both (one gated pass), then the first full search empties it
        real_spend(searches, cpu)
        spent.append(cpu)
        if len(spent) >= 2:
            searches._tokens = 0.0
    monkeypatch.setattr(gate.SearchGate, "_spend", spend_all)
    queue = Queue()
    worker = Worker(queue)
    ticket = freeing.submit(queue)
    try:
        del gone
        worker.turn()
        receipt = freeing.receipt(ticket, model_management=None)
    finally:
        freeing.end(ticket)
    assert receipt["status"] == "done" and receipt["still_loaded"] == []
    assert receipt["run"] == {"unload_models": True, "free_memory": True, "requests": 1}
    assert [(f["model_id"], f["released"], f["unloaded_bytes"]) for f in receipt["freed"]] == [(gone_id, True, 0)]
    assert receipt["released_bytes"] == 100
    first, second = receipt["survivors"]
    assert first["reason"] == second["reason"] == "leaked" and receipt["survivor_bytes"] == 200
    paths = [(c["path"], c["root_kind"]) for c in first["holders"]]
    assert paths in ([("test_freeing.HELD[0]", "module_global")], [("test_freeing.HELD[1]", "module_global")])
    assert first["search"]["reason"] == "requested" and first["leak"]["searches"] == 1
    assert len(spent) == 2   # test_freeing is no custom-node package: the probes reached neither, one full search ran
    assert second["holders"] is None and second["search"]["note"] == "not searched: cpu budget"
    assert "refs" not in first["leak"] and "next_check" not in first["leak"]  # internal fields stay inside
    HELD.clear()
    assert all(ref() is None for ref in refs)          # the receipt and the search kept nothing
