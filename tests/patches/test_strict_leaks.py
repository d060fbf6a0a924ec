"""Strict leak mode through the real patch path (cleanup_models_gc on both stand-in shapes)."""

import gc
import importlib.util
import logging
import os
import subprocess
import sys
import threading
import types
import weakref

import pytest

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.leaks import patterns
from comfy_memx.leaks import watch as leakwatch
from fake_comfy.loader import shape_root
from memx_helpers import memx_on, mode_of, read_events, umask

VERSIONS = ["0.3.64", "0.27.0"]
HOLDER_PACK = '''
"""A custom-node pack of our own that holds models in the ways real packs do."""
import functools
import threading

import comfy.model_base
import comfy.model_management
import comfy.model_patcher

REGISTRY = {}
KEEPERS = []


class Keeper:
    def __init__(self, model):
        self.model = model
        self.me = self          # a reference cycle


def make_patcher(tensor_count=4):
    mm = comfy.model_management
    return comfy.model_patcher.ModelPatcher(comfy.model_base.BaseModel(tensor_count, 1024),
                                            load_device=mm.get_torch_device(), offload_device=mm.unet_offload_device())


def load(patcher):
    comfy.model_management.load_models_gpu([patcher])


class Hostile:
    """A holder whose dunder methods raise: the search must never call them."""
    def __init__(self, model):
        object.__setattr__(self, "held", model)

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


@functools.lru_cache(maxsize=4)
def cached_lookup(key):
    return CACHE_SOURCE.pop()


CACHE_SOURCE = []


def hold_in_thread(model, release):
    box = [model]
    taken = threading.Event()

    def worker():
        model = box.pop()   # from now on only this frame's local variable holds it
        taken.set()
        release.wait(30)
        del model
    thread = threading.Thread(target=worker, name="holder-thread", daemon=True)
    thread.start()
    taken.wait(10)
    return thread
'''


def write_pack(tmp_path):
    folder = tmp_path / "custom_nodes" / "holder_pack"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(HOLDER_PACK)
    return folder


