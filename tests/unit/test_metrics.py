"""comfy_memx.surface.metrics: names, labels and values from events and scrape-time state, in a private registry."""

import pytest

from comfy_memx.surface import metrics
from comfy_memx.core.state import STATE
from comfy_memx.core.events import EventLog

parser = pytest.importorskip("prometheus_client.parser")
prometheus_client = pytest.importorskip("prometheus_client")

OWNER = {"prompt_id": "p", "node_id": "1", "class_type": "LeakyLoader", "package": "leaky_pack"}
ROWS = [
    {"model": "SDXL", "model_id": "SDXL#1", "owner": OWNER, "load_device": "cuda:0", "loaded_bytes": 600,
     "bytes": 1000, "state": "loaded"},
    {"model": "VAE", "model_id": "VAE#1", "owner": {**OWNER, "package": "core"}, "load_device": "cuda:0",
     "loaded_bytes": 50, "bytes": 50, "state": "loaded"},
    {"model": "Leaky", "model_id": "Leaky#1", "owner": OWNER, "load_device": "cpu", "loaded_bytes": 0,
     "bytes": 70, "state": "leaked"},
]
EVENTS = [
    {"event": "load", "owner": OWNER, "bytes": 600, "seconds": 0.2},
    {"event": "load", "owner": {**OWNER, "package": "core"}, "bytes": 50, "seconds": 0.01},
    {"event": "unload", "owner": OWNER, "reason": "memory_pressure", "bytes": 400, "seconds": 0.1},
    {"event": "unload", "owner": OWNER, "reason": "free_request", "bytes": 200, "seconds": 0.05},
    {"event": "leak", "owner": OWNER, "stage": "rooted", "holder_package": "ComfyUI-Cachey", "model_id": "Leaky#1"},
    {"event": "leak", "owner": OWNER, "stage": "cycle"},
    {"event": "pin_evict", "model_id": "SDXL#1", "reason": "cap", "bytes": 30},
    {"event": "pin_refused", "model_id": "SDXL#1", "reason": "over_cap", "bytes": 10},
    {"event": "something_new", "owner": OWNER},
]


def samples_of(text):
    found = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def exposition(events=EVENTS, rows=ROWS, pins=None):
    m = metrics.Metrics(model_rows=lambda: rows,
                        pin_facts=lambda: pins or {"pinned_bytes": 123, "cap_bytes": 1000, "comfyui_cap_bytes": 900})
    for event in events:
        m.observe(event)
    body, content_type = m.exposition()
    assert content_type.startswith("text/plain")
    return samples_of(body.decode())


def test_every_name_has_the_prefix_and_the_documented_labels():
    samples = exposition()
    # every name has the prefix but the process collector's standard process_* ones (process_start_time_seconds)
    assert samples and all(name.startswith(("comfy_memx_", "process_")) for name, _ in samples)
    assert any(name.startswith("comfy_memx_") for name, _ in samples)
    labels = {}
    for name, pairs in samples:
        labels.setdefault(name, set()).add(tuple(k for k, _ in pairs))
    assert labels["comfy_memx_loaded_bytes"] == {("device",)}
    assert labels["comfy_memx_model_loaded_bytes"] == {("device", "model", "package")}
    assert labels["comfy_memx_model_bytes"] == {("model", "package", "state")}
    assert labels["comfy_memx_pinned_bytes"] == {()}
    assert labels["comfy_memx_pin_cap_bytes"] == {("source",)}
    assert labels["comfy_memx_loads_total"] == labels["comfy_memx_load_bytes_total"] == {("package",)}
    assert labels["comfy_memx_unloads_total"] == {("package", "reason")}
    assert labels["comfy_memx_unload_bytes_total"] == {("reason",)}
    assert labels["comfy_memx_leaks_total"] == {("found_by", "loader_package", "package", "stage")}
    assert labels["comfy_memx_leaked_bytes"] == {("found_by", "loader_package", "package")}
    assert labels["comfy_memx_info"] == {("leak_mode", "source", "version")}
    assert labels["comfy_memx_patch_sites"] == {("state",)}
    assert labels["comfy_memx_pin_evictions_total"] == labels["comfy_memx_pin_evicted_bytes_total"] == {("reason",)}
    assert labels["comfy_memx_pin_refusals_total"] == {("reason",)}
    assert ("le",) in labels["comfy_memx_load_seconds_bucket"] and ("le",) in labels["comfy_memx_offload_seconds_bucket"]


