"""The backward search names a container's module-global roots by counting references, without a heap scan.

Each test checks the chains against :func:`capture_cycle`, whose search never settles by counting (it scans every
level), so that counting is shown to change the number of scans only, never what is found.
"""

import ctypes
import gc
import threading
import types
import sys
import weakref

import pytest

from comfy_memx.leaks.holders import capture_cycle, find_holders
from comfy_memx.leaks.holders.module_globals import COUNTS_AS_EXPECTED

SCRATCH = "memx_counting_scratch"
HELD = f"{SCRATCH}.CACHE['k'][0]"


class FakeModel:
    pass


@pytest.fixture
def scratch():
    """A throw-away module in sys.modules holding ``CACHE = {"k": [model]}``; yields ``(module, model ref)``."""
    module = types.ModuleType(SCRATCH)
    sys.modules[SCRATCH] = module
    model = FakeModel()
    module.CACHE = {"k": [model]}
    alive = weakref.ref(model)
    del model
    yield module, alive
    del sys.modules[SCRATCH]
    module.__dict__.clear()
    gc.collect()             # a class made in a test lives in reference cycles
    assert alive() is None   # nothing of the searches keeps the model


def _search(alive):
    model = alive()
    try:
        return find_holders(model, probe=False), capture_cycle(model)
    finally:
        del model


def _paths(report):
    return sorted(chain.path for chain in report.chains)


def test_a_container_only_a_module_global_holds_costs_no_scan(scratch):
    _, alive = scratch
    report, scanned = _search(alive)
    assert _paths(report) == _paths(scanned) == [HELD]
    assert report.complete and report.chains[0].steps == scanned.chains[0].steps
    # the model and the list are scanned; the dict's only holder is the module's __dict__, named by counting
    assert (report.scans, scanned.scans) == ((2, 3) if COUNTS_AS_EXPECTED else (3, 3))


def test_a_reference_nobody_can_name_sends_the_container_to_the_scan(scratch):
    module, alive = scratch
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(module.CACHE))
    try:
        report, scanned = _search(alive)
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(module.CACHE))
    assert _paths(report) == _paths(scanned) == [HELD]
    assert report.scans == 3


def test_a_second_holder_of_the_container_outside_the_module_globals_is_found(scratch):
    module, alive = scratch
    module.Keeper = type("Keeper", (), {"kept": module.CACHE, "__module__": SCRATCH})
    report, scanned = _search(alive)
    assert _paths(report) == _paths(scanned) == sorted([HELD, f"{SCRATCH}.Keeper.kept['k'][0]"])
    # the dict is scanned (finding the class's namespace, scanned in turn for its class), as without counting
    assert report.scans == scanned.scans == 4


def _hold_in_frame(holding, finish):
    kept = sys.modules[SCRATCH].CACHE   # noqa: F841  (this local variable is the holder under test)
    holding.set()
    finish.wait(30)


def test_a_thread_holding_the_container_is_named_and_counted(scratch):
    _, alive = scratch
    holding, finish = threading.Event(), threading.Event()
    worker = threading.Thread(target=_hold_in_frame, args=(holding, finish), name="memx-counting")
    worker.start()
    try:
        assert holding.wait(30)
        report, scanned = _search(alive)
    finally:
        finish.set()
        worker.join()
    frame_path = f"thread 'memx-counting' frame {__name__}._hold_in_frame local 'kept'['k'][0]"
    assert _paths(report) == _paths(scanned) == sorted([HELD, frame_path])
    assert report.scans == (2 if COUNTS_AS_EXPECTED else 3)