def import_pack(folder):
    spec = importlib.util.spec_from_file_location("holder_pack", os.path.join(folder, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["holder_pack"] = module
    return module


@pytest.fixture
def strict(request, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    events = tmp_path / "events.jsonl"
    (tmp_path / "graphs").mkdir()
    # a generous budget: these tests check what is found, not how fast (bench/leak.py measures speed)
    with memx_on(request.param, leak_mode="strict", events=events, leak_graph=tmp_path / "graphs",
                 leak_budget=20) as mm:
        pack = import_pack(write_pack(tmp_path))
        yield mm, pack, events, caplog
        sys.modules.pop("holder_pack", None)


def leak_into(mm, pack, hold):
    """Load a model from the pack, let ``hold(module)`` keep it, and drop ComfyUI's patcher."""
    patcher = pack.make_patcher()
    pack.load(patcher)
    hold(patcher.model)
    probe = weakref.ref(patcher.model)
    del patcher
    gc.collect()
    return probe


def leak_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("comfy_memx:")]


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_rooted_leak_names_every_holder_with_package(strict):
    mm, pack, events, caplog = strict
    probe = leak_into(mm, pack, lambda m: (pack.REGISTRY.__setitem__("unet", m),
                                           pack.KEEPERS.append(pack.Keeper(m))))
    mm.cleanup_models_gc()
    lines = leak_lines(caplog)
    # the prompt's search stops at the first (shortest) path, and says that there may be more
    assert "held by package holder_pack, loaded by package holder_pack, is held by 1 reference chain(s) (the first" \
        in lines[0]
    assert any("holder_pack.REGISTRY['unet']  [package holder_pack, module_global]" in line for line in lines)
    leak = [e for e in read_events(events) if e["event"] == "leak"][0]
    assert leak["stage"] == "rooted" and leak["search"]["result"] == "found"
    assert leak["search"]["stopped_by"] == "first_path" and leak["holder_package"] == "holder_pack"
    assert {r["package"] for r in leak["referrers"]} == {"holder_pack"}
    assert os.listdir(str(events.parent / "graphs"))
    [record] = [r for r in STATE.ledger.records() if r.leak]
    asked = leakwatch.search_now(record)                   # what a user asks for: every holder
    assert sorted(h["path"] for h in asked["holders"]) == ["holder_pack.KEEPERS[0].model",
                                                          "holder_pack.REGISTRY['unet']"]
    assert asked["search"]["result"] == "found" and asked["search"]["complete"] is True
    del record, asked
    pack.REGISTRY.clear()
    pack.KEEPERS.clear()
    gc.collect()
    assert probe() is None   # neither the search nor the ledger kept it


HOLD = {
    "dict_key": (lambda p, m: p.REGISTRY.__setitem__(("qwen_2512.safetensors", 1024), m),
                 "holder_pack.REGISTRY[('qwen_2512.safetensors', 1024)]"),
    "bound_method": (lambda p, m: p.REGISTRY.__setitem__("hook", p.Hooks(m).preview),
                     "holder_pack.REGISTRY['hook'].__self__.model"),
    "closure": (lambda p, m: p.REGISTRY.__setitem__("cb", p.make_callback(m)),
                "holder_pack.REGISTRY['cb'] -> closure 'model'"),
    "hostile_holder": (lambda p, m: p.KEEPERS.append(p.Hostile(m)), "holder_pack.KEEPERS[0].held"),
    "huge_list": (lambda p, m: p.REGISTRY.__setitem__("big", [None] * 1_000_000 + [m]),
                  "holder_pack.REGISTRY['big'][1000000]"),
    "lru_cache": (lambda p, m: (p.CACHE_SOURCE.append(m), p.cached_lookup("unet")), "holder_pack.cached_lookup"),
}


# a closure kept in a registry is a registered callback; KEEPERS is a module-level list the pack appends to
PATTERN = {"dict_key": "module_registry", "bound_method": "callback_registry", "closure": "callback_registry",
           "hostile_holder": "appended_list", "huge_list": "module_registry", "lru_cache": "lru_cache"}


@pytest.mark.parametrize("kind", sorted(HOLD))
@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_each_kind_of_holder_is_named_through_the_patch_path(strict, kind):
    mm, pack, events, caplog = strict
    hold, expected = HOLD[kind]
    probe = leak_into(mm, pack, lambda m: hold(pack, m))
    mm.cleanup_models_gc()
    leak = [e for e in read_events(events) if e["event"] == "leak"][0]
    paths = [r["path"] for r in leak["referrers"]]
    assert any(path.startswith(expected) for path in paths), paths
    assert leak["search"]["complete"] is True
    [named] = [r for r in leak["referrers"] if r["path"].startswith(expected)]
    assert named["pattern"] == PATTERN[kind] and named["suggestion"] == patterns.SUGGESTIONS[PATTERN[kind]]
    assert any(f"fix ({PATTERN[kind]}): " in line for line in leak_lines(caplog))
    pack.REGISTRY.clear()
    pack.KEEPERS.clear()
    pack.cached_lookup.cache_clear()
    gc.collect()
    assert probe() is None


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_model_held_only_by_a_cycle_is_reported_as_cycle_and_collected(strict):
    mm, pack, events, caplog = strict
    gc.disable()
    try:
        keepers = []
        probe = leak_into(mm, pack, lambda m: keepers.append(pack.Keeper(m)))
        keepers.clear()                        # now only the Keeper's self-cycle holds the module
        assert probe() is not None
        mm.cleanup_models_gc()
    finally:
        gc.enable()
    assert probe() is None
    lines = leak_lines(caplog)
    assert "held only by a reference cycle" in lines[0]
    assert ".me" in lines[1] and "Keeper" in lines[1]
    leak = [e for e in read_events(events) if e["event"] == "leak"][0]
    assert leak["stage"] == "cycle" and leak["referrers"][0]["root_kind"] == "cycle"
    assert leak["referrers"][0]["pattern"] == "reference_cycle"


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_thread_local_variable_is_a_root(strict):
    mm, pack, events, caplog = strict
    release = threading.Event()
    threads = []
    probe = leak_into(mm, pack, lambda m: threads.append(pack.hold_in_thread(m, release)))
    try:
        mm.cleanup_models_gc()
        chains = [e for e in read_events(events) if e["event"] == "leak"][0]["referrers"]
        assert [c["root_kind"] for c in chains] == ["thread_frame"]
        assert chains[0]["pattern"] == "thread_frame" and "thread still holds it" in chains[0]["suggestion"]
        assert "holder-thread" in chains[0]["path"] and "'model'" in chains[0]["path"]
        assert chains[0]["package"] == "holder_pack"
    finally:
        release.set()
        threads[0].join(5)
    gc.collect()
    assert probe() is None


def in_prompts(count, start=0):
    """``count`` prompt windows, as the execution patch opens them around each prompt."""
    for number in range(start, start + count):
        call = signals.prompt.before(f"p{number}", {})
        try:
            yield f"p{number}"
        finally:
            signals.prompt.after(call)


class CountingSearches:
    """Wraps the holder engine's entry points to count heap searches (and optionally fake their cost)."""

    def __init__(self, monkeypatch, seconds=None):
        from comfy_memx.leaks import holders
        self.calls = []
        for name in ("find_holders", "capture_cycle"):
            real = getattr(holders, name)
            monkeypatch.setattr(holders, name, self._counting(name, real, seconds))

    def _counting(self, name, real, seconds):
        def counted(target, **kwargs):
            self.calls.append((name, kwargs["budget_s"]))
            report = real(target, **kwargs)
            if seconds is not None:
                report.seconds = report.cpu_seconds = seconds
            return report
        return counted

    def count(self, name):
        return sum(1 for called, _ in self.calls if called == name)


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_a_leaked_model_is_searched_once_and_later_sightings_are_only_counted(strict, monkeypatch):
    mm, pack, events, caplog = strict
    searches = CountingSearches(monkeypatch)
    leak_into(mm, pack, lambda m: pack.REGISTRY.__setitem__("m", m))
    for _ in in_prompts(6):
        for _ in range(3):                                  # ComfyUI checks at every load of a prompt
            mm.cleanup_models_gc()
    # the probe found the holder before ComfyUI's collect: no cycle capture, no heap scan, no second search
    assert searches.count("capture_cycle") == 0 and searches.count("find_holders") == 1
    log = read_events(events)
    assert [e["event"] for e in log if e["event"].startswith("leak")] == ["leak"] + ["leak_seen"] * 5
    assert [e["sightings"] for e in log if e["event"] == "leak_seen"] == [2, 3, 4, 5, 6]
    assert [e["prompt_id"] for e in log if e["event"] == "leak_seen"] == ["p1", "p2", "p3", "p4", "p5"]
    assert len([line for line in leak_lines(caplog) if "leaked model" in line]) == 1
    [record] = [r for r in STATE.ledger.records() if r.leak]
    assert record.leak["sightings"] == 6 and record.leak["last_prompt"] == "p5" and record.leak["searches"] == 1
    assert leakwatch.book().rooted_leaks == {record.model_id}
    pack.REGISTRY.clear()


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_a_known_leak_is_searched_again_only_when_its_holders_change(strict):
    """Searches are counted from the record and the events: wrapping the engine would add a holder of its own (the
    argument tuple of the wrapped call)."""
    mm, pack, events, caplog = strict
    probe = leak_into(mm, pack, lambda m: pack.REGISTRY.__setitem__("first", m))
    prompts = in_prompts(9)
    next(prompts)
    mm.cleanup_models_gc()
    [record] = [r for r in STATE.ledger.records() if r.leak]
    assert record.leak["searches"] == 1
    pack.KEEPERS.append(pack.Keeper(probe()))               # a second holder appears
    next(prompts)
    mm.cleanup_models_gc()                                  # sighting 2: the reference count moved
    assert record.leak["searches"] == 2
    for _ in prompts:
        mm.cleanup_models_gc()                              # sightings 3..9: nothing moved
    assert record.leak["searches"] == 2 and record.leak["sightings"] == 9
    first, research = [e for e in read_events(events) if e["event"] == "leak"]
    assert [r["path"] for r in first["referrers"]] == ["holder_pack.REGISTRY['first']"]
    assert research["reason"] == "holders_changed"
    assert sorted(r["path"] for r in research["referrers"]) == ["holder_pack.KEEPERS[0].model",
                                                                "holder_pack.REGISTRY['first']"]
    pack.REGISTRY.clear()
    pack.KEEPERS.clear()


class CostlySearches:
    """Makes every search report ``seconds`` of CPU time, and records which reports were made, in order (as the
    reports are made: a wrapper of the engine would hold the target in a C-level argument tuple)."""

    def __init__(self, monkeypatch, seconds):
        from comfy_memx.leaks import holders
        self.calls = []
        for name in ("HolderReport", "CycleReport"):
            monkeypatch.setattr(holders, name, self._costly(getattr(holders, name), seconds))

    def _costly(self, cls, seconds):
        calls = self.calls

        class Costly(cls):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.cpu_seconds = self.seconds = seconds
                calls.append(cls.__name__)
        return Costly


def outside_packages(tmp_path, name="memx_strict_elsewhere"):
    """A module that is not under custom_nodes (the forward probe does not start from it)."""
    module = types.ModuleType(name)
    module.__file__ = str(tmp_path / "site" / f"{name}.py")
    module.HELD = []
    sys.modules[name] = module
    return module


@pytest.mark.parametrize("version", VERSIONS)
def test_all_strict_work_of_a_prompt_shares_one_cpu_allowance(version, tmp_path, monkeypatch):
    """Three models leak at once, held outside the packages (the probe cannot name them); every search is made to
    cost 0.8 s of a 2 s allowance.  The first prompt probes all three and captures one cycle; nothing is left
    for the backward searches, so all three are reported at once as deferred; the next prompt searches them
    first and names every holder."""
    events = tmp_path / "events.jsonl"
    with memx_on(version, leak_mode="strict", events=events, leak_budget=2) as mm:
        pack = import_pack(write_pack(tmp_path))
        elsewhere = outside_packages(tmp_path)
        searches = CostlySearches(monkeypatch, seconds=0.8)
        patchers = [pack.make_patcher() for _ in range(3)]
        for patcher in patchers:
            pack.load(patcher)
            elsewhere.HELD.append(patcher.model)
        del patcher
        patchers.clear()
        gc.collect()
        prompts = in_prompts(2)
        next(prompts)
        mm.cleanup_models_gc()
        first = [e for e in read_events(events) if e["event"] == "leak"]
        assert len(first) == 3 and all(e["search"]["result"] == "deferred" for e in first)
        # probe, cycle capture, probe, probe: then nothing is left for a backward search
        assert searches.calls == ["HolderReport", "CycleReport", "HolderReport", "HolderReport"]
        next(prompts)
        mm.cleanup_models_gc()
        later = [e for e in read_events(events) if e["event"] == "leak"][3:]
        assert sorted(e["model_id"] for e in later) == sorted(e["model_id"] for e in first)
        assert all(e["reason"] == "deferred" and e["search"]["result"] == "found" for e in later)
        assert sorted(r["path"] for e in later for r in e["referrers"]) == [
            "memx_strict_elsewhere.HELD[0]", "memx_strict_elsewhere.HELD[1]", "memx_strict_elsewhere.HELD[2]"]
        assert searches.calls[4:] == ["HolderReport"] * 3
        elsewhere.HELD.clear()
        sys.modules.pop("memx_strict_elsewhere", None)
        sys.modules.pop("holder_pack", None)


@pytest.mark.parametrize("version", VERSIONS)
def test_leak_graphs_are_written_0600_under_umask_022(version, tmp_path, monkeypatch):
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "dot").write_text("#!/bin/sh\nprintf 'PNG of [%s] ' \"$*\"; cat\n")   # dot: graph on stdin, PNG on stdout
    os.chmod(tools / "dot", 0o755)
    monkeypatch.setenv("PATH", str(tools) + os.pathsep + os.environ.get("PATH", ""))
    with umask(0o022), memx_on(version, leak_mode="strict", leak_graph=graphs, leak_budget=20) as mm:
        pack = import_pack(write_pack(tmp_path))
        leak_into(mm, pack, lambda m: pack.REGISTRY.__setitem__("unet", m))
        mm.cleanup_models_gc()
        pack.REGISTRY.clear()
        sys.modules.pop("holder_pack", None)
    written = sorted(os.listdir(graphs))
    assert {name.rsplit(".", 1)[1] for name in written} == {"dot", "png"}
    assert all(mode_of(graphs / name) == 0o600 for name in written), {n: oct(mode_of(graphs / n)) for n in written}
    [png] = [name for name in written if name.endswith(".png")]
    [dot] = [name for name in written if name.endswith(".dot")]
    assert (graphs / png).read_text() == "PNG of [-Tpng] " + (graphs / dot).read_text()   # handed no file name


@pytest.mark.parametrize("version", VERSIONS)
def test_an_incomplete_search_says_so_and_is_retried_a_bounded_number_of_times(version, tmp_path, caplog):
    events = tmp_path / "events.jsonl"
    (tmp_path / "graphs").mkdir()
    with memx_on(version, leak_mode="strict", events=events, leak_budget="0.000001",
                 leak_graph=tmp_path / "graphs") as mm:
        pack = import_pack(write_pack(tmp_path))
        elsewhere = outside_packages(tmp_path)
        chain = [[[[{"deep": None}]]]]
        leak_into(mm, pack, lambda m: (chain[0][0][0][0].__setitem__("deep", m), elsewhere.HELD.append(chain)))
        for _ in in_prompts(leakwatch.MAX_TRIES + 2):
            mm.cleanup_models_gc()
        leaks = [e for e in read_events(events) if e["event"] == "leak"]
        # the probe spent the whole (tiny) allowance of the first prompt: the search waits for the next one
        assert [e["search"]["result"] for e in leaks] == ["deferred"] + ["incomplete"] * leakwatch.MAX_TRIES
        leaks = leaks[1:]
        assert [e["search"]["tries"] for e in leaks] == list(range(1, leakwatch.MAX_TRIES + 1))
        assert [e["search"]["retry"] for e in leaks] == [True] * (leakwatch.MAX_TRIES - 1) + [False]
        assert [e["event"] for e in read_events(events) if e["event"] == "leak_seen"]   # then only counted
        lines = [m for m in leak_lines(caplog) if "leaked model" in m][1:]
        assert all("no holder found within the budget" in m for m in lines)
        assert "searching again in the next prompt (try 2 of 4)" in lines[0]
        assert "not searched again automatically after 4 tries" in lines[-1]
        # only a complete search may say that the holder is out of its sight
        assert not any("C code" in m or "garbage collector can see" in m for m in leak_lines(caplog))
        assert os.listdir(str(tmp_path / "graphs")) == []        # no graph of a search that found nothing
        elsewhere.HELD.clear()
        sys.modules.pop("memx_strict_elsewhere", None)
        sys.modules.pop("holder_pack", None)



@pytest.mark.parametrize("fail,status", [("1", 3), ("0", 0)])
def test_leak_fail_exits_with_status_3_at_shutdown(tmp_path, fail, status):
    pack_dir = write_pack(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
    out = subprocess.run([sys.executable, "-m", "comfy_memx", "--leak-fail", fail,
                          os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                                       "leak_then_exit.py"),
                          shape_root("0.27.0"), str(pack_dir)], capture_output=True, text=True, env=env, timeout=120)
    assert "script finished" in out.stdout
    assert out.returncode == status, out.stderr
    if status == 3:
        assert "1 model(s) leaked with a rooted holder (BaseModel#1)" in out.stderr


@pytest.mark.parametrize("strict", VERSIONS, indirect=True)
def test_checks_outside_prompts_and_a_requested_search_do_not_count_as_changed_holders(strict):
    """A /free runs cleanup_models_gc outside any prompt, and its receipt searches the survivors: neither is a new
    sighting, and neither makes the next prompt's sighting look like a change of holders."""
    mm, pack, events, caplog = strict
    leak_into(mm, pack, lambda m: pack.REGISTRY.__setitem__("m", m))
    prompts = in_prompts(3)
    next(prompts)
    mm.cleanup_models_gc()
    [record] = [r for r in STATE.ledger.records() if r.leak]
    for _ in range(3):
        mm.cleanup_models_gc()                                  # outside prompts: /free, an embedding program
        found = leakwatch.search_now(record)                    # a /memx/free receipt's search
        assert [h["path"] for h in found["holders"]] == ["holder_pack.REGISTRY['m']"]
    for _ in prompts:
        mm.cleanup_models_gc()
    log = read_events(events)
    assert [e["event"] for e in log if e["event"].startswith("leak")] == ["leak", "leak_seen", "leak_seen"]
    assert record.leak["sightings"] == 3 and record.leak["searches"] == 4   # the first and the three asked for
    assert len([line for line in leak_lines(caplog) if "leaked model" in line]) == 1
    pack.REGISTRY.clear()
