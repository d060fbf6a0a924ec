import gc
import weakref

from comfy_memx.ledger import Ledger


class Module:
    pass


def test_records_are_stable_per_module_and_numbered_per_class():
    ledger = Ledger()
    a, b = Module(), Module()
    ra = ledger.record_for(a)
    assert ledger.record_for(a) is ra
    assert ra.model_id == "Module#1" and ledger.record_for(b).model_id == "Module#2"
    assert ledger.find(Module()) is None and len(ledger) == 2


def test_ledger_never_keeps_a_model_alive():
    ledger = Ledger()

    class Patcher:
        def __init__(self, model):
            self.model = model
    module = Module()
    patcher = Patcher(module)
    record = ledger.record_for(module)
    record.add_patcher(patcher)
    assert record.live_patchers() == 1
    probe = weakref.ref(module)
    del module, patcher
    gc.collect()
    assert probe() is None
    assert len(ledger) == 0 and ledger.records() == [] and not record.alive


def test_to_json_holds_no_objects():
    import json
    ledger = Ledger()
    module = Module()
    json.dumps(ledger.record_for(module).to_json())
