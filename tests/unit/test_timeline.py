"""The memory panel's timeline recorder (``comfy_memx.surface.timeline``): bounded, a constant amount of work and
memory per event however many events or models came before, loaded bytes per model placed by loads and unloads,
a leak marked once per model and stage, a release marked on each model its cut entry held (the lane of a model it
freed ends at zero there), and subscribed to the event stream once."""

import pytest

from comfy_memx.core.events import EventLog
from comfy_memx.core.state import STATE
from comfy_memx.surface import timeline


def load(model_id, loaded, moved=None):
    return {"event": "load", "time": 1.0, "model": "Net", "model_id": model_id, "bytes": loaded if moved is None
            else moved, "loaded_bytes": loaded, "owner": {"package": "pack_a", "class_type": "Loader",
                                                           "node_id": "1", "prompt_id": "p", "via": None}}


def unload(model_id, freed, reason="oom"):
    return {"event": "unload", "time": 2.0, "model": "Net", "model_id": model_id, "bytes": freed, "reason": reason,
            "requested_by": {"package": "pack_b", "class_type": "Sampler", "node_id": "2"}}


def test_the_ring_keeps_the_newest_entries_and_counts_the_dropped():
    ring = timeline.Timeline(capacity=8)
    for index in range(100):
        ring.observe(load(f"Net#{index}", index))
    view = ring.view()
    assert [entry["seq"] for entry in view["entries"]] == list(range(93, 101))
    assert view["dropped"] == 92 and view["capacity"] == 8 and view["next"] == 100
    assert ring.view(98)["entries"] == ring.since(98) and [e["seq"] for e in ring.since(98)] == [99, 100]
    assert ring.view(100)["entries"] == [] and ring.view(100)["next"] == 100


def test_memory_stays_bounded_with_many_models_and_events():
    ring = timeline.Timeline(capacity=64, known_models=16)
    for index in range(5000):
        ring.observe(load(f"Net#{index}", 10))
        ring.observe({"event": "leak_seen", "time": 3.0, "model": "Net", "model_id": f"Net#{index}"})
    assert len(ring._ring) == 64 and len(ring._loaded) == 16 and len(ring._leak_stage) == 16


def test_an_unload_places_the_line_from_the_last_known_loaded_bytes():
    ring = timeline.Timeline()
    ring.observe(load("Net#1", 1000))
    ring.observe(unload("Net#1", 300))
    ring.observe(unload("Net#1", 900))
    ring.observe(unload("Net#2", 50))             # never seen loaded: placed at zero
    entries = ring.since()
    assert [e["loaded_bytes"] for e in entries] == [1000, 700, 0, 0]
    assert entries[0]["owner"] == {"package": "pack_a", "class_type": "Loader", "node_id": "1"}
    assert entries[1]["reason"] == "oom" and entries[1]["requested_by"]["package"] == "pack_b"


def test_a_leak_is_marked_once_per_model_and_stage_and_other_events_are_ignored():
    ring = timeline.Timeline()
    ring.observe(load("Net#1", 500))
    for _ in range(5):
        ring.observe({"event": "leak_seen", "time": 3.0, "model": "Net", "model_id": "Net#1"})
    ring.observe({"event": "leak", "time": 4.0, "model": "Net", "model_id": "Net#1", "stage": "rooted",
                  "holder_package": "pack_c"})
    ring.observe({"event": "thrash", "time": 5.0, "model_id": "Net#1"})
    ring.observe({"event": "free", "time": 6.0, "status": "done"})
    kinds = [(e["kind"], e.get("stage")) for e in ring.since()]
    assert kinds == [("load", None), ("leak", "leak_seen"), ("leak", "rooted"), ("free", None)]
    assert ring.since()[2]["holder_package"] == "pack_c" and ring.since()[2]["loaded_bytes"] == 500


def test_bad_capacity_is_refused_by_name():
    with pytest.raises(ValueError, match="capacity"):
        timeline.Timeline(capacity=0)


