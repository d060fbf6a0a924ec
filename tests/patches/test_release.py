"""Releasing leaked models through the real patch path (ComfyUI's cleanup_models_gc on both stand-in shapes): what
is cut, what is refused and why, and that a refusal or a failed cut loses nothing."""

import gc
import importlib.util
import os
import sys
import types
import weakref

import pytest

from comfy_memx.core import signals
from comfy_memx.core.state import STATE
from comfy_memx.leaks import release as releases
from comfy_memx.leaks import watch as leakwatch
from memx_helpers import memx_on, read_events

VERSIONS = ["0.3.64", "0.27.0"]
PACK = '''
"""A pack that keeps models the ways pack authors write caches, and the ways that are not caches."""
import collections
import functools

import comfy.model_base
import comfy.model_management
import comfy.model_patcher

REGISTRY = {}
KEPT = []
RECENT = collections.deque()
HOOKS = []
BUILT = []


class Loader:
    """A class-level cache keyed by resolution (the Qwen shape)."""
    _cache = {}

    def get(self, width, height):
        key = (width, height)
        if key not in type(self)._cache:
            type(self)._cache[key] = build()
        return type(self)._cache[key]


class Stubborn(dict):
    def __delitem__(self, key):
        raise RuntimeError("this cache refuses deletions")


class Registry:
    entries = Stubborn()


def build():
    import torch
    torch.manual_seed(2512)                 # the same file gives the same weights
    model = comfy.model_base.BaseModel(4, 1024)
    BUILT.append(1)
    return model


@functools.lru_cache(maxsize=None)
def load_unbounded(name):
    return build()


@functools.lru_cache(maxsize=8)
def load_bounded(name):
    return build()


def patcher_for(model):
    mm = comfy.model_management
    return comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                            offload_device=mm.unet_offload_device())


def make_callback(model):
    def callback():
        return model
    return callback
'''


