"""Releasing from the containers published packs keep ComfyUI's objects in (on both stand-in shapes): a weak-keyed
memo of clones keyed by the MODEL, a dict of lists of checkpoint tuples, ``cachetools`` caches, a tagged mapping class
over them, an ``OrderedDict`` that pops its oldest, a ``defaultdict``, a deque and an ``lru_cache``.  The entry is cut
whole, every model that goes with it is in the receipt and dies, the pack's other entries stay; a patcher that only
the pack keeps is no user of the model, while ComfyUI's output cache or loaded list is; a holder outside the
custom-node packages (``sys.modules``) is never cut.

The pack below is written as pack authors write these caches (their keys, values and bookkeeping), with the
stand-in's ModelPatcher for ComfyUI's MODEL, CLIP and VAE wrappers.  The models are loaded through ComfyUI's
``load_models_gpu`` (so the ledger knows them) and then let go by ComfyUI, as after ``/memx/free``.
"""

import gc
import importlib.util
import os
import sys
import types
import weakref

import pytest

from comfy_memx.core.state import STATE
from comfy_memx.leaks import watch as leakwatch
from comfy_memx.leaks import release as releases
from comfy_memx.leaks.release import entries
from memx_helpers import memx_on

VERSIONS = ["0.3.64", "0.27.0"]
PACK = '''
"""Caches of ComfyUI objects, written as published packs write them."""
import collections
import functools
import weakref

import cachetools
import comfy.model_base
import comfy.model_management
import comfy.model_patcher

# a memo of patched clones, keyed by the MODEL a node was given: (kind, node_id) -> model.clone()
PATCHED = weakref.WeakKeyDictionary()
# the pack's own checkpoint loader: ckpt folder -> [(ckpt_name, model, clip, vae, ids), ...]
LOADED = {}
CKPTS = cachetools.LRUCache(maxsize=5)
RECENT = cachetools.TTLCache(maxsize=8, ttl=3600)
CLONES = collections.OrderedDict()    # clones kept alive on purpose, at most MAX_CLONES
MAX_CLONES = 16
BY_ARCH = collections.defaultdict(list)
HISTORY = collections.deque(maxlen=4)


class TaggedCache:
    """One cachetools LRU per tag, values (tag, (is_list, data)); the pack's backend cache."""

    def __init__(self, tag_settings=None):
        self._tag_settings = tag_settings or {}
        self._data = {}

    def __getitem__(self, key):
        for tag_data in self._data.values():
            if key in tag_data:
                return tag_data[key]
        raise KeyError(key)

    def __setitem__(self, key, value):
        for tag_data in self._data.values():
            if key in tag_data:
                tag_data.pop(key, None)
                break
        tag = value[0]
        if tag not in self._data:
            self._data[tag] = cachetools.LRUCache(maxsize=self._tag_settings.get(tag, 5))
        self._data[tag][key] = value

    def __delitem__(self, key):
        for tag_data in self._data.values():
            if key in tag_data:
                del tag_data[key]
                return
        raise KeyError(key)

    def __contains__(self, key):
        return any(key in tag_data for tag_data in self._data.values())


cache = TaggedCache({"ckpt": 5})


def patcher(model):
    mm = comfy.model_management
    return comfy.model_patcher.ModelPatcher(model, load_device=mm.get_torch_device(),
                                            offload_device=mm.unet_offload_device())


def checkpoint(seed):
    """(model, clip, vae): three ComfyUI wrappers, each around a torch module of its own."""
    import torch
    torch.manual_seed(seed)
    return tuple(patcher(comfy.model_base.BaseModel(4, 1024)) for _ in range(3))


def patched(model, node_id):
    memo = PATCHED.setdefault(model, {})
    key = ("cfg_rescale", node_id)
    if key not in memo:
        memo[key] = model.clone()
    return memo[key]


def keep_clone(key, model):
    CLONES[key] = model.clone()
    while len(CLONES) > MAX_CLONES:
        CLONES.popitem(last=False)


@functools.lru_cache(maxsize=None)
def load_cached(ckpt_name, seed):
    return checkpoint(seed)
'''


