"""Tests of comfy_memx.leaks.holders: holder chains, cycle capture, bounds, and that the search keeps nothing alive."""

import ctypes
import gc
import importlib.util
import json
import os
import sys
import threading
import types
import weakref

import pytest

from comfy_memx.leaks.holders import (ROOT_C_REGISTRY, ROOT_CLASS_ATTRIBUTE, ROOT_MODULE_GLOBAL, ROOT_THREAD_FRAME,
                                CycleReport, HolderReport, capture_cycle, find_holders, investigate, package_of,
                                safe_repr, to_dot)
from comfy_memx.leaks.holders.packages import display_module_name
from comfy_memx.leaks.holders.probe import refcount_calibrated

# Where reference counts name every holder (CPython >= 3.11) a probe that explains them all saves every heap scan;
# on 3.10 the same chains come with a backward search from every object the probe connected to the target.
SHORTCUT = refcount_calibrated()
PROBE_ALONE = "skipped" if SHORTCUT else "remaining"

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "holder_fixtures")
CUSTOM_NODES = os.path.join(FIXTURES, "custom_nodes")


class FakeModel:
    """Stands in for a torch module: hashable, with a method a pack can register as a hook."""

    def preview(self, latent):
        return latent


class Node:
    pass


def load_like_comfyui(path):
    """Import a custom node the way ComfyUI's nodes.load_custom_node names it (module name = its path)."""
    if os.path.isfile(path):
        name, init = os.path.splitext(path)[0], path
    else:
        name, init = path.replace(".", "_x_"), os.path.join(path, "__init__.py")
    spec = importlib.util.spec_from_file_location(name, init)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _unload(module):
    prefix = module.__name__
    for name in [name for name in sys.modules if name == prefix or name.startswith(prefix + ".")]:
        del sys.modules[name]


@pytest.fixture(scope="module")
def some_pack():
    module = load_like_comfyui(os.path.join(CUSTOM_NODES, "some_pack"))
    yield module
    _unload(module)


@pytest.fixture(scope="module")
def other_pack():
    module = load_like_comfyui(os.path.join(CUSTOM_NODES, "other_pack.py"))
    yield module
    _unload(module)


@pytest.fixture
def scratch():
    """A throw-away module in sys.modules for ad-hoc module globals."""
    module = types.ModuleType("memx_holders_scratch")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]
    module.__dict__.clear()


@pytest.fixture
def no_auto_gc():
    """Keep the automatic collector from destroying a cycle before the test captures it."""
    was_enabled = gc.isenabled()
    gc.disable()
    yield
    if was_enabled:
        gc.enable()


def paths(report):
    return [chain.path for chain in report.chains]


def chain_at(report, path):
    matches = [chain for chain in report.chains if chain.path == path]
    assert matches, f"{path!r} not among {paths(report)}"
    return matches[0]


# --- chains through every kind of edge -------------------------------------------------------------------

EDGE_KINDS = [
    ("class_cache", "some_pack.model.QwenImageModel._cache['qwen_2512.safetensors_1024']", ROOT_CLASS_ATTRIBUTE),
    ("bound_method", "some_pack.HOOKS['preview'].__self__", ROOT_MODULE_GLOBAL),
    ("closure", "some_pack.CALLBACKS[0] -> closure 'model'", ROOT_MODULE_GLOBAL),
    ("lru_cache", "some_pack.load_model -> lru_cache['qwen']", ROOT_MODULE_GLOBAL),
    ("instance_dict", "some_pack.STATE.current", ROOT_MODULE_GLOBAL),
    ("slots", "some_pack.SLOTS.model", ROOT_MODULE_GLOBAL),
    ("list_tuple", "some_pack.RECENT[1][1]", ROOT_MODULE_GLOBAL),
    ("set_member", "some_pack.SEEN -> set member.model", ROOT_MODULE_GLOBAL),
    ("dict_key", "some_pack.BY_MODEL -> dict key", ROOT_MODULE_GLOBAL),
    ("traceback_frame", "some_pack.LAST_ERROR[0].__traceback__.tb_frame.f_locals['model']", ROOT_MODULE_GLOBAL),
    ("generator", "some_pack.GENERATORS[0] -> generator local 'model'", ROOT_MODULE_GLOBAL),
    ("module_global", "some_pack.CURRENT", ROOT_MODULE_GLOBAL),
    ("hostile", "some_pack.HOSTILE[0][<some_pack.HostileHolder object (repr raised RuntimeError)>].held",
     ROOT_MODULE_GLOBAL),
    ("huge_list", "some_pack.BIG[1000000]", ROOT_MODULE_GLOBAL),
]