def test_install_subscribes_once_and_a_reset_unsubscribes():
    STATE.reset()
    STATE.events = EventLog()
    try:
        first = timeline.install()
        assert timeline.install() is first and STATE.events._subscribers.count(first.observe) == 1
        STATE.events.emit("load", **{k: v for k, v in load("Net#1", 10).items() if k != "event"})
        assert [e["model_id"] for e in timeline.installed().since()] == ["Net#1"]
        events = STATE.events
        STATE.reset()
        assert first.observe not in events._subscribers and timeline.installed() is None
    finally:
        STATE.reset()


def test_an_unload_names_who_asked_of_every_kind_the_ledger_writes():
    """A free by HTTP keeps its route (the panel says "by POST /memx/free"), a load keeps the loading node, comfy_memx's
    own unloads keep their ``via``; no client address is ever kept."""
    ring = timeline.Timeline()
    askers = [{"kind": "http", "route": "/memx/free", "clients": 2},
              {"kind": "load", "models": [{"model": "Net", "model_id": "Net#9", "bytes": 5}],
               "node": {"package": "pack_d", "class_type": "Loader", "node_id": "4", "prompt_id": "p", "via": None}},
              {"kind": "comfy_memx", "via": "idle_unload", "idle_s": 300},
              {"kind": "comfyui", "via": "prompt_worker", "prompt_id": None, "node_id": None, "class_type": None}]
    for index, asker in enumerate(askers):
        ring.observe(dict(unload(f"Net#{index}", 10, reason="free_request"), requested_by=asker))
    shown = [entry["requested_by"] for entry in ring.since()]
    assert shown == [{"kind": "http", "route": "/memx/free", "clients": 2},
                     {"kind": "load", "package": "pack_d", "class_type": "Loader", "node_id": "4"},
                     {"kind": "comfy_memx", "via": "idle_unload"},
                     {"kind": "comfyui", "via": "prompt_worker"}]


def release(model_id, outcome="released", died=True, **fields):
    return {"event": "release", "time": 5.0, "model": "Net", "model_id": model_id, "trigger": "auto",
            "outcome": outcome, "package": "pack_c", "path": "pack_c.CACHE['a']", "cut": "pack_c.CACHE['a']",
            "bytes": 400, "died": died, **fields}


def test_a_release_that_cut_an_entry_is_marked_on_every_model_it_held_and_ends_the_freed_ones_at_zero():
    ring = timeline.Timeline()
    ring.observe(load("Net#1", 400))
    ring.observe(load("Vae#2", 100))
    ring.observe(release("Net#1", models=[{"model": "Net", "model_id": "Net#1", "bytes": 400, "died": True},
                                          {"model": "Vae", "model_id": "Vae#2", "bytes": 100, "died": False}]))
    marks = [e for e in ring.since() if e["kind"] == "release"]
    assert [(e["model_id"], e["died"], e["loaded_bytes"], e["bytes"]) for e in marks] == [
        ("Net#1", True, 0, 400), ("Vae#2", False, 100, 100)]
    assert {e["trigger"] for e in marks} == {"auto"} and {e["cut"] for e in marks} == {"pack_c.CACHE['a']"}
    assert ring.since()[-1]["seq"] == 4


def test_a_release_without_a_models_list_marks_its_one_model_and_one_that_cut_nothing_is_not_marked():
    ring = timeline.Timeline()
    ring.observe(load("Net#1", 400))
    for outcome in ("refused", "in_use", "changed", "busy", "gone", "failed"):
        ring.observe(release("Net#1", outcome=outcome, died=False))
    assert [e["kind"] for e in ring.since()] == ["load"]
    ring.observe(release("Net#1", outcome="survivor", died=False))
    ring.observe(release("Net#1"))
    assert [(e["kind"], e["outcome"], e["loaded_bytes"]) for e in ring.since()[1:]] == [
        ("release", "survivor", 400), ("release", "released", 0)]
