"""The ledger: one record per torch module, held by weakref only, and safe against collections in its lock."""

import gc
import sys
import threading
import weakref


from comfy_memx.ledger.records import Ledger


class Module:
    pass


class Patcher:
    def __init__(self, model):
        self.model = model


def test_records_are_stable_per_module_and_numbered_per_class():
    ledger = Ledger()
    a, b = Module(), Module()
    ra = ledger.record_for(a)
    assert ledger.record_for(a) is ra
    assert ra.model_id == "Module#1" and ledger.record_for(b).model_id == "Module#2"
    assert ledger.find(Module()) is None and len(ledger) == 2


def test_ledger_never_keeps_a_model_alive():
    ledger = Ledger()
    module = Module()
    patcher = Patcher(module)
    record = ledger.record_for(module)
    record.add_patcher(patcher)
    assert record.live_patchers() == 1 and record.live_patcher() is patcher
    probe = weakref.ref(module)
    del module, patcher
    gc.collect()
    assert probe() is None
    assert len(ledger) == 0 and ledger.records() == [] and not record.alive


def test_a_dead_modules_entry_is_purged_and_its_id_can_be_reused():
    ledger = Ledger()
    module = Module()
    first = ledger.record_for(module)
    del module
    gc.collect()
    assert ledger.records() == [] and ledger._records == {}  # purged on the next read
    again = Module()
    assert ledger.record_for(again) is not first and ledger.record_for(again).model_id == "Module#2"


def _cyclic_module():
    """A module kept alive only by a reference cycle: what ComfyUI's leak warning is about."""
    module = Module()
    module.me = module
    return module


def test_a_collection_inside_the_critical_section_does_not_deadlock():
    """A collection inside ``record_for``'s lock frees a cycle-held module whose weakref callback runs right there,
    on the same thread; the callback must not wait for that lock (ComfyUI's prompt worker would hang).

    The collection is forced at the first line that runs while the lock is held (a line tracer), so the test does
    not depend on which allocation would trigger an automatic collection.
    """
    ledger = Ledger()
    collected_inside = []

    def tracer(frame, event, arg):
        if event == "call":
            return tracer if frame.f_code.co_name == "record_for" else None
        if event == "line" and ledger._lock.locked() and not collected_inside:
            collected_inside.append(gc.collect())
        return tracer

    def scenario():
        doomed = _cyclic_module()
        ledger.record_for(doomed)
        probe = weakref.ref(doomed)
        del doomed                             # garbage now: only a collection frees it
        sys.settrace(tracer)
        try:
            ledger.record_for(Module())
        finally:
            sys.settrace(None)
        collected_inside.append(probe() is None)

    worker = threading.Thread(target=scenario, daemon=True)
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "record_for deadlocked: a weakref callback waited for the lock its thread holds"
    assert collected_inside[0] > 0 and collected_inside[1] is True  # the module died inside the critical section
    assert ledger.records() == []


def test_the_callback_of_a_module_dying_on_another_thread_never_waits_for_the_lock():
    ledger = Ledger()
    module = _cyclic_module()
    ledger.record_for(module)
    probe = weakref.ref(module)
    del module
    with ledger._lock:                        # another thread is inside the critical section
        done = threading.Event()
        threading.Thread(target=lambda: (gc.collect(), done.set()), daemon=True).start()
        assert done.wait(20), "a weakref callback waited for the ledger's lock"
    assert probe() is None and ledger.records() == []