@pytest.mark.parametrize("kind, expected, root_kind", EDGE_KINDS, ids=[kind for kind, _, _ in EDGE_KINDS])
def test_chain_names_each_edge_kind_and_the_pack(some_pack, kind, expected, root_kind):
    model = FakeModel()
    alive = weakref.ref(model)
    some_pack.hold(kind, model)
    try:
        report = find_holders(model)
    finally:
        some_pack.release()
    chain = chain_at(report, expected)
    assert (chain.package, chain.root_kind, chain.stage) == ("some_pack", root_kind, "probe")
    assert report.complete and report.stage == "rooted"
    del model
    assert alive() is None, "the search kept the model alive"


def test_two_independent_holders_are_both_reported(some_pack, other_pack):
    model = FakeModel()
    some_pack.hold("class_cache", model)
    some_pack.hold("bound_method", model)
    other_pack.LAST.append(model)
    try:
        report = find_holders(model)
    finally:
        some_pack.release()
        other_pack.LAST.clear()
    packages = {chain.path: (chain.package, chain.stage) for chain in report.chains}
    assert packages == {
        "some_pack.model.QwenImageModel._cache['qwen_2512.safetensors_1024']": ("some_pack", "probe"),
        "some_pack.HOOKS['preview'].__self__": ("some_pack", "probe"),
        "other_pack.LAST[0]": ("other_pack", "probe"),
    }
    assert report.complete and report.stages["backward"]["mode"] == PROBE_ALONE
    assert report.scans == 0 or not SHORTCUT


def test_one_module_holding_the_model_twice_gives_two_chains(scratch):
    model = FakeModel()
    scratch.current = scratch.previous = model
    report = find_holders(model)
    assert sorted(paths(report)) == ["memx_holders_scratch.current", "memx_holders_scratch.previous"]


def test_core_and_top_level_packages(scratch):
    spec = importlib.util.spec_from_file_location("memx_fixture_core", os.path.join(FIXTURES, "fake_core.py"))
    core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(core)
    sys.modules["memx_fixture_core"] = core
    model = FakeModel()
    core.CACHE["unet"] = model
    scratch.model = model
    try:
        report = find_holders(model, comfy_root=FIXTURES)
    finally:
        del sys.modules["memx_fixture_core"]
        core.CACHE.clear()
    assert chain_at(report, "memx_fixture_core.CACHE['unet']").package == "core"
    assert chain_at(report, "memx_holders_scratch.model").package == "memx_holders_scratch"


# --- hostile and huge holders ----------------------------------------------------------------------------

class Hostile:
    """Every hook a careless search would call raises."""

    def __getattribute__(self, name):
        raise RuntimeError(f"hostile __getattribute__({name})")

    def __repr__(self):
        raise RuntimeError("hostile __repr__")

    def __eq__(self, other):
        raise RuntimeError("hostile __eq__")

    __hash__ = object.__hash__


