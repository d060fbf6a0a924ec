"""Which entry of a pack's chain a release cuts (``leaks.release.entries``), through which code
(``leaks.release.walk.remove``: a mapping object's own ``__delitem__``), and the bounded walks that decide it
(``leaks.release.reach``)."""

import collections
import sys
import types

import pytest

from comfy_memx.leaks import holders
from comfy_memx.leaks.holders import containers
from comfy_memx.leaks.release import engine, entries, reach, walk

PACK = "/srv/ComfyUI/custom_nodes/entries_pack"


class Model:
    """Stands for a torch module (the tests below name their models by id)."""


class Store:
    """A pack's mapping class over a dict; only its __delitem__ is for others to call."""

    def __init__(self):
        self._data = {}
        self.deleted = []

    def __getitem__(self, key):
        raise RuntimeError("__getitem__ called")

    def __getattr__(self, name):
        raise RuntimeError(f"__getattr__({name}) called")

    def __delitem__(self, key):
        self.deleted.append(key)
        del self._data[key]


class Sticky(Store):
    def __delitem__(self, key):
        self.deleted.append(key)   # forgets to remove it


class Record:
    """A pack object that is no container (no mapping method)."""

    def __init__(self, model):
        self.parts = {"model": model}


@pytest.fixture
def pack():
    module = types.ModuleType(PACK)
    module.__dict__.update(STORE=Store(), STICKY=Sticky(), RECORDS={}, QUEUE=collections.deque())
    sys.modules[PACK] = module
    yield module
    sys.modules.pop(PACK, None)


def steps_of(target, start):
    report = holders.find_holders(target, budget_s=5.0, first_path=False)
    [chain] = [chain for chain in report.chains if chain.path.startswith(start)]
    assert chain.steps, chain
    return chain


def test_a_mapping_class_is_cut_through_its_own_delitem_and_nothing_else_of_it_runs(pack):
    model, other = Model(), Model()
    pack.STORE._data.update(a=(model, "a.safetensors"), b=(other, "b.safetensors"))
    chain = steps_of(model, "entries_pack.STORE._data['a']")
    assert chain.mappings == ("test_release_entries.Store",)
    walked = walk.follow(chain.steps, model)
    try:
        assert entries.candidates(walked) == [3]   # STORE._data['a']: the tuple inside cannot be cut
        assert walk.remove(walked, 3) == {"method": "mapping_entry", "other_entries_dropped": 0}
    finally:
        walked.drop()
    assert pack.STORE.deleted == ["a"] and list(pack.STORE._data) == ["b"]


def test_a_remover_that_leaves_the_entry_is_a_failed_cut_that_loses_nothing(pack):
    model = Model()
    pack.STICKY._data["a"] = model
    chain = steps_of(model, "entries_pack.STICKY._data['a']")
    with pytest.raises(walk.CutFailed, match="left the entry in place"):
        walk.cut(chain.steps, 3, model)
    assert pack.STICKY._data == {"a": model}


def test_an_expired_ttl_entry_is_cut_although_its_delitem_raises_after_deleting(pack):
    cachetools = pytest.importorskip("cachetools")
    clock = [0.0]
    pack.RECENT = cachetools.TTLCache(maxsize=4, ttl=10, timer=lambda: clock[0])
    model = Model()
    pack.RECENT["a"] = model
    clock[0] = 60.0   # expired, still stored until the cache's next write
    chain = steps_of(model, "entries_pack.RECENT._Cache__data['a']")
    assert walk.cut(chain.steps, 3, model)["method"] == "mapping_entry"
    assert pack.RECENT.currsize == 0
    pack.RECENT["b"] = 1   # its links are still consistent
    assert list(pack.RECENT) == ["b"]


def test_the_candidates_stop_at_an_object_that_is_no_container(pack):
    model = Model()
    pack.RECORDS["a"] = Record(model)
    chain = steps_of(model, "entries_pack.RECORDS['a']")
    walked = walk.follow(chain.steps, model)
    try:
        assert entries.candidates(walked) == [2]   # never the record's own dict
    finally:
        walked.drop()


def test_a_deque_item_is_labelled_by_its_index(pack):
    model = Model()
    pack.QUEUE.extend([Model(), model])
    assert steps_of(model, "entries_pack.QUEUE").path == "entries_pack.QUEUE[1]"


def test_a_walk_that_reaches_its_bound_cannot_tell_and_the_model_counts_as_in_use(monkeypatch):
    model = pytest.importorskip("torch").nn.Linear(2, 2)
    roots = [("ComfyUI's output caches", [[{"deep": [model]}]])]
    assert reach.comfyui_reach(roots, {id(model)}).found == "ComfyUI's output caches"
    assert reach.comfyui_reach(roots, {id(model)}, leave_out=[id(roots[0][1][0])]).found is None
    stopped = reach.comfyui_reach(roots, {id(model)}, max_objects=1)
    assert stopped.found is None and not stopped.complete and stopped.stopped_by == "objects"
    monkeypatch.setattr(reach, "MAX_OBJECTS", 1)
    monkeypatch.setattr(reach, "comfyui_roots", lambda mm: roots)
    monkeypatch.setattr(engine, "in_comfyui_use", lambda record, module, mm: None)
    why = engine.in_use(None, model, None)
    assert why is not None and "could not tell" in why


def test_only_standard_containers_and_comfyuis_objects_are_walked_from_comfyui():
    model = pytest.importorskip("torch").nn.Linear(2, 2)
    pack_object = Record(model)
    assert reach.comfyui_reach([("root", [pack_object])], {id(model)}).found is None
    assert containers.is_mapping_class(Store) and not containers.is_mapping_class(Record)
    assert containers.remover_of(Store)[0] == "__delitem__" and containers.remover_of(Record) is None
