"""The forward probe of strict leak mode: which stage finds each holder, through the real patch path.

A leak is produced as ComfyUI produces it (a model loaded through ``load_models_gpu``, its patcher dropped, then
``cleanup_models_gc``) on both stand-in shapes; the holder search that comfy_memx's leak watch runs is recorded
(``comfy_memx.leaks.holders.find_holders`` wrapped, so each test sees the full ``HolderReport``), and each test
asserts the exact chains, which stage found each one, and what the backward search had to do.
"""

import gc
import importlib.util
import logging
import os
import sys
import threading
import types
import weakref

import pytest

from comfy_memx.core.state import STATE
from comfy_memx.leaks import watch as leakwatch
from comfy_memx.leaks import holders
from memx_helpers import memx_on, read_events

VERSIONS = ["0.3.64", "0.27.0"]
PACK = '''
"""A custom-node pack that holds models in the ways real packs do (the probe's cases)."""
import functools
import threading

import comfy.model_base
import comfy.model_management
import comfy.model_patcher

REGISTRY = {}
KEEPERS = []
BY_MODEL = {}
TLS = threading.local()
CURRENT = None


class Keeper:
    def __init__(self, model):
        self.model = model


class ModelCache:
    """A class-level cache shared by every instance (the Qwen-Image-2512 leak shape)."""
    models = {}


class Hostile:
    """A holder whose dunder methods raise: the search must never call them."""
    def __init__(self, model):
        object.__setattr__(self, "held", model)

    def __getattribute__(self, name):
        if name == "__dict__":
            return object.__getattribute__(self, name)
        raise RuntimeError("__getattribute__ called")

    def __getattr__(self, name):
        raise RuntimeError("__getattr__ called")

    def __eq__(self, other):
        raise RuntimeError("__eq__ called")

    __hash__ = object.__hash__

    def __repr__(self):
        raise RuntimeError("__repr__ called")


class Hooks:
    def __init__(self, model):
        self.model = model

    def preview(self):
        return self.model


def make_callback(model):
    def callback():
        return model
    return callback


CACHE_SOURCE = []


@functools.lru_cache(maxsize=4)
def cached_lookup(key):
    return CACHE_SOURCE.pop()


def make_patcher(tensor_count=4):
    mm = comfy.model_management
    return comfy.model_patcher.ModelPatcher(comfy.model_base.BaseModel(tensor_count, 1024),
                                            load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())


def load(patcher):
    comfy.model_management.load_models_gpu([patcher])


def hold_in_thread(model, release):
    box = [model]
    taken = threading.Event()

    def worker():
        model = box.pop()   # from now on only this frame's local variable holds it
        taken.set()
        release.wait(30)
        del model
    thread = threading.Thread(target=worker, name="pack-holder-thread", daemon=True)
    thread.start()
    taken.wait(10)
    return thread


def release():
    global CURRENT
    REGISTRY.clear()
    KEEPERS.clear()
    BY_MODEL.clear()
    ModelCache.models.clear()
    CACHE_SOURCE.clear()
    cached_lookup.cache_clear()
    TLS.__dict__.clear()
    CURRENT = None
'''
ELSEWHERE = "memx_probe_elsewhere"


def write_pack(tmp_path):
    folder = tmp_path / "custom_nodes" / "probe_pack"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PACK)
    return folder