def test_holders_whose_repr_getattr_and_eq_raise(scratch):
    model = FakeModel()
    holder = Hostile()
    object.__setattr__(holder, "model", model)
    scratch.REGISTRY = {Hostile(): holder}
    scratch.ROW = [Hostile(), Hostile(), model]
    report = find_holders(model)
    assert "memx_holders_scratch.ROW[2]" in paths(report)
    keyed = [path for path in paths(report) if path.startswith("memx_holders_scratch.REGISTRY[")]
    assert keyed == [f"memx_holders_scratch.REGISTRY[<{__name__}.Hostile object (repr raised RuntimeError)>].model"]


def test_a_million_element_list_on_the_path(scratch):
    model = FakeModel()
    scratch.BIG = [None] * 1_000_000
    scratch.BIG.append(model)
    report = find_holders(model)
    assert report.complete
    assert paths(report) == ["memx_holders_scratch.BIG[1000000]"]


def test_object_with_no_gc_visible_holder_is_a_c_registry_root():
    model = FakeModel()
    holder = Node()
    holder.model = model
    holder_ref = weakref.ref(holder)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(holder))  # a reference only C code knows about
    del holder
    try:
        report = find_holders(model)
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(holder_ref()))
    chain = chain_at(report, f"<C-held {__name__}.Node>.model")
    assert chain.root_kind == ROOT_C_REGISTRY


def test_objects_the_caller_holds_are_not_c_held():
    model = FakeModel()
    holder = Node()
    holder.model = model
    report = find_holders(model)
    assert report.chains == [] and report.complete


# --- threads and the caller's frames ---------------------------------------------------------------------

def _worker(inbox, holding, finish):
    model = inbox.pop()
    holding.set()
    finish.wait(30)
    del model


def test_a_thread_holding_the_model_in_a_local_variable():
    model = FakeModel()
    alive = weakref.ref(model)
    holding, finish = threading.Event(), threading.Event()
    worker = threading.Thread(target=_worker, args=([model], holding, finish), name="memx-holder-worker")
    worker.start()
    try:
        assert holding.wait(30)
        report = find_holders(model)
    finally:
        finish.set()
        worker.join(30)
    chain = chain_at(report, f"thread 'memx-holder-worker' frame {_worker.__module__}._worker local 'model'")
    assert chain.root_kind == ROOT_THREAD_FRAME
    del worker, model
    assert alive() is None


def test_the_callers_own_frame_is_not_a_holder():
    model = FakeModel()
    report = find_holders(model)
    assert report.chains == [] and report.complete
    assert "no gc-visible holder" in report.note


def _search_from_a_wrapper(target, **kwargs):
    return find_holders(target, **kwargs)


def test_outer_frames_of_the_calling_thread_are_searched():
    model = FakeModel()
    report = _search_from_a_wrapper(model)
    here = f"thread 'MainThread' frame {__name__}.test_outer_frames_of_the_calling_thread_are_searched local 'model'"
    assert chain_at(report, here).root_kind == ROOT_THREAD_FRAME
    assert find_holders(model, ignore_frames_up_to=sys._getframe()).chains == []
    alive = weakref.ref(model)
    del model
    assert alive() is None, "reading this frame's locals kept the model alive"


def test_ignored_ledger_weakrefs_finalizers_and_old_reports_are_not_holders(scratch):
    model = FakeModel()
    alive = weakref.ref(model)
    ledger = {"record": Node()}
    ledger["record"].model = model
    scratch.LEDGER = ledger
    bookkeeping = Node()
    bookkeeping.real_model = weakref.ref(model)
    bookkeeping.model_finalizer = weakref.finalize(model, print, "collected")
    scratch.LOADED = [bookkeeping]
    scratch.OLD_REPORTS = [find_holders(model, ignore=[ledger])]
    report = find_holders(model, ignore=[ledger])
    assert report.chains == [] and report.complete
    bookkeeping.model_finalizer.detach()
    scratch.LEDGER = None
    del ledger, model
    assert alive() is None


# --- bounds ----------------------------------------------------------------------------------------------

