"""Leaks ComfyUI never warns about, on the stand-in PromptServer with its real prompt worker: a model a pack keeps
after ``/memx/free`` or an unload took it out of ComfyUI's loaded list (a module in a module-level list, a hoarded
ModelPatcher) is a leak with its holder, in ``/memx/models``, the events and the metrics, counted once; a model
nothing holds, one ComfyUI's own output cache holds and one loaded again are not."""

import gc
import os
import shutil
import sys
import weakref

import pytest

from comfy_memx.core.state import STATE
from fake_comfy.loader import PACKS_DIR
from memx_helpers import read_events
from test_routes import leaky, serve

VERSIONS = ["0.3.64", "0.27.0"]


async def add_packs(tmp_path, *names):
    """Install more test packs (beside leaky_pack) with the stand-in's own custom-node loader."""
    import nodes
    for name in names:
        target = tmp_path / "custom_nodes" / name
        shutil.copytree(os.path.join(PACKS_DIR, name), target)
        assert await nodes.load_custom_node(str(target)) is not False


def pack(name):
    """The hoarding pack this test's server loaded (the stand-in registers a pack under its path)."""
    import nodes
    return sys.modules[nodes.NODE_CLASS_MAPPINGS["PatcherHoarder"].__module__]


def loaded_by(class_type, name):
    return {"1": {"class_type": class_type, "inputs": {"name": name, "tensor_count": 4, "tensor_numel": 1024}},
            "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}


def unloaded_by_a_node(class_type, name):
    """Load a model, sample with it, then unload every model from a pack's node (as ComfyUI-Unload-Model does)."""
    return {**loaded_by(class_type, name), "3": {"class_type": "UnloadAllModels", "inputs": {"value": ["2", 0]}}}


async def metrics(comfy):
    parser = pytest.importorskip("prometheus_client.parser")
    response = await comfy.client.get("/memx/metrics")
    assert response.status == 200
    text = await response.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(text) for s in family.samples}


def by_name(values, name):
    return {labels: value for (metric, labels), value in values.items() if metric == name}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_model_a_pack_keeps_after_memx_free_is_a_leak_with_its_holder_counted_once(version, tmp_path):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        await add_packs(tmp_path, "hoarding_pack")
        plain = {str(int(key) + 2): dict(node) for key, node in leaky("plain").items()}
        plain["4"] = {"class_type": "LeakySampler", "inputs": {"model": ["3", 0]}}
        # the pack appends the first module to its _CACHE; nothing but ComfyUI holds the second
        await comfy.run({**loaded_by("ListLoader", "kept"), **plain})
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True})
        _, rows = await comfy.get_json("/memx/models")
        for name in ("b", "c"):                               # later prompts and collections: no second count
            await comfy.run(leaky(name))
            gc.collect()
        await comfy.free({"unload_models": True, "free_memory": True})
        values = await metrics(comfy)
        kept = pack("hoarding_pack")._CACHE
        return status, receipt, rows, values, weakref.ref(kept[0]), kept

    status, receipt, rows, values, module_ref, kept = serve(version, tmp_path, scenario, events=events)
    assert status == 200
    [survivor] = receipt["survivors"]
    leak = survivor["leak"]
    assert leak is not None and leak["found_by"] == "after_free" and leak["stage"] == "rooted"
    assert leak["holder_package"] == "hoarding_pack" and leak["holder"]["path"] == "hoarding_pack._CACHE[0]"
    assert leak["holder"]["pattern"] == "appended_list"
    [row] = rows
    assert row["model_id"] == survivor["model_id"] and row["state"] == "leaked"
    assert row["leak"]["found_by"] == "after_free" and row["leak"]["holder_package"] == "hoarding_pack"
    assert row["owner"]["package"] == "hoarding_pack"
    [event] = [e for e in read_events(events) if e["event"] == "leak"]   # the plain model is no leak
    assert event["model_id"] == row["model_id"] and event["found_by"] == "after_free"
    assert event["holder_package"] == "hoarding_pack" and event["reason"] == "new"
    leaks = by_name(values, "comfy_memx_leaks_total")
    assert {labels: n for labels, n in leaks.items() if n} == {
        (("found_by", "after_free"), ("loader_package", "hoarding_pack"), ("package", "hoarding_pack"),
         ("stage", "rooted")): 1.0}
    leaked = by_name(values, "comfy_memx_leaked_bytes")
    assert leaked == {(("found_by", "after_free"), ("loader_package", "hoarding_pack"), ("package", "hoarding_pack")):
                      row["bytes"]}
    kept.clear()
    gc.collect()
    assert module_ref() is None   # comfy_memx's books kept nothing alive