def import_pack(folder):
    spec = importlib.util.spec_from_file_location("probe_pack", os.path.join(folder, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["probe_pack"] = module
    return module


@pytest.fixture
def recorded(monkeypatch):
    """Every HolderReport the leak watch's searches make.

    Recorded as they are made (a subclass in the engine's namespace), not by wrapping ``find_holders``: a wrapper
    that forwards ``**kwargs`` calls through a C-level argument tuple that holds the target, which a faithful
    search reports as one more holder.
    """
    reports = []

    class RecordedReport(holders.HolderReport):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            reports.append(self)

    monkeypatch.setattr(holders, "HolderReport", RecordedReport)
    return reports


@pytest.fixture
def strict(request, tmp_path, caplog, recorded):
    caplog.set_level(logging.INFO)
    events = tmp_path / "events.jsonl"
    # a generous budget: these tests check what is found and by which stage, not how fast (bench/leak.py does)
    with memx_on(request.param, leak_mode="strict", events=events, leak_budget=20) as mm:
        pack = import_pack(write_pack(tmp_path))
        elsewhere = types.ModuleType(ELSEWHERE)
        elsewhere.__file__ = str(tmp_path / "site" / "memx_probe_elsewhere.py")   # not under custom_nodes
        sys.modules[ELSEWHERE] = elsewhere
        try:
            yield mm, pack, elsewhere, events, recorded
        finally:
            pack.release()
            elsewhere.__dict__.pop("HELD", None)
            sys.modules.pop(ELSEWHERE, None)
            sys.modules.pop("probe_pack", None)


def leak_into(pack, hold):
    """Load a model from the pack, let ``hold(module)`` keep it, and drop ComfyUI's patcher."""
    patcher = pack.make_patcher()
    pack.load(patcher)
    hold(patcher.model)
    alive = weakref.ref(patcher.model)
    del patcher
    gc.collect()
    return alive


def search_of(mm, events, recorded, full=False):
    """Run ComfyUI's cleanup (the leak watch searches the leaked model) and return (report, leak event).

    The automatic search of a new leak stops at the first holder path; ``full`` then asks for the search a user
    asks for (``search_now``: every holder), and returns its report."""
    mm.cleanup_models_gc()
    report = recorded[-1]
    leak = [e for e in read_events(events) if e["event"] == "leak"][0]
    assert [r["path"] for r in leak["referrers"]] == [chain.path for chain in report.chains]
    if full:
        (record,) = [r for r in STATE.ledger.records() if r.model_id == leak["model_id"]]
        leakwatch.search_now(record)
        report = recorded[-1]
    return report, leak


def found(report):
    return {chain.path: (chain.package, chain.root_kind, chain.stage) for chain in report.chains}


def assert_released(pack, alive):
    pack.release()
    gc.collect()
    assert alive() is None, "the search (or the ledger) kept the model alive"


# Each holder kind: how the pack keeps the model, the exact chain, its root kind.  All are rooted in the pack,
# so the probe finds them, names every reference to every object on the way, and no heap scan runs.
PROBED = {
    "module_global": (lambda p, m: setattr(p, "CURRENT", m), "probe_pack.CURRENT", "module_global"),
    "dict_value": (lambda p, m: p.REGISTRY.__setitem__(("qwen_2512.safetensors", 1024), m),
                   "probe_pack.REGISTRY[('qwen_2512.safetensors', 1024)]", "module_global"),
    "dict_key": (lambda p, m: p.BY_MODEL.__setitem__(m, "loaded"), "probe_pack.BY_MODEL -> dict key",
                 "module_global"),
    "bound_method": (lambda p, m: p.REGISTRY.__setitem__("hook", p.Hooks(m).preview),
                     "probe_pack.REGISTRY['hook'].__self__.model", "module_global"),
    "closure": (lambda p, m: p.REGISTRY.__setitem__("cb", p.make_callback(m)),
                "probe_pack.REGISTRY['cb'] -> closure 'model'", "module_global"),
    "lru_cache": (lambda p, m: (p.CACHE_SOURCE.append(m), p.cached_lookup("unet")),
                  "probe_pack.cached_lookup -> lru_cache entry", "module_global"),
    "class_attribute": (lambda p, m: p.ModelCache.models.__setitem__("unet", m),
                        "probe_pack.ModelCache.models['unet']", "class_attribute"),
    "thread_local": (lambda p, m: setattr(p.TLS, "model", m), "probe_pack.TLS -> thread-local.model",
                     "module_global"),
    "hostile_holder": (lambda p, m: p.KEEPERS.append(p.Hostile(m)), "probe_pack.KEEPERS[0].held",
                       "module_global"),
    "huge_list": (lambda p, m: p.REGISTRY.__setitem__("big", [None] * 1_000_000 + [m]),
                  "probe_pack.REGISTRY['big'][1000000]", "module_global"),
}


@pytest.mark.parametrize("kind", sorted(PROBED))
@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_each_package_rooted_holder_is_found_by_the_probe(strict, kind):
    mm, pack, _, events, recorded = strict
    hold, expected, root_kind = PROBED[kind]
    alive = leak_into(pack, lambda m: hold(pack, m))
    report, leak = search_of(mm, events, recorded)
    chains = found(report)
    assert len(chains) == 1, chains
    ((path, (package, kind_found, stage)),) = chains.items()
    assert path.startswith(expected), path
    assert (package, kind_found, stage) == ("probe_pack", root_kind, "probe")
    assert report.complete and leak["search"]["complete"] is True
    assert report.stages["probe"]["reached"] and report.stages["probe"]["unexplained"] == 0
    assert report.stages["backward"]["mode"] == "skipped" and report.scans == 0
    assert_released(pack, alive)


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_two_holders_in_the_pack_are_both_found_by_the_probe(strict):
    mm, pack, _, events, recorded = strict
    alive = leak_into(pack, lambda m: (pack.REGISTRY.__setitem__("unet", m), pack.KEEPERS.append(pack.Keeper(m))))
    report, _ = search_of(mm, events, recorded, full=True)
    assert found(report) == {
        "probe_pack.REGISTRY['unet']": ("probe_pack", "module_global", "probe"),
        "probe_pack.KEEPERS[0].model": ("probe_pack", "module_global", "probe"),
    }
    assert report.complete and report.stages["backward"]["mode"] == "skipped"
    assert_released(pack, alive)


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_a_second_holder_outside_the_packages_is_found_by_the_backward_search(strict):
    mm, pack, elsewhere, events, recorded = strict
    alive = leak_into(pack, lambda m: (pack.REGISTRY.__setitem__("unet", m), setattr(elsewhere, "HELD", [m])))
    report, _ = search_of(mm, events, recorded, full=True)
    assert found(report) == {
        "probe_pack.REGISTRY['unet']": ("probe_pack", "module_global", "probe"),
        f"{ELSEWHERE}.HELD[0]": (ELSEWHERE, "module_global", "backward"),
    }
    assert report.complete
    backward = report.stages["backward"]
    # it climbed only from the model (the one object with a holder the probe did not see): one scan finds the list,
    # which only the module global holds (named by counting, without a second scan)
    assert report.stages["probe"]["unexplained"] == 1
    assert backward["mode"] == "remaining" and backward["scans"] == 1 and backward["chains"] == 1
    elsewhere.HELD = None
    assert_released(pack, alive)


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_a_pack_thread_holding_the_model_in_a_frame_is_found_by_the_probe(strict):
    mm, pack, _, events, recorded = strict
    release = threading.Event()
    threads = []
    alive = leak_into(pack, lambda m: threads.append(pack.hold_in_thread(m, release)))
    try:
        report, _ = search_of(mm, events, recorded)
    finally:
        release.set()
        threads[0].join(10)
    ((path, owner),) = found(report).items()
    assert "thread 'pack-holder-thread'" in path and path.endswith("local 'model'")
    assert owner == ("probe_pack", "thread_frame", "probe")
    assert report.stages["probe"]["reached"] and report.stages["backward"].get("scans", 0) == 0
    assert_released(pack, alive)


def _outside_worker(box, taken, release):
    model = box.pop()
    taken.set()
    release.wait(30)
    del model


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_a_leak_held_by_a_thread_outside_any_package_is_found_without_a_heap_scan(strict):
    mm, pack, _, events, recorded = strict
    release, taken = threading.Event(), threading.Event()
    box = []
    alive = leak_into(pack, box.append)
    worker = threading.Thread(target=_outside_worker, args=(box, taken, release), name="outside-thread")
    worker.start()
    try:
        assert taken.wait(10)
        report, _ = search_of(mm, events, recorded)
    finally:
        release.set()
        worker.join(10)
    assert found(report) == {f"thread 'outside-thread' frame {__name__}._outside_worker local 'model'":
                             (__name__.split(".")[0], "thread_frame", "probe")}
    assert report.stages["probe"]["reached"] is True and report.stages["backward"].get("scans", 0) == 0
    gc.collect()
    assert alive() is None


class ServerStandIn:
    """What a custom node reaches through ``PromptServer.instance`` (a plain object, so no local keeps it)."""

    def __init__(self):
        self.outputs = {}


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_a_model_kept_by_the_prompt_server_is_found_from_comfyuis_singletons(strict):
    """The probe's second phase starts from ComfyUI's long-lived objects (here ``server.PromptServer.instance``)."""
    mm, pack, _, events, recorded = strict
    import server
    saved = getattr(server.PromptServer, "instance", None)
    server.PromptServer.instance = ServerStandIn()
    try:
        alive = leak_into(pack, lambda m: server.PromptServer.instance.outputs.__setitem__("3", [m]))
        report, _ = search_of(mm, events, recorded)
        assert found(report) == {"server.PromptServer.instance.outputs['3'][0]": ("core", "class_attribute", "probe")}
        assert report.stages["probe"]["phases"] == ["packages", "core"]
        assert report.stages["backward"]["mode"] == "skipped" and report.complete
    finally:
        server.PromptServer.instance = saved
    gc.collect()
    assert alive() is None


def _prompt_worker(executor_box, taken, release):
    e = executor_box.pop()      # like ComfyUI's main.prompt_worker: the executor lives in this local only
    taken.set()
    release.wait(30)
    del e


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_a_model_in_the_executors_objects_is_found_from_the_worker_threads_executor(strict):
    mm, pack, _, events, recorded = strict
    import execution
    release, taken = threading.Event(), threading.Event()
    box = [execution.PromptExecutor(None)]
    worker = threading.Thread(target=_prompt_worker, args=(box, taken, release), name="prompt-worker")
    worker.start()
    try:
        assert taken.wait(10)
        alive = leak_into(pack, lambda m: _executor_of(worker).objects.__setitem__("3", [m]))
        report, _ = search_of(mm, events, recorded)
    finally:
        release.set()
        worker.join(10)
    assert found(report) == {
        f"thread 'prompt-worker' frame {__name__}._prompt_worker local 'e'.objects['3'][0]":
            (__name__, "thread_frame", "probe")}
    assert report.stages["probe"]["phases"] == ["packages", "core"] and report.complete
    assert report.stages["backward"]["mode"] == "skipped"
    gc.collect()
    assert alive() is None


def _executor_of(thread):
    frame = sys._current_frames()[thread.ident]
    while frame.f_code is not _prompt_worker.__code__:
        frame = frame.f_back
    return frame.f_locals["e"]


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_an_unseen_reference_from_c_sends_the_model_to_the_backward_search(strict):
    """A reference nobody can see (here: one C-level reference) never hides a holder: the model is searched."""
    import ctypes
    mm, pack, _, events, recorded = strict
    alive = leak_into(pack, lambda m: pack.REGISTRY.__setitem__("unet", m))
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(alive()))
    try:
        report, _ = search_of(mm, events, recorded, full=True)
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(alive()))
    assert found(report) == {"probe_pack.REGISTRY['unet']": ("probe_pack", "module_global", "probe")}
    assert report.stages["probe"]["unexplained"] == 1 and report.stages["backward"]["mode"] == "remaining"
    assert report.complete and report.stages["backward"]["scans"] == 1
    assert_released(pack, alive)