def test_an_exhausted_budget_reports_incomplete_without_scanning(scratch):
    model = FakeModel()
    scratch.model = model
    report = find_holders(model, budget_s=0.0)
    assert (report.complete, report.stopped_by, report.scans) == (False, "budget", 0)


def test_the_depth_limit_reports_incomplete_with_what_it_found(scratch):
    model = FakeModel()
    scratch.shallow = model
    deep = model
    for _ in range(12):
        deep = [deep]
    scratch.deep = deep
    del deep
    report = find_holders(model, max_depth=5)
    assert (report.complete, report.stopped_by) == (False, "depth")
    assert paths(report) == ["memx_holders_scratch.shallow"]
    assert find_holders(model, max_depth=20).complete


class Slotted:
    __slots__ = ("model",)


def test_a_wide_fan_in_still_yields_a_chain_within_the_budget(scratch):
    model = FakeModel()
    holders = []
    for _ in range(3000):
        holders.append(Slotted())
        holders[-1].model = model
    scratch.ALL = holders
    del holders
    report = find_holders(model, budget_s=2.0)
    assert any(path.startswith("memx_holders_scratch.ALL[") and path.endswith("].model") for path in paths(report))
    assert report.complete or report.stopped_by == "budget"


def test_max_chains_stops_early(scratch):
    model = FakeModel()
    scratch.a = model
    scratch.more = [model, model]
    report = find_holders(model, max_chains=1)
    assert (len(report.chains), report.complete, report.stopped_by) == (1, False, "max_chains")


# --- two stages: cycle and rooted ------------------------------------------------------------------------

def test_a_model_held_only_by_a_cycle_is_reported_as_cycle_after_the_collect(no_auto_gc):
    model = FakeModel()
    alive = weakref.ref(model)
    first, second = Node(), Node()
    first.peer, second.peer = second, first
    first.model = model
    del first, second, model
    reports = investigate([alive], gc.collect)
    assert alive() is None
    (report,) = reports
    assert isinstance(report, CycleReport)
    assert (report.stage, report.collected, report.chains) == ("cycle", True, [])
    assert report.members[0] == f"{__name__}.FakeModel"
    assert {label for _, label, _ in report.edges} == {".peer", ".model"}
    assert report.text.count("--.peer-->") == 2 and f"--.model--> {__name__}.FakeModel#0" in report.text


def test_a_model_in_its_own_cycle(no_auto_gc):
    model = FakeModel()
    model.me = model
    alive = weakref.ref(model)
    del model
    (report,) = investigate([alive], gc.collect)
    assert report.stage == "cycle" and report.collected
    assert report.edges == [(0, ".me", 0)]


def test_a_rooted_model_survives_the_collect_and_gets_chains(scratch, no_auto_gc):
    model = FakeModel()
    scratch.keep = model
    alive = weakref.ref(model)
    del model
    (report,) = investigate([alive], gc.collect)
    assert isinstance(report, HolderReport) and report.stage == "rooted"
    assert paths(report) == ["memx_holders_scratch.keep"]


def test_capture_cycle_of_a_rooted_model_lists_its_roots(scratch):
    model = FakeModel()
    scratch.keep = model
    report = capture_cycle(model)
    assert report.members == [] and "no reference cycle" in report.text
    assert [chain.path for chain in report.chains] == ["memx_holders_scratch.keep"]


# --- reports and helpers ---------------------------------------------------------------------------------

def test_reports_serialise_and_draw(scratch, no_auto_gc):
    model = FakeModel()
    scratch.keep = model
    rooted = find_holders(model)
    data = json.loads(rooted.to_json())
    assert data["chains"][0]["path"] == "memx_holders_scratch.keep" and data["stage"] == "rooted"
    assert "memx_holders_scratch.keep" in to_dot(rooted) and "memx_holders_scratch.keep" in str(rooted)
    pair = Node(), Node()
    pair[0].peer, pair[1].peer = pair[1], pair[0]
    pair[0].model = model
    cycle = capture_cycle(model)
    assert json.loads(cycle.to_json())["stage"] == "cycle"
    assert to_dot(cycle).count("->") == len(cycle.edges) == 3