def import_pack(tmp_path):
    folder = tmp_path / "custom_nodes" / "cache_pack"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PACK)
    spec = importlib.util.spec_from_file_location("cache_pack", os.path.join(folder, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["cache_pack"] = module
    return module


@pytest.fixture
def world(request, tmp_path):
    version, settings = request.param if isinstance(request.param, tuple) else (request.param, {})
    events = tmp_path / "events.jsonl"
    with memx_on(version, leak_mode="report", events=events, **dict({"release": "ask"}, **settings)) as mm:
        yield mm, import_pack(tmp_path), events
        sys.modules.pop("cache_pack", None)


def leak(mm, pack, hold, model=None):
    """Load a model, let ``hold(model)`` keep it, drop ComfyUI's patcher, and let ComfyUI warn; returns
    ``(weakref to the model, its ledger record)``."""
    model = pack.build() if model is None else model
    patcher = pack.patcher_for(model)
    mm.load_models_gpu([patcher])
    hold(model)
    probe = weakref.ref(model)
    del patcher, model
    gc.collect()
    mm.cleanup_models_gc()
    record = next(r for r in STATE.ledger.records() if r.module_ref() is probe())
    assert record.leak is not None and record.leak["stage"] == "rooted"
    return probe, record


def release_events(events):
    return [e for e in read_events(events) if e["event"] == "release"]


CACHES = {
    "class_cache": (lambda p, m: p.Loader._cache.__setitem__((1024, 1024), m),
                    "cache_pack.Loader._cache[(1024, 1024)]", "dict_entry"),
    "module_registry": (lambda p, m: p.REGISTRY.__setitem__("qwen_2512.safetensors", ("unet", m)),
                        "cache_pack.REGISTRY['qwen_2512.safetensors']", "dict_entry"),
    "appended_list": (lambda p, m: (p.KEPT.append(object()), p.KEPT.append(m)), "cache_pack.KEPT[1]", "list_entry"),
    "appended_deque": (lambda p, m: p.RECENT.append(m), "cache_pack.RECENT[0]", "list_entry"),
}


@pytest.mark.parametrize("shape", sorted(CACHES))
@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_cache_entry_is_cut_and_the_model_dies(world, shape):
    mm, pack, events = world
    hold, cut, method = CACHES[shape]
    probe, record = leak(mm, pack, lambda m: hold(pack, m))
    others = len(pack.KEPT)
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "released", receipt
    assert receipt["cut"] == cut and receipt["method"] == method and receipt["package"] == "cache_pack"
    assert receipt["died"] is True and probe() is None
    assert receipt["bytes"] > 0 and set(receipt["memory"]) == {"before", "after", "trim_returned_bytes"}
    assert receipt["memory"]["after"]["rss"] > 0
    if shape == "appended_list":
        assert len(pack.KEPT) == others - 1 and type(pack.KEPT[0]) is object   # only that entry went
    [event] = release_events(events)
    assert event["model_id"] == record.model_id and event["outcome"] == "released"


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_the_pack_rebuilds_a_released_entry_the_same_way(world):
    mm, pack, _ = world
    loader = pack.Loader()
    weights = [p.detach().clone() for p in loader.get(512, 512).parameters()]
    probe, record = leak(mm, pack, lambda m: None, model=loader.get(512, 512))
    assert releases.release(record, "http")["outcome"] == "released" and probe() is None
    assert (512, 512) not in pack.Loader._cache
    again = [p.detach().clone() for p in loader.get(512, 512).parameters()]
    assert pack.BUILT == [1, 1] and (512, 512) in pack.Loader._cache
    assert len(again) == len(weights) > 0 and all(bool((a == b).all()) for a, b in zip(weights, again))


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_an_unbounded_lru_cache_loses_only_that_entry(world):
    mm, pack, _ = world
    keep = pack.load_unbounded("other")
    probe, record = leak(mm, pack, lambda m: None, model=pack.load_unbounded("qwen"))
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "released" and receipt["method"] == "lru_entry", receipt
    assert receipt["other_entries_dropped"] == 0 and probe() is None
    assert pack.load_unbounded.cache_info().currsize == 1 and pack.load_unbounded("other") is keep
    assert pack.load_unbounded("qwen") is not None   # recomputed
    del keep


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_bounded_lru_cache_is_cleared_and_the_receipt_counts_the_others(world):
    mm, pack, _ = world
    pack.load_bounded("a")
    pack.load_bounded("b")
    probe, record = leak(mm, pack, lambda m: None, model=pack.load_bounded("qwen"))
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "released" and receipt["method"] == "lru_cache_clear", receipt
    assert receipt["other_entries_dropped"] == 2 and probe() is None
    assert pack.load_bounded.cache_info().currsize == 0


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_changed_container_answers_changed_and_nothing_is_cut(world):
    mm, pack, events = world
    probe, record = leak(mm, pack, lambda m: pack.Loader._cache.__setitem__((1024, 1024), m))
    old = pack.Loader._cache
    pack.Loader._cache = dict(old)          # the pack replaced its cache: same entries, another container
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "changed" and receipt["cut"] is None, receipt
    assert "nothing was cut" in receipt["reason"]
    assert probe() is not None and pack.Loader._cache[(1024, 1024)] is probe() and old[(1024, 1024)] is probe()
    pack.Loader._cache[(1024, 1024)] = object()  # ... and an entry that now holds something else
    pack.Loader._cache = old
    old[(1024, 1024)] = ("wrapped", probe())
    assert releases.release(record, "http")["outcome"] == "changed"
    assert old[(1024, 1024)][1] is probe()
    assert [e["outcome"] for e in release_events(events)] == ["changed", "changed"]


REFUSED = {
    "callback_registry": (lambda p, m: p.HOOKS.append(p.make_callback(m)), "registry of callbacks"),
    "comfyui_cache": None,
}


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_callback_registry_is_refused_with_the_pack_fix(world):
    mm, pack, events = world
    probe, record = leak(mm, pack, lambda m: pack.HOOKS.append(pack.make_callback(m)))
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "refused" and receipt["pattern"] == "callback_registry", receipt
    assert "callbacks" in receipt["reason"] and "unregister the callback" in receipt["fix"]
    assert len(pack.HOOKS) == 1 and pack.HOOKS[0]() is probe()   # untouched
    assert receipt["memory"] is None and receipt["cut"] is None


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_model_that_comfyuis_loaded_list_uses_is_refused(world):
    mm, pack, _ = world
    in_use = pack.patcher_for(pack.build())   # a node's MODEL output around the same module, loaded again
    probe, record = leak(mm, pack, lambda m: pack.Loader._cache.__setitem__((768, 768), m), model=in_use.model)
    mm.load_models_gpu([in_use])
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "in_use" and "loaded list" in receipt["reason"], receipt
    assert pack.Loader._cache[(768, 768)] is probe()
    del in_use
    gc.collect()
    assert releases.release(record, "http")["outcome"] == "released" and probe() is None


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_model_loaded_by_the_running_prompt_is_refused(world, monkeypatch):
    mm, pack, _ = world
    call = signals.prompt.before("p-running", {"1": {"class_type": "Loader"}})
    try:
        probe, record = leak(mm, pack, lambda m: pack.REGISTRY.__setitem__("unet", m))
    finally:
        signals.prompt.after(call)
    assert record.owner.prompt_id == "p-running"
    queue = types.SimpleNamespace(currently_running={7: (7, "p-running", {}, {}, [])})
    server = types.SimpleNamespace(PromptServer=types.SimpleNamespace(instance=types.SimpleNamespace(prompt_queue=queue)))
    monkeypatch.setitem(sys.modules, "server", server)
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "in_use" and "p-running" in receipt["reason"], receipt
    assert pack.REGISTRY["unet"] is probe()
    queue.currently_running.clear()
    assert releases.release(record, "http")["outcome"] == "released" and probe() is None


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_container_whose_delitem_raises_loses_nothing(world):
    mm, pack, events = world
    probe, record = leak(mm, pack, lambda m: pack.Registry.entries.__setitem__("unet", m))
    receipt = releases.release(record, "http")
    assert receipt["outcome"] == "failed" and "refuses deletions" in receipt["reason"], receipt
    assert "nothing was cut" in receipt["reason"] and receipt["cut"] is None
    assert dict(pack.Registry.entries) == {"unet": probe()}


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_second_holder_is_named_after_the_cut(world):
    mm, pack, _ = world
    probe, record = leak(mm, pack, lambda m: (pack.Loader._cache.__setitem__((1, 1), m),
                                              pack.HOOKS.append(pack.make_callback(m))))
    receipt = releases.release(record, "http", path="cache_pack.Loader._cache[(1, 1)]")
    assert receipt["outcome"] == "survivor" and receipt["died"] is False, receipt
    assert receipt["next_holder"]["path"].startswith("cache_pack.HOOKS[0]")
    assert (1, 1) not in pack.Loader._cache and probe() is not None
    pack.HOOKS.clear()
    gc.collect()
    assert probe() is None   # the receipt, the book and the ledger kept nothing


@pytest.mark.parametrize("world", [(v, {"release": "auto", "release_packages": "cache_pack"}) for v in VERSIONS],
                         indirect=True)
def test_auto_releases_an_opted_in_pack_at_the_warning(world):
    mm, pack, events = world
    model = pack.build()
    patcher = pack.patcher_for(model)
    mm.load_models_gpu([patcher])
    pack.Loader._cache[(1328, 1328)] = model
    probe = weakref.ref(model)
    del patcher, model
    gc.collect()
    mm.cleanup_models_gc()                  # ComfyUI warns: the release follows at once
    assert probe() is None and (1328, 1328) not in pack.Loader._cache
    [event] = release_events(events)
    assert event["trigger"] == "auto" and event["outcome"] == "released" and event["cut"].endswith("[(1328, 1328)]")


@pytest.mark.parametrize("world", [(v, {"release": "auto", "release_packages": "another_pack"}) for v in VERSIONS],
                         indirect=True)
def test_auto_leaves_a_pack_that_is_not_opted_in(world):
    mm, pack, events = world
    probe, record = leak(mm, pack, lambda m: pack.Loader._cache.__setitem__((1, 1), m))
    assert probe() is not None and pack.Loader._cache[(1, 1)] is probe()
    assert release_events(events) == []
    mm.cleanup_models_gc()
    assert probe() is not None


def test_a_release_keeps_nothing_after_it(tmp_path):
    with memx_on("0.27.0", leak_mode="report", release="ask") as mm:
        pack = import_pack(tmp_path)
        try:
            probe, record = leak(mm, pack, lambda m: pack.KEPT.append(m))
            receipt = releases.release(record, "http")
            assert receipt["outcome"] == "released" and probe() is None
            assert leakwatch.public_state(record.leak) is not None   # the record is data, not the model
        finally:
            sys.modules.pop("cache_pack", None)