def test_values_follow_the_events_and_the_state():
    s = exposition()
    assert s[("comfy_memx_loaded_bytes", (("device", "cuda:0"),))] == 650
    assert s[("comfy_memx_loaded_bytes", (("device", "cpu"),))] == 0
    assert s[("comfy_memx_model_loaded_bytes", (("device", "cuda:0"), ("model", "SDXL"), ("package", "leaky_pack")))] == 600
    assert s[("comfy_memx_model_bytes", (("model", "Leaky"), ("package", "leaky_pack"),
                                         ("state", "leaked")))] == 70
    assert s[("comfy_memx_pinned_bytes", ())] == 123
    assert s[("comfy_memx_pin_cap_bytes", (("source", "comfy_memx"),))] == 1000
    assert s[("comfy_memx_pin_cap_bytes", (("source", "comfyui"),))] == 900
    assert s[("comfy_memx_loads_total", (("package", "leaky_pack"),))] == 1
    assert s[("comfy_memx_load_bytes_total", (("package", "core"),))] == 50
    assert s[("comfy_memx_unloads_total", (("package", "leaky_pack"), ("reason", "memory_pressure")))] == 1
    assert s[("comfy_memx_unload_bytes_total", (("reason", "free_request"),))] == 200
    warned = (("found_by", "comfyui_warning"),)
    assert s[("comfy_memx_leaks_total", warned + (("loader_package", "leaky_pack"), ("package", "ComfyUI-Cachey"),
                                                  ("stage", "rooted")))] == 1
    assert s[("comfy_memx_leaks_total", warned + (("loader_package", "leaky_pack"), ("package", "unknown"),
                                                  ("stage", "cycle")))] == 1
    assert s[("comfy_memx_leaked_bytes", (("found_by", "no_patcher"), ("loader_package", "leaky_pack"),
                                          ("package", "ComfyUI-Cachey")))] == 70
    assert s[("comfy_memx_pin_evictions_total", (("reason", "cap"),))] == 1
    assert s[("comfy_memx_pin_evicted_bytes_total", (("reason", "cap"),))] == 30
    assert s[("comfy_memx_pin_refusals_total", (("reason", "over_cap"),))] == 1
    assert s[("comfy_memx_load_seconds_count", ())] == 2 and s[("comfy_memx_load_seconds_sum", ())] == pytest.approx(0.21)
    assert s[("comfy_memx_load_seconds_bucket", (("le", "0.01"),))] == 1
    assert s[("comfy_memx_offload_seconds_count", ())] == 2


def test_gauges_drop_models_that_are_gone_and_unknown_caps_are_absent():
    rows = list(ROWS)
    m = metrics.Metrics(model_rows=lambda: rows,
                        pin_facts=lambda: {"pinned_bytes": 0, "cap_bytes": None, "comfyui_cap_bytes": None})
    first = samples_of(m.exposition()[0].decode())
    rows.pop(0)
    second = samples_of(m.exposition()[0].decode())
    assert any(labels and ("model", "SDXL") in labels for _, labels in first)
    assert not any(labels and ("model", "SDXL") in labels for _, labels in second)
    assert not [key for key in second if key[0] == "comfy_memx_pin_cap_bytes"]


def test_private_registry_leaves_the_global_one_alone():
    before = set(prometheus_client.REGISTRY._names_to_collectors)
    exposition()
    assert set(prometheus_client.REGISTRY._names_to_collectors) == before
    assert not any(name.startswith("comfy_memx") for name in before)


def test_install_subscribes_to_the_event_stream_and_uninstall_stops(monkeypatch):
    STATE.events = EventLog()
    assert metrics.install() is metrics.install()      # one per process
    try:
        STATE.events.emit("load", owner=OWNER, bytes=10, seconds=0.1)
        counted = metrics.installed().loads.labels("leaky_pack")._value.get()
        assert counted == 1
    finally:
        metrics.uninstall()
    STATE.events.emit("load", owner=OWNER, bytes=10, seconds=0.1)
    assert metrics.installed() is None and not STATE.events.wanted


def test_install_without_prometheus_client_returns_none(monkeypatch):
    def missing():
        raise metrics.MetricsUnavailable("no prometheus_client")
    monkeypatch.setattr(metrics, "_prometheus", missing)
    assert metrics.install() is None and metrics.installed() is None
    with pytest.raises(metrics.MetricsUnavailable):
        metrics.Metrics()


def test_a_leak_counts_once_and_its_later_sightings_and_searches_count_apart():
    search = {"seconds": 0.1, "objects_visited": 10, "complete": True}
    held = {"holder_package": "leaky_pack"}
    samples = exposition(events=[
        {"event": "leak", "owner": OWNER, "stage": "rooted", "reason": "new", "search": search, **held},
        {"event": "leak_seen", "owner": OWNER, "stage": "rooted", "sightings": 2, **held},
        {"event": "leak_seen", "owner": OWNER, "stage": "rooted", "sightings": 3, **held},
        {"event": "leak", "owner": OWNER, "stage": "rooted", "reason": "holders_changed", "search": search, **held},
        {"event": "leak", "owner": OWNER, "stage": "rooted", "reason": "new",
         "search": {"deferred": True, "reason": "new"}, **held},
    ])
    both = (("loader_package", "leaky_pack"), ("package", "leaky_pack"))
    assert samples[("comfy_memx_leaks_total", (("found_by", "comfyui_warning"),) + both + (("stage", "rooted"),))] == 2
    assert samples[("comfy_memx_leak_sightings_total", both)] == 2
    assert samples[("comfy_memx_leak_searches_total", (("reason", "new"),))] == 1
    assert samples[("comfy_memx_leak_searches_total", (("reason", "holders_changed"),))] == 1


def test_reloads_are_counted_by_model_and_causing_package():
    reload = {"cause": "ComfyUI-Unload-Model/UnloadAllModels", "package": "ComfyUI-Unload-Model",
              "reason": "unload_all", "seconds": 1.5, "bytes": 100}
    samples = exposition(events=[
        {"event": "load", "model": "BaseModel", "owner": OWNER, "bytes": 100, "seconds": 1.5, "reload": None},
        {"event": "load", "model": "BaseModel", "owner": OWNER, "bytes": 100, "seconds": 1.5, "reload": reload},
        {"event": "load", "model": "BaseModel", "owner": OWNER, "bytes": 100, "seconds": 2.5,
         "reload": {**reload, "seconds": 2.5}},
    ])
    labels = (("cause_package", "ComfyUI-Unload-Model"), ("model", "BaseModel"))
    assert samples[("comfy_memx_reloads_total", labels)] == 2
    assert samples[("comfy_memx_reload_seconds_total", labels)] == 4.0