def test_package_of_paths():
    root = os.path.join(os.sep, "srv", "ComfyUI")
    assert package_of(os.path.join(root, "custom_nodes", "some_pack", "nodes", "x.py"), root) == "some_pack"
    assert package_of(os.path.join(root, "custom_nodes", "single_node.py"), root) == "single_node"
    assert package_of(os.path.join(root, "comfy", "model_management.py"), root) == "core"
    assert package_of("comfy_memx.leaks.holders") == "comfy_memx"
    assert package_of(json) == "json"


def test_package_of_uses_sys_path_for_files_outside_comfyui(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_of(str(tmp_path / "somelib" / "sub" / "mod.py"), comfy_root=None) == "somelib"


def test_comfyui_path_module_names_are_shortened():
    assert display_module_name("/srv/ComfyUI/custom_nodes/some_pack.model") == "some_pack.model"
    assert display_module_name("comfy.model_management") == "comfy.model_management"


def test_safe_repr_never_raises_and_truncates():
    assert safe_repr("x" * 100, limit=10) == "'xxxxxx..."
    assert safe_repr(("a", 1)) == "('a', 1)"
    assert "repr raised RuntimeError" in safe_repr(Hostile())

    class NotAString:
        def __repr__(self):
            return 42

    assert "repr raised TypeError" in safe_repr(NotAString())


# --- the forward probe: same chains, found without a heap scan when the packages own them -----------

def triples(report):
    return sorted((chain.path, chain.package, chain.root_kind) for chain in report.chains)


PROBE_KINDS = [kind for kind, _, _ in EDGE_KINDS] + ["thread_local"]


@pytest.mark.parametrize("kind", PROBE_KINDS)
def test_the_probe_labels_every_chain_exactly_as_the_backward_search(some_pack, kind):
    model = FakeModel()
    alive = weakref.ref(model)
    some_pack.hold(kind, model)
    try:
        backward = find_holders(model, probe=False)
        probed = find_holders(model)
    finally:
        some_pack.release()
    assert triples(probed) == triples(backward) and len(probed.chains) == 1
    assert [chain.stage for chain in probed.chains] == ["probe"]
    assert [chain.stage for chain in backward.chains] == ["backward"]
    assert probed.stages["probe"]["reached"] and probed.stages["backward"]["mode"] == PROBE_ALONE
    if SHORTCUT:
        assert (probed.stages["probe"]["unexplained"], probed.scans) == (0, 0)
    assert (backward.stages["backward"]["mode"], "probe" in backward.stages) == ("full", False)
    assert backward.scans >= 1 and probed.complete and backward.complete
    del model
    assert alive() is None, "the probe kept the model alive"


def test_a_threading_local_of_a_pack_is_probed(some_pack):
    model = FakeModel()
    some_pack.hold("thread_local", model)
    try:
        report = find_holders(model)
    finally:
        some_pack.release()
    (chain,) = report.chains
    assert chain.path == "some_pack.TLS -> thread-local.model"   # no weak reference's address in the path
    assert (chain.root_kind, chain.stage) == (ROOT_MODULE_GLOBAL, "probe")


def test_a_holder_outside_the_packages_is_left_to_the_backward_search(some_pack, scratch):
    model = FakeModel()
    alive = weakref.ref(model)
    some_pack.hold("bound_method", model)
    scratch.ELSEWHERE = {"k": model}
    try:
        report = find_holders(model)
        backward = find_holders(model, probe=False)
    finally:
        some_pack.release()
        scratch.ELSEWHERE = None
    assert {chain.path: chain.stage for chain in report.chains} == {
        "some_pack.HOOKS['preview'].__self__": "probe", "memx_holders_scratch.ELSEWHERE['k']": "backward"}
    assert triples(report) == triples(backward)
    assert report.stages["backward"]["mode"] == "remaining" and report.complete
    if SHORTCUT:   # only the model had a holder the probe did not see: the backward search climbed from it alone,
        # and the dict above it is held by a module global alone, which counting names without a second scan
        assert (report.stages["probe"]["unexplained"], report.scans) == (1, 1)
    assert report.search_summary()["found_by"] == {"probe": 1, "backward": 1}
    del model
    assert alive() is None


def test_a_holder_of_an_object_on_the_probed_chain_is_found_too(some_pack, scratch):
    """The holder the probe misses sits above the model: the backward search climbs from that object."""
    model = FakeModel()
    some_pack.hold("instance_dict", model)
    scratch.ALSO = [some_pack.STATE]
    try:
        report = find_holders(model)
        backward = find_holders(model, probe=False)
    finally:
        some_pack.release()
        scratch.ALSO = None
    assert {chain.path: chain.stage for chain in report.chains} == {
        "some_pack.STATE.current": "probe", "memx_holders_scratch.ALSO[0].current": "backward"}
    assert triples(report) == triples(backward)
    assert report.stages["backward"]["mode"] == "remaining" and report.complete


def test_a_reference_nobody_can_see_costs_a_scan_never_a_holder(some_pack):
    model = FakeModel()
    some_pack.hold("module_global", model)
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(model))
    try:
        report = find_holders(model)
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(model))
        some_pack.release()
    assert [(chain.path, chain.stage) for chain in report.chains] == [("some_pack.CURRENT", "probe")]
    assert report.stages["backward"]["mode"] == "remaining" and report.complete
    if SHORTCUT:
        assert (report.stages["probe"]["unexplained"], report.scans) == (1, 1)


