"""A holder chain's steps (``leaks.holders.steps``) walked again by identity and cut (``leaks.release.walk``):
never through the holder's own ``__getattr__``/``__eq__``/``__getitem__``, and never past an object that changed."""

import sys
import types

import pytest

from comfy_memx.leaks import holders
from comfy_memx.leaks.release import walk
from test_holders import Hostile   # every hook a careless walk would call raises

PACK = "/srv/ComfyUI/custom_nodes/walk_pack"   # ComfyUI registers a pack under its folder path


class Model:
    pass


class LoudDict(dict):
    def __getitem__(self, key):
        raise RuntimeError("__getitem__ called")


@pytest.fixture
def pack():
    module = types.ModuleType(PACK)
    module.__dict__.update(KEPT=[], LOUD=LoudDict(), Model=Model)
    sys.modules[PACK] = module
    yield module
    sys.modules.pop(PACK, None)


def steps_of(target, path):
    report = holders.find_holders(target, budget_s=5.0, first_path=False)
    [chain] = [chain for chain in report.chains if chain.path == path]
    assert chain.steps, chain
    return chain.steps


def test_a_hostile_holder_is_walked_through_its_dict_and_a_loud_dict_through_dicts_own_get(pack):
    model = Model()
    hostile = Hostile()
    object.__setattr__(hostile, "held", model)
    pack.KEPT.append(hostile)
    del hostile
    steps = steps_of(model, "walk_pack.KEPT[0].held")
    assert [step[0] for step in steps] == ["module", "item", "index", "attr"]
    assert walk.cut(steps, 2, model) == {"method": "list_entry", "other_entries_dropped": 0}
    assert pack.KEPT == []
    other = Model()
    dict.__setitem__(pack.LOUD, ("unet", 1024), other)
    steps = steps_of(other, "walk_pack.LOUD[('unet', 1024)]")
    assert walk.cut(steps, 2, other)["method"] == "dict_entry" and dict(pack.LOUD) == {}


def test_a_replaced_item_a_moved_item_and_a_reloaded_module_are_told_apart(pack):
    first, second = Model(), Model()
    pack.KEPT.extend([first, second])
    steps = steps_of(second, "walk_pack.KEPT[1]")
    del pack.KEPT[0]                          # an earlier cut moved it: found again by identity
    assert walk.cut(steps, 2, second)["method"] == "list_entry" and pack.KEPT == []
    pack.KEPT.append(first)
    steps = steps_of(first, "walk_pack.KEPT[0]")
    pack.KEPT[0] = Model()                    # the entry now holds another model
    with pytest.raises(walk.Changed):
        walk.cut(steps, 2, first)
    pack.KEPT[0] = first
    sys.modules[PACK] = types.ModuleType(PACK)   # the pack was reloaded
    sys.modules[PACK].__dict__.update(KEPT=pack.KEPT)
    with pytest.raises(walk.Changed):
        walk.cut(steps, 2, first)
    assert pack.KEPT == [first]


def test_the_chain_must_end_at_the_model(pack):
    model = Model()
    pack.KEPT.append(model)
    steps = steps_of(model, "walk_pack.KEPT[0]")
    with pytest.raises(walk.Changed):
        walk.cut(steps, 2, Model())
    assert pack.KEPT == [model]
