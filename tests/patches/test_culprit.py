"""The right culprit, every time: packs written the way pack authors write them hold a model that a third, innocent
pack loaded; comfy_memx must name the holding package (every mode) and its chain (strict) on the first search, while
other processes keep both cores busy and another thread of ComfyUI's process competes for the GIL.

Through the real patch path (``cleanup_models_gc`` of both stand-ins, as ComfyUI calls it at a load).
"""

import gc
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import weakref

import pytest

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.leaks import watch as leakwatch
from comfy_memx.leaks.holders import packages
from memx_helpers import load_module, memx_on, read_events

VERSIONS = ["0.3.64", "0.27.0"]
culprit = load_module("memx_culprit", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "real_comfy",
                                                "culprit.py"))
LOADER = culprit.LOADER
#: holder pack -> (the path its chain starts with, pattern)
HOLDERS = {name: (path, pattern) for name, (_, path, pattern) in culprit.HOLDERS.items()}


def install(root, name):
    """Copy one pack of ``real_comfy/culprit_packs`` under ``root/custom_nodes`` and import it by its name."""
    folder = root / "custom_nodes" / name
    shutil.copytree(culprit.pack_dir(name), folder)
    return load_module(name, folder / "__init__.py", register=True)


@pytest.fixture(scope="module")
def cpu_hog():
    """Two processes that keep both cores busy for as long as this module's tests run (killed at the end)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 900\nwhile time.time() < end: pass"])
            for _ in range(2)]
    time.sleep(0.2)
    yield hogs
    for hog in hogs:
        hog.kill()
        hog.wait(10)


class GilSpinner:
    """A thread of this process that competes for the GIL with pure-Python work (a busy node, a busy route)."""

    def __init__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._spin, name="gil-spinner", daemon=True)

    def _spin(self):
        while not self.stop.is_set():
            sum(range(2000))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def world(request, tmp_path, caplog, cpu_hog):
    version, mode = request.param
    caplog.set_level(logging.INFO)
    events = tmp_path / "events.jsonl"
    with memx_on(version, leak_mode=mode, events=events) as mm:     # the default budget: 2 s of CPU time
        loader = install(tmp_path, LOADER)
        holders = {name: install(tmp_path, name) for name in HOLDERS}
        try:
            yield mm, loader, holders, events, caplog
        finally:
            for pack in holders.values():
                pack.release()
            for name in [LOADER, *HOLDERS]:
                sys.modules.pop(name, None)


def leak_all(loader, holders):
    """The innocent pack loads one model per holder pack, each holder pack keeps its model, ComfyUI drops the
    patchers; returns weak references to the models."""
    import comfy.model_base
    import comfy.model_management as mm
    import comfy.model_patcher
    alive = {}
    for name, pack in holders.items():
        patcher = loader.load_model(comfy.model_patcher.ModelPatcher(
            comfy.model_base.BaseModel(4, 1024), load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device()))
        pack.keep(patcher.model)
        alive[name] = weakref.ref(patcher.model)
        del patcher
    gc.collect()
    return alive


def in_prompt(mm, prompt_id):
    call = signals.prompt.before(prompt_id, {})
    try:
        mm.cleanup_models_gc()
    finally:
        signals.prompt.after(call)


def leak_events(events):
    return [e for e in read_events(events) if e["event"] == "leak"]


def by_holder(events, alive):
    """The first leak event of each model, keyed by the holder pack that keeps it."""
    ids = {}
    for record in STATE.ledger.records():
        module = record.module_ref()
        for name, ref in alive.items():
            if module is not None and ref() is module:
                ids[record.model_id] = name
        del module
    found = {}
    for event in leak_events(events):
        found.setdefault(ids.get(event["model_id"]), event)
    return found


MODES = [(version, mode) for version in VERSIONS for mode in ("strict", "report")]


@pytest.mark.parametrize("world", MODES, indirect=True, ids=lambda p: "-".join(p))
def test_every_holder_kind_is_named_on_the_first_search_under_load(world):
    mm, loader, holders, events, caplog = world
    alive = leak_all(loader, holders)
    with GilSpinner():
        in_prompt(mm, "p1")
    found = by_holder(events, alive)
    assert set(found) == set(HOLDERS)
    strict = STATE.config.leak_mode == "strict"
    for name, (path, pattern) in HOLDERS.items():
        event = found[name]
        assert event["owner"]["package"] == LOADER, name                 # who loaded it ...
        assert event["holder_package"] == name, (name, event["search"])  # ... and who holds it
        assert event["holder"]["pattern"] == pattern, (name, event["holder"])
        assert event["search"]["result"] == "found" and event["search"]["found_by"]["probe"] >= 1
        assert event["holder"]["path"].startswith(path), event["holder"]["path"]
        assert "0x" not in event["holder"]["path"]
        if strict:
            assert event["referrers"][0]["path"].startswith(path)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("comfy_memx: leaked model")]
    assert len(lines) == len(HOLDERS)
    for name in HOLDERS:
        assert sum(f"held by package {name}" in line and f"package {LOADER}" in line for line in lines) == 1
    assert not any("C code" in r.getMessage() for r in caplog.records)
    for pack in holders.values():
        pack.release()
    gc.collect()
    assert all(ref() is None for ref in alive.values())   # neither the searches nor the reports kept a model


@pytest.mark.parametrize("world", [("0.27.0", "strict")], indirect=True, ids=lambda p: "-".join(p))
def test_a_slow_package_scan_does_not_eat_the_probes_budget(world, monkeypatch):
    """The set-up of the probe (the walk of sys.modules that finds the packages) is outside its budget: a 60 ms
    stall there, which made every probe end with nothing expanded, changes nothing."""
    mm, loader, holders, events, _ = world
    real = packages.custom_node_modules

    def stalled():
        time.sleep(0.06)
        return real()
    monkeypatch.setattr("comfy_memx.leaks.holders.probe.custom_node_modules", stalled)
    alive = leak_all(loader, holders)
    in_prompt(mm, "p1")
    found = by_holder(events, alive)
    assert {name: event["holder_package"] for name, event in found.items()} == {name: name for name in HOLDERS}
    assert all(event["search"]["stages"]["probe"]["reached"] for event in found.values())
    # every holder but the thread's (its frame is read directly) was reached by walking objects
    assert all(event["search"]["stages"]["probe"]["expanded"] > 0 for name, event in found.items()
               if name != "memx_background_worker")


@pytest.mark.parametrize("world", [("0.3.64", "strict")], indirect=True, ids=lambda p: "-".join(p))
def test_concurrent_requests_for_one_model_share_one_search(world, monkeypatch):
    mm, loader, holders, events, _ = world
    alive = leak_all(loader, {"memx_style_mixer": holders["memx_style_mixer"]})
    in_prompt(mm, "p1")
    [record] = [r for r in STATE.ledger.records() if r.leak]
    searches = leakwatch.desk()
    entered, go = threading.Event(), threading.Event()
    real = leakwatch._search_now

    def held_open(*args):
        entered.set()
        go.wait(30)
        return real(*args)
    monkeypatch.setattr(leakwatch, "_search_now", held_open)
    results, runs = [None, None], searches.runs
    first = threading.Thread(target=lambda: results.__setitem__(0, leakwatch.search_now(record)))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=lambda: results.__setitem__(1, leakwatch.search_now(record)))
    second.start()
    assert _waits_in(second, "search_now", "wait")           # the second caller is waiting for the first run
    go.set()
    first.join(30)
    second.join(30)
    assert searches.runs == runs + 1 and results[0] is results[1]
    assert results[0]["holder"]["package"] == "memx_style_mixer"
    del record
    holders["memx_style_mixer"].release()
    gc.collect()
    assert alive["memx_style_mixer"]() is None


@pytest.mark.parametrize("world", [("0.27.0", "strict")], indirect=True, ids=lambda p: "-".join(p))
def test_no_search_names_a_frame_of_comfy_memx_on_another_thread(world):
    """The prompt worker sits in the leak watch (its frames hold the model in locals) waiting for the search desk
    while a requested search of the same model runs: that search names the pack, never the worker's frames."""
    mm, loader, holders, events, _ = world
    alive = leak_all(loader, {"memx_list_keeper": holders["memx_list_keeper"]})
    in_prompt(mm, "p1")
    [record] = [r for r in STATE.ledger.records() if r.leak]
    record.leak["search"] = {"result": "deferred", "deferred": True}    # so that the next sighting searches
    searches = leakwatch.desk()
    searches.running.acquire()
    worker = threading.Thread(target=in_prompt, args=(mm, "p2"), name="prompt_worker")
    try:
        worker.start()
        assert _waits_in(worker, "_search")              # blocked in the desk lock's (C-level) acquire
        found = leakwatch._search_now(record, (), None)       # the desk is ours: run the requested search now
    finally:
        searches.running.release()
        worker.join(30)
    paths = [holder["path"] for holder in found["holders"]]
    assert paths and not any("comfy_memx" in path for path in paths), paths
    assert found["holder"]["package"] == "memx_list_keeper" and found["search"]["complete"]
    del record, found
    holders["memx_list_keeper"].release()
    gc.collect()
    assert alive["memx_list_keeper"]() is None