def test_a_thread_holding_a_probed_model_is_named_by_the_probe(some_pack):
    model = FakeModel()
    holding, finish = threading.Event(), threading.Event()
    some_pack.hold("module_global", model)
    worker = threading.Thread(target=_worker, args=([model], holding, finish), name="memx-probe-worker")
    worker.start()
    try:
        assert holding.wait(30)
        report = find_holders(model)
    finally:
        finish.set()
        worker.join(30)
        some_pack.release()
    assert {chain.path: (chain.root_kind, chain.stage) for chain in report.chains} == {
        "some_pack.CURRENT": (ROOT_MODULE_GLOBAL, "probe"),
        f"thread 'memx-probe-worker' frame {__name__}._worker local 'model'": (ROOT_THREAD_FRAME, "probe")}
    assert report.stages["backward"]["mode"] == PROBE_ALONE


def test_a_model_the_probe_cannot_reach_is_searched_from_scratch(scratch):
    model = FakeModel()
    alive = weakref.ref(model)
    scratch.model = model
    report = find_holders(model)
    assert [(chain.path, chain.stage) for chain in report.chains] == [("memx_holders_scratch.model", "backward")]
    assert report.stages["probe"]["reached"] is False and report.stages["backward"]["mode"] == "full"
    scratch.model = None
    del model
    assert alive() is None


def test_the_probe_does_not_enter_tensors(some_pack):
    torch = pytest.importorskip("torch")
    model = FakeModel()
    tensor = torch.zeros(2)
    tensor.owner = model                        # a tensor's own attribute: the probe stops at tensors
    some_pack.CURRENT = tensor
    del tensor
    try:
        report = find_holders(model)
    finally:
        some_pack.release()
    (chain,) = report.chains
    assert chain.path == "some_pack.CURRENT.owner"
    assert chain.stage == "backward" and report.stages["probe"]["reached"] is False


