"""``surface.answers``: the ``/memx/models`` snapshot answers the kept body while no row key changed, rebuilds only
the rows whose key changed, rebuilds everything once the body is ``max_age_s`` old, gives the same bytes as a full
build, and keeps no model alive."""

import gc
import json
import weakref

import pytest

from comfy_memx.core.state import STATE
from comfy_memx.routekit.replies import clip
from comfy_memx.surface import answers, readmodel


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Module:
    pass


@pytest.fixture
def built(monkeypatch):
    """The model_ids of the rows the snapshot built, in order (readmodel.model_row, counted)."""
    calls = []
    real = readmodel.model_row

    def counted(record, mm, listed):
        calls.append(record.model_id)
        return real(record, mm, listed)
    monkeypatch.setattr(readmodel, "model_row", counted)
    return calls


def loaded(module, when):
    record = STATE.ledger.record_for(module)
    record.loads += 1
    record.last_used = when
    return record


def test_the_kept_body_is_answered_until_a_row_changes_and_then_only_that_row_is_built(fake_comfy, built):
    first, second = Module(), Module()
    one, two = loaded(first, 1.0), loaded(second, 2.0)
    snapshot = answers.ModelsSnapshot(max_age_s=float("inf"), clock=Clock())
    body = snapshot.body()
    assert [row["model_id"] for row in json.loads(body)] == [two.model_id, one.model_id]
    assert sorted(built) == sorted([one.model_id, two.model_id])
    del built[:]
    assert snapshot.body() is body and built == []            # nothing changed: no row built
    one.unload_seq = STATE.ledger.next_unload_number()          # an unload of the first
    snapshot.body()
    assert built == [one.model_id]
    del built[:]
    one.leak = {"stage": "rooted", "sightings": 1}
    assert json.loads(snapshot.body())[1]["leak"] is not None and built == [one.model_id]
    del built[:]
    one.leak["holder"] = {"package": "leaky_pack"}              # the leak wing changes its dict in place
    snapshot.body()
    assert built == [one.model_id]


def test_the_body_is_the_full_build_byte_for_byte(fake_comfy):
    modules = [Module() for _ in range(3)]
    records = [loaded(module, float(n)) for n, module in enumerate(modules)]
    snapshot = answers.ModelsSnapshot(max_age_s=float("inf"))
    snapshot.body()
    records[0].loads += 1
    assert snapshot.body() == json.dumps(clip(readmodel.model_rows())).encode("utf-8")


def test_a_body_older_than_max_age_rebuilds_every_row(fake_comfy, built):
    module = Module()
    record = loaded(module, 1.0)
    clock = Clock()
    snapshot = answers.ModelsSnapshot(max_age_s=1.0, clock=clock)
    snapshot.body()
    clock.now += 0.9
    snapshot.body()
    assert built == [record.model_id]
    clock.now += 0.2
    snapshot.body()
    assert built == [record.model_id] * 2


def test_a_dead_model_leaves_the_body_and_the_snapshot_keeps_no_model_alive(fake_comfy):
    keep, gone = Module(), Module()
    kept = loaded(keep, 1.0)
    loaded(gone, 2.0)
    probe = weakref.ref(gone)
    snapshot = answers.ModelsSnapshot(max_age_s=float("inf"))
    assert len(json.loads(snapshot.body())) == 2
    del gone
    gc.collect()
    assert probe() is None   # the snapshot and its keys hold bytes, strings and numbers only
    assert [row["model_id"] for row in json.loads(snapshot.body())] == [kept.model_id]


def test_row_key_changes_with_a_load_a_leak_and_a_holder(fake_comfy):
    module = Module()
    record = STATE.ledger.record_for(module)
    listed = set()
    created = answers.row_key(record, listed)
    record.loads += 1
    loads = answers.row_key(record, listed)
    in_list = answers.row_key(record, {id(module)})
    record.leak = {"stage": "rooted", "sightings": 1}
    leaked = answers.row_key(record, listed)
    record.leak["holder"] = {"package": "leaky_pack"}
    held = answers.row_key(record, listed)
    assert len({created, loads, in_list, leaked, held}) == 5
    assert answers.row_key(record, listed) == held
