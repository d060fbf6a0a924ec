"""comfy_memx.surface.freeing without a server: the request's states, the hooks' lifetime, flags, and the receipt."""

import gc
import threading
import weakref

from comfy_memx.ledger import accounting
from comfy_memx.surface import freeing
from comfy_memx.core.state import STATE

HELD = []


class Model:
    """Stands in for a torch module (the ledger only needs a weakref-able object with a class name)."""


def on_worker_thread(*steps):
    """Run ``steps`` (callables) in order on one fresh thread, like ComfyUI's prompt worker."""
    thread = threading.Thread(target=lambda: [step() for step in steps])
    thread.start()
    thread.join(10)


def unload_all():
    accounting.push_reason("free_request")
    accounting.push_reason("memory_pressure", keep_outer=True)   # free_memory inside unload_all_models
    accounting.pop_reason()
    assert STATE.free_request_hooks            # still inside the outer scope
    accounting.pop_reason()


def test_a_request_is_done_after_its_unload_and_a_full_collection_on_the_same_thread():
    watch = freeing.begin(unload_models=True, free_memory=True)
    woken = []
    watch.add_done_callback(lambda: woken.append(threading.get_ident()))
    try:
        assert watch.state == "waiting" and not watch.done
        on_worker_thread(unload_all, lambda: gc.collect(1))
        assert watch.state == "collecting" and not watch.done and woken == []
        gc.collect()                                   # a full collection, but on another thread
        assert not watch.done
        on_worker_thread(gc.collect)
        assert watch.done and watch.state == "done" and woken == [watch.thread_id]
        later = []
        watch.add_done_callback(lambda: later.append(1))
        assert later == [1]
    finally:
        freeing.end(watch)
    assert freeing._on_free_phase not in STATE.free_request_hooks and freeing._on_gc not in gc.callbacks


def test_a_run_that_started_before_the_request_is_not_its_own():
    started = threading.Event()
    release = threading.Event()

    def slow_unload():
        accounting.push_reason("free_request")
        started.set()
        release.wait(10)
        accounting.pop_reason()
        gc.collect()

    earlier = freeing.begin()                          # keeps the hooks installed for the early run
    thread = threading.Thread(target=slow_unload)
    thread.start()
    started.wait(10)
    watch = freeing.begin()
    try:
        release.set()
        thread.join(10)
        assert earlier.done and not watch.done and watch.state == "waiting"
        on_worker_thread(unload_all, gc.collect)
        assert watch.done
    finally:
        freeing.end(watch)
        freeing.end(earlier)


def test_unloads_of_the_request_are_collected_from_the_event_stream():
    watch = freeing.begin()
    try:
        STATE.events.emit("unload", model="M", model_id="M#9", reason="free_request", bytes=5, device="cpu")
        on_worker_thread(lambda: accounting.push_reason("free_request"),
                         lambda: STATE.events.emit("unload", model="M", model_id="M#1", reason="free_request",
                                                     bytes=7, device="cuda:0"),
                         lambda: STATE.events.emit("unload", model="M", model_id="M#2", reason="other",
                                                     bytes=3, device="cuda:0"),
                         accounting.pop_reason)
        assert watch.unloads == [{"model": "M", "model_id": "M#1", "bytes": 7, "device": "cuda:0"}]
    finally:
        freeing.end(watch)
    assert not STATE.events.wanted


def test_flags_are_set_again_only_while_the_worker_has_not_started():
    class Queue:
        def __init__(self):
            self.flags = []

        def set_flag(self, name, value):
            self.flags.append((name, value))

    queue = Queue()
    watch = freeing.begin(unload_models=False, free_memory=True)
    try:
        freeing.set_flags(watch, queue)
        assert freeing.nudge(watch, queue) is True
        watch.state = "unloading"
        assert freeing.nudge(watch, queue) is False
    finally:
        freeing.end(watch)
    assert queue.flags == [("free_memory", True), ("free_memory", True)]


def test_receipt_names_released_and_leaked_models_and_bounds_the_searches(monkeypatch):
    gone, kept_a, kept_b = Model(), Model(), Model()
    for model in (gone, kept_a, kept_b):
        record = STATE.ledger.record_for(model)
        record.model_bytes = 100
    HELD.extend([kept_a, kept_b])
    for model in (kept_a, kept_b):
        STATE.ledger.find(model).leak = {"stage": "rooted", "prompt_id": None, "time": 0.0}
    gone_id = STATE.ledger.find(gone).model_id
    refs = [weakref.ref(m) for m in (kept_a, kept_b)]
    del model, kept_a, kept_b
    monkeypatch.setattr(freeing, "MAX_SEARCHED", 1)
    watch = freeing.begin()
    try:
        del gone
        watch._finish()
        receipt = freeing.receipt(watch, model_management=None)
    finally:
        freeing.end(watch)
    assert receipt["status"] == "done" and receipt["still_loaded"] == []
    assert [(f["model_id"], f["released"], f["unloaded_bytes"]) for f in receipt["freed"]] == [(gone_id, True, 0)]
    assert receipt["released_bytes"] == 100
    first, second = receipt["survivors"]
    assert first["reason"] == second["reason"] == "leaked" and receipt["survivor_bytes"] == 200
    assert [(c["path"], c["root_kind"]) for c in first["holders"]] == [("test_freeing.HELD[0]", "module_global")] or \
        [(c["path"], c["root_kind"]) for c in first["holders"]] == [("test_freeing.HELD[1]", "module_global")]
    assert second["holders"] is None and "not searched" in second["search"]["note"]
    HELD.clear()
    assert all(ref() is None for ref in refs)          # the receipt and the search kept nothing