def _waits_in(thread, function, call=None, timeout=10.0):
    """True once ``thread``'s stack has a frame of ``function`` with a call whose name contains ``call`` above it
    (``call=None``: ``function`` is the innermost Python frame, blocked in a C call)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident)
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        del frame
        if call is None and names[:1] == [function]:
            return True
        if call is not None and function in names and any(call in name for name in names[:names.index(function)]):
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("world", [("0.3.64", "strict")], indirect=True, ids=lambda p: "-".join(p))
def test_a_cycle_capture_names_the_packs_thread_and_no_container_of_comfy_memx(world):
    """The frames of a pack's own threads are starting points of the forward probe; a cycle capture (a backward
    search of its own) must not keep those values in a list of ours while it scans the heap, or that list would be
    reported as an object held from C code."""
    from comfy_memx.leaks import holders as engine
    mm, loader, holders, events, _ = world
    alive = leak_all(loader, {"memx_background_worker": holders["memx_background_worker"]})
    module = alive["memx_background_worker"]()
    report = engine.capture_cycle(module)
    del module
    paths = [chain.path for chain in report.chains]
    assert any(path.startswith("thread 'preview-loop'") for path in paths), paths
    assert not [path for path in paths if "C-held" in path or "comfy_memx" in path], paths
    holders["memx_background_worker"].release()
    gc.collect()
    assert alive["memx_background_worker"]() is None