@pytest.mark.parametrize("version", VERSIONS)
def test_a_hoarded_model_patcher_unloaded_by_a_node_is_a_leak_at_the_next_collection(version, tmp_path):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        await add_packs(tmp_path, "hoarding_pack", "unloader_pack")
        # beside the hoarded model, a plain one that only ComfyUI's output cache keeps, unloaded by a node too
        plain = {"11": leaky("plain")["1"], "12": {"class_type": "LeakySampler", "inputs": {"model": ["11", 0]}}}
        await comfy.run({**unloaded_by_a_node("PatcherHoarder", "hoarded"), **plain,
                         "13": {"class_type": "UnloadAllModels", "inputs": {"value": ["12", 0]}}})
        _, before = await comfy.get_json("/memx/models")
        gc.collect()                                          # ComfyUI's worker collects after its prompts
        # its cleanup_models_gc is the next collection point, in a prompt that keeps the plain model cached
        await comfy.run({**plain, "21": leaky("b")["1"],
                         "22": {"class_type": "LeakySampler", "inputs": {"model": ["21", 0]}}})
        _, after = await comfy.get_json("/memx/models")
        await comfy.run(leaky("c"))
        gc.collect()
        await comfy.run(leaky("d"))
        values = await metrics(comfy)
        hoard = pack("hoarding_pack").HOARD
        return before, after, values, weakref.ref(hoard[0]), hoard

    before, after, values, patcher_ref, hoard = serve(version, tmp_path, scenario, events=events)
    was = next(r for r in before if r["owner"]["package"] == "hoarding_pack")
    assert was["state"] == "offloaded" and was["leak"] is None   # ComfyUI sees a live patcher: it never warns
    cached = next(r for r in before if r["owner"]["package"] == "leaky_pack")
    assert cached["state"] == "offloaded" and cached["in_comfyui_loaded_list"] is False
    assert next(r for r in after if r["model_id"] == cached["model_id"])["leak"] is None   # ComfyUI's cache: no leak
    row = next(r for r in after if r["model_id"] == was["model_id"])
    assert row["state"] == "leaked" and row["leak"]["found_by"] == "after_unload"
    assert row["leak"]["holder_package"] == "hoarding_pack"
    assert row["leak"]["holder"]["path"].startswith("hoarding_pack.HOARD[0]")
    assert [r["model_id"] for r in after if r["leak"]] == [was["model_id"]]   # the plain ones are not leaks
    [event] = [e for e in read_events(events) if e["event"] == "leak"]
    assert event["found_by"] == "after_unload" and event["holder_package"] == "hoarding_pack"
    leaks = {labels: n for labels, n in by_name(values, "comfy_memx_leaks_total").items() if n}
    assert leaks == {(("found_by", "after_unload"), ("loader_package", "hoarding_pack"), ("package", "hoarding_pack"),
                      ("stage", "rooted")): 1.0}
    hoard.clear()
    gc.collect()
    assert patcher_ref() is None


@pytest.mark.parametrize("version", ["0.27.0"])
def test_a_hoarded_model_patcher_freed_by_memx_free_is_a_leak_and_a_cached_one_is_not(version, tmp_path):
    async def scenario(comfy):
        await add_packs(tmp_path, "hoarding_pack")
        await comfy.run(loaded_by("PatcherHoarder", "hoarded"))
        await comfy.run(leaky("cached"))
        _, unload_only = await comfy.free({"unload_models": True})   # ComfyUI's output cache keeps both patchers
        _, rows = await comfy.get_json("/memx/models")
        _, full = await comfy.free({"free_memory": True})
        pack("hoarding_pack").HOARD.clear()
        return unload_only, rows, full

    unload_only, rows, full = serve(version, tmp_path, scenario)
    assert unload_only["survivors"] == []
    hoarded = next(r for r in rows if r["owner"]["class_type"] == "PatcherHoarder")
    assert [r["leak"]["found_by"] for r in rows if r["leak"]] == ["after_free"]   # the hoarder's pack holds it
    assert hoarded["leak"]["holder_package"] == "hoarding_pack" and hoarded["state"] == "leaked"
    [survivor] = full["survivors"]
    assert survivor["model_id"] == hoarded["model_id"] and survivor["leak"]["found_by"] == "after_free"