def test_no_probe_and_a_zero_probe_budget_are_the_backward_search_alone(some_pack):
    model = FakeModel()
    some_pack.hold("closure", model)
    try:
        reports = [find_holders(model, probe=False), find_holders(model, probe_budget_s=0.0)]
    finally:
        some_pack.release()
    for report in reports:
        assert [(chain.path, chain.stage) for chain in report.chains] == [
            ("some_pack.CALLBACKS[0] -> closure 'model'", "backward")]
        assert report.stages["backward"]["mode"] == "full" and "probe" not in report.stages


def test_the_probe_respects_max_chains(some_pack):
    model = FakeModel()
    for kind in ("class_cache", "bound_method", "closure"):
        some_pack.hold(kind, model)
    try:
        report = find_holders(model, max_chains=2)
    finally:
        some_pack.release()
    assert (len(report.chains), report.complete, report.stopped_by) == (2, False, "max_chains")
    assert {chain.stage for chain in report.chains} == {"probe"}


def test_a_chain_that_no_longer_holds_is_not_reported_by_the_probe(some_pack, monkeypatch):
    """Each reference of a probe chain is checked again; a changed graph leaves the model to the backward search."""
    from comfy_memx.leaks.holders import probe as probe_module
    model = FakeModel()
    some_pack.hold("closure", model)
    monkeypatch.setattr(probe_module, "_holds", lambda holder, child: False)
    try:
        report = find_holders(model)
    finally:
        some_pack.release()
    assert [(chain.path, chain.stage) for chain in report.chains] == [
        ("some_pack.CALLBACKS[0] -> closure 'model'", "backward")]
    assert report.stages["backward"]["mode"] == "full"


def test_a_failing_probe_leaves_the_search_to_the_backward_stage(some_pack, monkeypatch):
    from comfy_memx.core.state import STATE
    from comfy_memx.leaks.holders import probe as probe_module

    def broken(self, deadline):
        raise RuntimeError("probe bug")

    monkeypatch.setattr(probe_module.Probe, "_walk", broken)
    STATE.errors.raise_internal = False
    model = FakeModel()
    alive = weakref.ref(model)
    some_pack.hold("bound_method", model)
    try:
        report = find_holders(model)
    finally:
        some_pack.release()
    assert [(chain.path, chain.stage) for chain in report.chains] == [
        ("some_pack.HOOKS['preview'].__self__", "backward")]
    del model
    assert alive() is None


def test_the_probe_holds_nothing_after_the_search(some_pack, scratch):
    """Whatever path the search takes (probe alone, probe then backward), nothing it met is kept."""
    model = FakeModel()
    alive = weakref.ref(model)
    some_pack.hold("instance_dict", model)
    state_refs = sys.getrefcount(some_pack.STATE)
    scratch.extra = None
    assert find_holders(model).stages["backward"]["mode"] == PROBE_ALONE
    scratch.extra = [model]
    assert find_holders(model).stages["backward"]["mode"] == "remaining"
    scratch.extra = None
    now = sys.getrefcount(some_pack.STATE)   # outside the assert: pytest's rewriting keeps its operands in locals
    assert now == state_refs, "an object on the chain is still referenced"
    some_pack.release()
    del model
    assert alive() is None


def test_the_interpreter_counts_references_as_the_probe_expects():
    assert refcount_calibrated() is (sys.version_info >= (3, 11))


def test_the_search_summary_is_json_with_each_stage(some_pack):
    model = FakeModel()
    some_pack.hold("lru_cache", model)
    try:
        report = find_holders(model)
    finally:
        some_pack.release()
    summary = json.loads(json.dumps(report.search_summary()))
    assert summary["found_by"] == {"probe": 1, "backward": 0} and summary["complete"] is True
    assert summary["stages"]["probe"]["phases"] == (["packages"] if SHORTCUT else ["packages", "core"])
    assert summary["stages"]["backward"]["mode"] == PROBE_ALONE and summary["stages"]["backward"]["chains"] == 0
    assert "(module_global, probe)" in str(report) and f"backward search {PROBE_ALONE}" in str(report)