def import_pack(tmp_path):
    folder = tmp_path / "custom_nodes" / "shape_pack"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PACK)
    spec = importlib.util.spec_from_file_location("shape_pack", os.path.join(folder, "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["shape_pack"] = module
    return module


@pytest.fixture
def world(request, tmp_path):
    with memx_on(request.param, leak_mode="report", release="ask") as mm:
        yield mm, import_pack(tmp_path)
        sys.modules.pop("shape_pack", None)


def loaded(mm, patchers):
    """ComfyUI loads the patchers' models, then lets go of them (as ``/memx/free`` does): the ledger knows them,
    nothing of ComfyUI holds them.  Returns ``(weakrefs to the modules, their records)``."""
    mm.load_models_gpu(list(patchers))
    mm.unload_all_models()
    modules = [p.model for p in patchers]
    records = [STATE.ledger.find(m) for m in modules]
    assert all(records)
    return [weakref.ref(m) for m in modules], records


def release(record, path_start=None):
    """Search the model's holders as a free's receipt does, then release it (the route's path)."""
    gc.collect()
    found = leakwatch.search_now(record)
    holders = found["holders"]
    path = next((h["path"] for h in holders if path_start and h["path"].startswith(path_start)), None)
    return releases.release(record, "http", path=path, referrers=holders)


def released(receipt, probes, records):
    assert receipt["outcome"] == "released", receipt
    assert receipt["died"] is True and all(probe() is None for probe in probes), receipt
    rows = {row["model_id"]: row for row in receipt["models"]}
    assert set(rows) == {record.model_id for record in records}, receipt["models"]
    assert all(row["died"] and row["bytes"] > 0 for row in rows.values()), rows
    assert receipt["released_bytes"] == sum(row["bytes"] for row in rows.values())
    assert receipt["bytes"] == rows[receipt["model_id"]]["bytes"]
    assert receipt["models"][0]["model_id"] == receipt["model_id"]
    return rows


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_weak_keyed_memo_whose_clone_keeps_its_key_is_cut_and_dies(world):
    mm, pack = world
    model, other = pack.patcher(pack.checkpoint(1)[0].model), pack.patcher(pack.checkpoint(2)[0].model)
    pack.patched(model, "7"), pack.patched(model, "9"), pack.patched(other, "7")
    probes, records = loaded(mm, [model, other])
    del model   # ComfyUI's output cache let go of the MODEL: only its clones' .parent keeps the key alive
    gc.collect()
    assert probes[0]() is not None and len(pack.PATCHED) == 2
    receipt = release(records[0])
    released(receipt, probes[:1], records[:1])
    assert receipt["method"] == "mapping_entry" and receipt["cut"].startswith("shape_pack.PATCHED.data[")
    assert receipt["other_entries_dropped"] == 0 and receipt["package"] == "shape_pack"
    assert receipt["pattern"] == "module_registry"
    assert list(pack.PATCHED.keys()) == [other] and probes[1]() is not None   # the other model's memo stays


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_tuple_in_a_dict_of_lists_is_removed_from_its_list_with_every_model_it_held(world):
    mm, pack = world
    first, second = pack.checkpoint(1), pack.checkpoint(2)
    pack.LOADED["checkpoints"] = [("a.safetensors", *first, [1, 2]), ("b.safetensors", *second, [3])]
    probes, records = loaded(mm, first + second)
    del first
    receipt = release(records[0])
    rows = released(receipt, probes[:3], records[:3])   # the UNet, and the CLIP and VAE that went with it
    assert len(rows) == 3
    assert receipt["cut"] == "shape_pack.LOADED['checkpoints'][0]" and receipt["method"] == "list_entry"
    assert [entry[0] for entry in pack.LOADED["checkpoints"]] == ["b.safetensors"]
    assert all(probe() is not None for probe in probes[3:])


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
@pytest.mark.parametrize("cache", ["CKPTS", "RECENT"])
def test_a_cachetools_entry_is_deleted_through_the_cache_which_keeps_working(world, cache):
    mm, pack = world
    kept = getattr(pack, cache)
    first, second = pack.checkpoint(1), pack.checkpoint(2)
    kept["a.safetensors"], kept["b.safetensors"] = first, second
    probes, records = loaded(mm, first + second)
    del first
    receipt = release(records[0])
    released(receipt, probes[:3], records[:3])
    assert receipt["method"] == "mapping_entry" and receipt["other_entries_dropped"] == 0, receipt
    assert receipt["cut"] == f"shape_pack.{cache}._Cache__data['a.safetensors']"
    assert list(kept) == ["b.safetensors"] and kept.currsize == 1
    for index in range(9):   # its own bookkeeping (LRU order, TTL links, size) is still true: evictions work
        kept[f"more-{index}"] = index
    assert len(kept) == kept.maxsize


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_tagged_mapping_class_over_cachetools_is_cut_through_the_cache_that_holds_the_entry(world):
    mm, pack = world
    first, second = pack.checkpoint(1), pack.checkpoint(2)
    pack.cache["sd15-a"] = ("ckpt", (False, first))
    pack.cache["sd15-b"] = ("ckpt", (False, second))
    probes, records = loaded(mm, first + second)
    del first
    receipt = release(records[0])
    released(receipt, probes[:3], records[:3])
    assert receipt["pattern"] == "module_registry" and receipt["method"] == "mapping_entry", receipt
    assert receipt["cut"] == "shape_pack.cache._data['ckpt']._Cache__data['sd15-a']"
    assert "sd15-a" not in pack.cache and pack.cache["sd15-b"][1][1] is second
    pack.cache["sd15-a"] = ("ckpt", (False, "rebuilt"))
    assert pack.cache["sd15-a"][1][1] == "rebuilt"


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_an_ordered_dict_of_clones_a_defaultdict_and_a_deque_lose_one_entry_each(world):
    mm, pack = world
    a, b, c, d = (pack.checkpoint(seed)[0] for seed in (1, 2, 3, 4))
    pack.keep_clone(("sampler", "3"), a)
    pack.keep_clone(("sampler", "4"), d)
    pack.BY_ARCH["sdxl"].append(("b.safetensors", b))
    pack.HISTORY.append(c)
    pack.HISTORY.append(d)
    probes, records = loaded(mm, [a, b, c, d])
    del a, b, c
    for index, (cut, method) in enumerate([("shape_pack.CLONES[('sampler', '3')]", "dict_entry"),
                                           ("shape_pack.BY_ARCH['sdxl']", "dict_entry"),
                                           ("shape_pack.HISTORY[0]", "list_entry")]):
        receipt = release(records[index])
        released(receipt, probes[index:index + 1], records[index:index + 1])
        assert (receipt["cut"], receipt["method"]) == (cut, method), receipt
    assert list(pack.CLONES) == [("sampler", "4")] and "sdxl" not in pack.BY_ARCH
    assert list(pack.HISTORY) == [d] and probes[3]() is not None


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_an_lru_cache_of_checkpoint_tuples_loses_that_entry_and_its_three_models(world):
    mm, pack = world
    keep = pack.load_cached("b.safetensors", 2)
    first = pack.load_cached("a.safetensors", 1)
    probes, records = loaded(mm, first + keep)
    del first
    receipt = release(records[0])
    released(receipt, probes[:3], records[:3])
    assert receipt["method"] == "lru_entry" and pack.load_cached.cache_info().currsize == 1
    assert pack.load_cached("b.safetensors", 2) is keep


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_model_only_the_packs_own_patcher_uses_is_not_in_use_but_one_comfyuis_output_cache_reaches_is(world):
    mm, pack = world
    import execution
    executor = execution.PromptExecutor(types.SimpleNamespace(client_id=None, last_node_id=None))
    model, clip, vae = pack.checkpoint(1)
    pack.CKPTS["a.safetensors"] = (model, clip, vae)
    probes, records = loaded(mm, [model, clip, vae])
    executor.caches.outputs.entries[("CheckpointLoaderSimple", ())] = [(model, clip, vae)]   # a node's outputs
    del model, clip, vae
    receipt = release(records[0])
    assert receipt["outcome"] == "in_use" and "output caches" in receipt["reason"], receipt
    assert receipt["cut"] is None and receipt["memory"] is None and "a.safetensors" in pack.CKPTS
    executor.caches.outputs.entries.clear()   # ComfyUI's /free with free_memory
    released(release(records[0]), probes, records)
    assert "a.safetensors" not in pack.CKPTS
    del executor


@pytest.mark.parametrize("world", VERSIONS, indirect=True)
def test_a_whole_checkpoint_tuple_is_cut_when_its_models_come_from_one_node_run_and_the_packs_list_stays(
        world, monkeypatch):
    # the list under "checkpoints" holds only this tuple: cutting the dict entry would leave the pack's next
    # `LOADED["checkpoints"]` a KeyError, so the tuple leaves the list instead
    mm, pack = world
    first, second = pack.checkpoint(1), pack.checkpoint(2)
    pack.LOADED["checkpoints"] = [("a.safetensors", *first, [1, 2])]
    pack.LOADED["other"] = [("b.safetensors", *second, [3])]
    probes, records = loaded(mm, first + second)
    del first
    run = {records[0].model_id: records[:3]}   # what created_by says: one loader node built all three
    monkeypatch.setattr(entries, "node_run", lambda record: run.get(record.model_id, [record]))
    receipt = release(records[0])
    released(receipt, probes[:3], records[:3])
    assert receipt["cut"] == "shape_pack.LOADED['checkpoints'][0]" and receipt["method"] == "list_entry", receipt
    assert pack.LOADED["checkpoints"] == [] and [entry[0] for entry in pack.LOADED["other"]] == ["b.safetensors"]


def test_the_models_of_one_node_run_are_grouped_by_created_by(monkeypatch):
    owner = types.SimpleNamespace
    made = [types.SimpleNamespace(model_id=f"m{i}", created_by=by) for i, by in enumerate(
        [owner(prompt_id="p", node_id="4"), owner(prompt_id="p", node_id="4"), owner(prompt_id="p", node_id="5"),
         owner(prompt_id="q", node_id="4"), None, owner(prompt_id=None, node_id=None)])]
    monkeypatch.setattr(STATE.ledger, "records", lambda: list(made))
    assert [r.model_id for r in entries.node_run(made[0])] == ["m0", "m1"]
    assert [r.model_id for r in entries.node_run(made[2])] == ["m2"]
    assert [r.model_id for r in entries.node_run(made[4])] == ["m4"]
    assert [r.model_id for r in entries.node_run(made[5])] == ["m5"]   # no node run known: the model alone


@pytest.mark.parametrize("world", ["0.27.0"], indirect=True)
def test_a_holder_in_sys_modules_is_never_cut(world):
    mm, pack = world
    model = pack.checkpoint(1)[0]
    sys.modules["memx_stray_cache"] = types.SimpleNamespace(models=[model])
    try:
        probes, records = loaded(mm, [model])
        del model
        gc.collect()
        found = leakwatch.search_now(records[0])
        [path] = [h["path"] for h in found["holders"] if h["path"].startswith("sys.modules")]
        receipt = releases.release(records[0], "http", path=path, referrers=found["holders"])
        assert receipt["outcome"] == "refused" and receipt["package"] == "sys", receipt
        assert "not a custom-node package" in receipt["reason"] and receipt["cut"] is None
        assert "memx_stray_cache" in sys.modules and probes[0]() is not None
    finally:
        sys.modules.pop("memx_stray_cache", None)