@pytest.mark.parametrize("version", ["0.27.0"])
def test_a_model_loaded_again_after_its_unload_is_not_a_leak(version, tmp_path):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        from comfy_memx.leaks import unwarned
        await add_packs(tmp_path, "hoarding_pack", "unloader_pack")
        prompt = {**unloaded_by_a_node("PatcherHoarder", "again"),
                  "4": {"class_type": "SampleAfter", "inputs": {"model": ["1", 0], "value": ["3", 0]}}}
        await comfy.run(prompt)                               # unloaded, then loaded again in the same prompt
        gc.collect()
        await comfy.run(leaky("b"))
        _, rows = await comfy.get_json("/memx/models")
        watched = len(STATE.part(unwarned.UnloadedModels).watched)
        pack("hoarding_pack").HOARD.clear()
        return rows, watched

    rows, watched = serve(version, tmp_path, scenario, events=events)
    again = next(r for r in rows if r["owner"]["package"] == "hoarding_pack")
    assert again["loads"] == 2 and again["unloads"] == 1
    assert again["in_comfyui_loaded_list"] is True and again["leak"] is None
    assert [e for e in read_events(events) if e["event"] == "leak"] == []
    assert watched == 0   # it left the suspect set once it was back in ComfyUI's loaded list


@pytest.mark.parametrize("version", ["0.27.0"])
def test_a_hoarded_model_patcher_given_back_and_loaded_again_is_no_longer_a_leak(version, tmp_path):
    async def scenario(comfy):
        await add_packs(tmp_path, "hoarding_pack", "unloader_pack")
        first = unloaded_by_a_node("PatcherHoarder", "reused")
        await comfy.run(first)
        gc.collect()
        await comfy.run(leaky("b"))                           # found after the unload: a leak of hoarding_pack
        _, leaked = await comfy.get_json("/memx/models")
        import comfy.model_management as mm
        mm.load_models_gpu([pack("hoarding_pack").HOARD[0]])   # the pack gives it to a node, which loads it again
        _, loaded = await comfy.get_json("/memx/models")
        pack("hoarding_pack").HOARD.clear()
        return leaked, loaded

    leaked, loaded = serve(version, tmp_path, scenario)
    was = next(r for r in leaked if r["owner"]["package"] == "hoarding_pack")
    assert was["leak"]["found_by"] == "after_unload" and was["state"] == "leaked"
    now = next(r for r in loaded if r["model_id"] == was["model_id"])
    assert now["leak"] is None and now["state"] == "loaded" and now["in_comfyui_loaded_list"] is True


class Model:
    """A stand-in torch module: weak-referenceable, nothing else."""


def test_the_suspect_set_keeps_no_model_alive_and_stays_bounded():
    from comfy_memx.leaks import unwarned
    models = [Model() for _ in range(unwarned.MAX_WATCHED * 3)]
    refs = [weakref.ref(model) for model in models]
    for ref in refs:
        unwarned.note_unloaded(ref)
    watched = unwarned.book().watched
    assert len(watched) == unwarned.MAX_WATCHED   # the newest unloads; the oldest were pushed out
    del models
    gc.collect()
    assert all(ref() is None for ref in refs)     # the suspect set holds weak references only
    unwarned.check(None)
    assert len(watched) == 0                      # the dead left it at the next check


class Record:
    """A ledger record as ``leak_holder`` reads it: how many live ModelPatchers refer to its model."""

    def __init__(self, patchers):
        self.patchers = patchers

    def live_patchers(self):
        return self.patchers


def chain(path, package, root_kind, pattern="appended_list", holder_package=None):
    return {"path": path, "package": package, "root_kind": root_kind, "stage": "probe", "pattern": pattern,
            "suggestion": "...", "holder_package": holder_package or package}


def test_what_holds_a_model_comfyui_let_go_of_decides_whether_it_leaked(monkeypatch):
    from comfy_memx.leaks import unwarned
    monkeypatch.setattr(unwarned, "custom_node_packages", lambda: {"some_pack"})
    pack_list = chain("some_pack.HOARD[0].model", "some_pack", "module_global")
    node_frame = chain("thread 'prompt_worker' frame some_pack.Sampler.sample local 'model'.model", "some_pack",
                       "thread_frame", pattern="thread_frame")
    worker_cache = chain("thread 'prompt_worker' frame execution.PromptExecutor.execute local 'self'.caches.outputs",
                         "execution", "thread_frame", pattern="thread_frame")
    via_pack_object = chain("execution.PromptExecutor.caches.outputs[...][0].value", "core", "module_global",
                            pattern="node_instance_cache", holder_package="some_pack")
    comfy_cache = chain("execution.caches.outputs[...]", "core", "module_global", pattern="comfyui_cache")
    hoarded = Record(1)   # a live ModelPatcher still refers to the model
    assert unwarned.leak_holder(hoarded, [worker_cache, node_frame, pack_list])["path"] == pack_list["path"]
    for legit in ([worker_cache], [node_frame], [via_pack_object], [comfy_cache], []):
        assert unwarned.leak_holder(hoarded, legit) is None, legit
    orphan = Record(0)    # no ModelPatcher refers to it: whatever keeps it but ComfyUI's output cache leaks it
    assert unwarned.leak_holder(orphan, [via_pack_object])["package"] == "some_pack"
    assert unwarned.leak_holder(orphan, [comfy_cache]) is None
