"""The metrics a fleet's alerts and dashboard read: holder packages of leaks, free receipts, GB/s, the info metric,
label cardinality caps, counters that start at 0, the process start time and the host's memory."""

import pytest

from comfy_memx.core import registry
from comfy_memx.core.state import STATE
from comfy_memx.surface import metrics

parser = pytest.importorskip("prometheus_client.parser")

OWNER = {"prompt_id": "p", "node_id": "1", "class_type": "MemxTinyModelLoader", "package": "loader_pack"}
PINS = {"pinned_bytes": 0, "cap_bytes": None, "comfyui_cap_bytes": None}
FACTS = {"version": "9.9.9", "leak_mode": "strict", "source": "launcher", "sites": [
    {"patch": "model_management", "site": "load_models_gpu", "state": "patched", "reason": None},
    {"patch": "model_management", "site": "unload_model_and_clones", "state": "skipped",
     "reason": "absent in this ComfyUI"},
    {"patch": "loader", "site": "load_torch_file", "state": "skipped", "reason": "disabled by COMFY_MEMX_DISABLE"},
    {"patch": "model_management", "site": "free_memory", "state": "rewrapped",
     "reason": "replaced by multigpu.free_memory (package multigpu_like); comfy_memx wraps the replacement"},
]}


def row(model_id, nbytes, loaded=0, state="loaded", device="cpu", package="loader_pack", leak=None):
    return {"model": model_id.split("#")[0], "model_id": model_id, "owner": {**OWNER, "package": package},
            "load_device": device, "loaded_bytes": loaded, "bytes": nbytes, "state": state, "leak": leak}


def scrape(m):
    found = {}
    for family in parser.text_string_to_metric_families(m.exposition()[0].decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def named(samples, name):
    return {labels: value for (sample_name, labels), value in samples.items() if sample_name == name}


def new_metrics(rows=(), facts=FACTS):
    rows = list(rows)
    return metrics.Metrics(model_rows=lambda: rows, pin_facts=lambda: PINS, process_facts=lambda: facts), rows


def test_leak_counters_name_the_holding_package_and_the_loading_one():
    m, _ = new_metrics()
    m.observe({"event": "leak", "model_id": "Net#1", "owner": OWNER, "stage": "rooted", "reason": "new",
               "holder_package": "memx_test_nodes"})
    m.observe({"event": "leak_seen", "model_id": "Net#1", "owner": OWNER, "stage": "rooted"})  # holder remembered
    m.observe({"event": "leak", "model_id": "Net#2", "owner": OWNER, "stage": "rooted", "reason": "new",
               "holder_package": None, "found_by": "after_free"})
    leaks = named(scrape(m), "comfy_memx_leaks_total")
    assert leaks == {
        (("found_by", "comfyui_warning"), ("loader_package", "loader_pack"), ("package", "memx_test_nodes"),
         ("stage", "rooted")): 1,
        (("found_by", "after_free"), ("loader_package", "loader_pack"), ("package", "unknown"), ("stage", "rooted")): 1,
    }
    assert named(scrape(m), "comfy_memx_leak_sightings_total") == {
        (("loader_package", "loader_pack"), ("package", "memx_test_nodes")): 1}


def test_leaked_bytes_are_summed_by_holder_and_forgotten_with_the_model():
    m, rows = new_metrics([row("Net#1", 100, state="leaked"), row("Net#2", 30, state="leaked"),
                           row("Net#3", 7, state="leaked", leak={"stage": "rooted", "holder_package": "pack_c"}),
                           row("Vae#1", 1000, loaded=1000)])
    m.observe({"event": "leak", "model_id": "Net#1", "owner": OWNER, "stage": "rooted", "holder_package": "pack_a"})
    no_record, warned = ("found_by", "no_patcher"), ("found_by", "comfyui_warning")
    assert named(scrape(m), "comfy_memx_leaked_bytes") == {
        (no_record, ("loader_package", "loader_pack"), ("package", "pack_a")): 100,
        (no_record, ("loader_package", "loader_pack"), ("package", "unknown")): 30,
        (warned, ("loader_package", "loader_pack"), ("package", "pack_c")): 7,
    }
    del rows[0]
    scrape(m)
    assert "Net#1" not in m.holders
    assert (no_record, ("loader_package", "loader_pack"), ("package", "pack_a")) not in named(
        scrape(m), "comfy_memx_leaked_bytes")


def test_free_receipts_count_survivors_and_the_last_free_is_kept_apart():
    m, _ = new_metrics()
    memx_free = {"kind": "http", "route": "/memx/free", "client": "127.0.0.1"}
    m.observe({"event": "free", "origin": memx_free, "freed_bytes": 500, "survivors": 2, "survivor_bytes": 70,
               "memory": {"held_bytes": 70, "rss_after": 900, "trim": {"returned_bytes": 5}},
               "survivor_packages": [{"package": "ComfyUI-Cachey", "loader_package": "core"},
                                     {"package": "ComfyUI-Cachey", "loader_package": "core"}]})
    survivors = named(scrape(m), "comfy_memx_last_free_survivor_models")
    assert survivors == {(("loader_package", "core"), ("package", "ComfyUI-Cachey")): 2}
    m.observe({"event": "free", "origin": {"kind": "comfy_memx", "via": "idle_unload"}, "freed_bytes": 10,
               "survivors": 0, "survivor_bytes": 0, "memory": {}, "survivor_packages": []})
    s = scrape(m)
    assert named(s, "comfy_memx_frees_total") == {(("origin", "/memx/free"),): 1, (("origin", "idle_unload"),): 1,
                                                  (("origin", "handoff"),): 0}
    assert named(s, "comfy_memx_last_free_survivor_models") == {}   # the last free left none: no package listed
    assert s[("comfy_memx_free_freed_bytes_total", (("origin", "/memx/free"),))] == 500
    assert s[("comfy_memx_free_survivors_total", (("origin", "/memx/free"),))] == 2
    assert s[("comfy_memx_free_survivors_total", (("origin", "idle_unload"),))] == 0
    assert s[("comfy_memx_last_free_survivors", ())] == 0          # the idle unload came last and left none
    assert s[("comfy_memx_last_free_bytes", (("kind", "survivors"),))] == 0
    assert s[("comfy_memx_last_free_bytes", (("kind", "allocator_retained"),))] == 5


def test_gb_per_s_histograms_take_only_loads_that_copied_bytes():
    m, _ = new_metrics()
    m.observe({"event": "load", "owner": OWNER, "bytes": 10, "seconds": 0.1, "gb_per_s": 3.0})
    m.observe({"event": "load", "owner": OWNER, "bytes": 10, "seconds": 0.1, "gb_per_s": None})
    m.observe({"event": "unload", "owner": OWNER, "reason": "memory_pressure", "bytes": 10, "seconds": 0.1,
               "gb_per_s": 20.0})
    s = scrape(m)
    assert s[("comfy_memx_load_gbps_count", ())] == 1 and s[("comfy_memx_load_seconds_count", ())] == 2
    assert s[("comfy_memx_load_gbps_bucket", (("le", "2.0"),))] == 0
    assert s[("comfy_memx_load_gbps_bucket", (("le", "4.0"),))] == 1
    assert s[("comfy_memx_offload_gbps_sum", ())] == 20.0


def test_info_metric_and_skipped_sites_tell_where_and_how_comfy_memx_runs():
    m, _ = new_metrics()
    s = scrape(m)
    assert named(s, "comfy_memx_info") == {(("leak_mode", "strict"), ("source", "launcher"), ("version", "9.9.9")): 1}
    assert named(s, "comfy_memx_patch_sites") == {(("state", "patched"),): 1, (("state", "rewrapped"),): 1,
                                                  (("state", "skipped"),): 2}
    assert named(s, "comfy_memx_patch_skipped") == {
        (("patch", "model_management"), ("reason", "absent"), ("site", "unload_model_and_clones")): 1,
        (("patch", "loader"), ("reason", "disabled"), ("site", "load_torch_file")): 1,
    }


def test_process_facts_read_the_patch_table_and_count_unimported_targets_as_skipped():
    table = registry.table()
    table.status[("model_management", "load_models_gpu")] = ("patched", None)
    table.armed["dynamic_pins"] = "comfy.pinned_memory"
    facts = metrics.process_facts()
    assert facts["version"] == metrics.__version__ and facts["leak_mode"] == STATE.config.leak_mode
    states = {(site["patch"], site["site"]): (site["state"], metrics.skip_reason(site["reason"]))
              for site in facts["sites"]}
    assert states[("model_management", "load_models_gpu")] == ("patched", "other")
    assert states[("dynamic_pins", "pin_memory")] == ("skipped", "not_imported")


def test_package_labels_are_capped_and_the_rest_is_folded_into_other():
    m, _ = new_metrics()
    for number in range(metrics.MAX_PACKAGES + 5):
        m.observe({"event": "load", "owner": {**OWNER, "package": f"pack_{number}"}, "bytes": 1, "seconds": 0.1})
    m.observe({"event": "load", "owner": {**OWNER, "package": "pack_0"}, "bytes": 1, "seconds": 0.1})
    loads = named(scrape(m), "comfy_memx_loads_total")
    assert len(loads) == metrics.MAX_PACKAGES + 1
    assert loads[(("package", "other"),)] == 5 and loads[(("package", "pack_0"),)] == 2
    assert sum(loads.values()) == metrics.MAX_PACKAGES + 6


def test_per_model_gauges_show_the_largest_models_and_one_other_series_per_device_and_state():
    rows = [row(f"Net{n}#{n}", 100 + n, loaded=100 + n, device="cuda:0" if n % 2 else "cpu")
            for n in range(metrics.MAX_MODEL_SERIES + 6)]
    m, _ = new_metrics(rows)
    s = scrape(m)
    per_model = named(s, "comfy_memx_model_loaded_bytes")
    sizes = named(s, "comfy_memx_model_bytes")
    assert len(per_model) == metrics.MAX_MODEL_SERIES + 2           # + "other" on cpu and on cuda:0
    assert len(sizes) == metrics.MAX_MODEL_SERIES + 1               # + "other" in state loaded
    assert sum(per_model.values()) == sum(r["loaded_bytes"] for r in rows)
    assert sum(sizes.values()) == sum(r["bytes"] for r in rows)
    assert not any(("model", "Net0") in labels for labels in per_model)   # the smallest are folded
    assert (("device", "cpu"), ("model", "other"), ("package", "other")) in per_model
    assert not any(name == "model_id" for labels in list(per_model) + list(sizes) for name, _ in labels)


def test_model_ids_make_no_new_series_and_copies_of_one_model_are_summed():
    rows = [row("Unet#1", 100, loaded=100), row("Unet#2", 50, loaded=50)]
    m, live = new_metrics(rows)
    first = named(scrape(m), "comfy_memx_model_bytes")
    assert first == {(("model", "Unet"), ("package", "loader_pack"), ("state", "loaded")): 150}
    for number in range(3, 40):    # every prompt loads the model again under a new id
        live[:] = [row(f"Unet#{number}", 100, loaded=100)]
        labels = set(named(scrape(m), "comfy_memx_model_bytes")) | set(named(scrape(m), "comfy_memx_model_loaded_bytes"))
        assert labels == {(("model", "Unet"), ("package", "loader_pack"), ("state", "loaded")),
                          (("device", "cpu"), ("model", "Unet"), ("package", "loader_pack"))}


def test_counters_of_known_label_values_start_at_zero():
    s = scrape(new_metrics()[0])
    for origin in ("/memx/free", "idle_unload", "handoff"):
        for name in ("comfy_memx_frees_total", "comfy_memx_free_freed_bytes_total", "comfy_memx_free_survivors_total"):
            assert s[(name, (("origin", origin),))] == 0, (name, origin)
    for reason in ("free_request", "unload_all", "memory_pressure", "oom"):
        assert s[("comfy_memx_unload_bytes_total", (("reason", reason),))] == 0
    for reason in ("new", "holders_changed", "deferred"):
        assert s[("comfy_memx_leak_searches_total", (("reason", reason),))] == 0


@pytest.mark.skipif(not metrics.os.path.exists("/proc/self/stat"), reason="the process collector reads /proc")
def test_the_process_start_time_and_the_host_memory_are_exported():
    import os
    import time
    s = scrape(new_metrics()[0])
    started = s[("process_start_time_seconds", ())]
    assert time.time() - 7 * 86400 < started <= time.time()
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 < s[("comfy_memx_host_memory_bytes", ())] <= physical


def test_host_memory_is_the_lower_of_ram_and_the_cgroup_limit(tmp_path, monkeypatch):
    import os
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit, unlimited = tmp_path / "memory.max", tmp_path / "v1_limit"
    limit.write_text("1073741824\n")
    unlimited.write_text("max\n")
    monkeypatch.setattr(metrics, "CGROUP_LIMITS", (str(unlimited), str(tmp_path / "missing")))
    assert metrics.host_memory_bytes() == physical
    monkeypatch.setattr(metrics, "CGROUP_LIMITS", (str(limit), str(unlimited)))
    assert metrics.host_memory_bytes() == min(physical, 1073741824)


def test_the_exposition_has_no_created_series():
    m, _ = new_metrics()
    m.observe({"event": "load", "owner": OWNER, "bytes": 1, "seconds": 0.1})
    text = m.exposition()[0].decode()
    assert "comfy_memx_loads_total" in text and "_created" not in text


def test_a_receipt_names_the_package_that_holds_each_survivor():
    from comfy_memx.surface import freeing
    rows = [{"owner": {"package": "core"}, "leak": {"holder_package": "ComfyUI-Cachey"}, "holders": None},
            {"owner": {"package": "loader_pack"}, "leak": None,
             "holders": [{"holder_package": "hoarder_pack", "path": "x"}]},
            {"owner": {"package": "core"}, "leak": None, "holders": None}]
    assert freeing.survivor_packages(rows) == [{"package": "ComfyUI-Cachey", "loader_package": "core"},
                                               {"package": "hoarder_pack", "loader_package": "loader_pack"},
                                               {"package": "unknown", "loader_package": "core"}]


def leaked_row(model_id, nbytes, holder, found_by="comfyui_warning", found_at=1000.0, release=None):
    """A /memx/models row of a live leaked model with a leak record (as ``leaks.public_state`` shows it)."""
    leak = {"stage": "rooted", "time": found_at, "holder_package": holder, "found_by": found_by}
    return {**row(model_id, nbytes, state="leaked", leak=leak), "release": {"last": release} if release else None}


def test_the_newest_live_leak_time_is_read_at_scrape_and_leaves_with_its_model():
    rows = [leaked_row("Net#1", 10, "pack_a", found_at=1000.0), leaked_row("Net#2", 10, "pack_a", found_at=1300.0),
            leaked_row("Net#3", 10, "pack_b", found_by="after_free", found_at=1200.0), row("Vae#1", 5, loaded=5)]
    m, live = new_metrics(rows)
    warned_a = (("found_by", "comfyui_warning"), ("loader_package", "loader_pack"), ("package", "pack_a"),
                ("stage", "rooted"))
    freed_b = (("found_by", "after_free"), ("loader_package", "loader_pack"), ("package", "pack_b"), ("stage", "rooted"))
    assert named(scrape(m), "comfy_memx_leak_found_timestamp_seconds") == {warned_a: 1300.0, freed_b: 1200.0}
    del live[1]   # the newest of pack_a was released: its time goes with it, no event needed
    del live[1]
    assert named(scrape(m), "comfy_memx_leak_found_timestamp_seconds") == {warned_a: 1000.0}


def test_free_survivors_are_the_live_leaks_a_free_left_alive_comfyuis_own_free_included():
    rows = [leaked_row("Net#1", 10, "pack_a", found_at=1000.0),                       # warned before the free
            leaked_row("Net#2", 10, "pack_b", found_by="after_free", found_at=2100.0),  # found by the free
            leaked_row("Net#3", 10, "pack_c", found_at=3000.0),                       # warned after the free
            row("Vae#1", 5, loaded=5)]
    m, live = new_metrics(rows)
    survivors = named(scrape(m), "comfy_memx_free_survivor_models")
    assert survivors == {(("loader_package", "loader_pack"), ("package", "pack_b")): 1}   # no free seen yet
    # ComfyUI's own POST /free: only its worker's unloads tell (no /memx/free receipt, no free event)
    m.observe({"event": "unload", "time": 2000.0, "owner": OWNER, "reason": "free_request", "bytes": 5})
    survivors = named(scrape(m), "comfy_memx_free_survivor_models")
    assert survivors == {(("loader_package", "loader_pack"), ("package", "pack_a")): 1,
                         (("loader_package", "loader_pack"), ("package", "pack_b")): 1}
    m.observe({"event": "free", "time": 3500.0, "origin": None, "survivors": 0, "memory": {}})   # a /memx/free
    assert len(named(scrape(m), "comfy_memx_free_survivor_models")) == 3
    live[:] = [r for r in live if r["model_id"] not in ("Net#1", "Net#3")]   # released: gone at the next scrape
    assert named(scrape(m), "comfy_memx_free_survivor_models") == {
        (("loader_package", "loader_pack"), ("package", "pack_b")): 1}
    live[:] = []
    assert named(scrape(m), "comfy_memx_free_survivor_models") == {}


def test_failed_releases_are_live_leaks_whose_last_release_gave_nothing_back():
    rows = [leaked_row("Net#1", 10, "pack_a", release="in_use"), leaked_row("Net#2", 10, "pack_a", release="survivor"),
            leaked_row("Net#3", 10, "pack_b", release="busy"), leaked_row("Net#4", 10, "pack_b")]
    m, live = new_metrics(rows)
    assert named(scrape(m), "comfy_memx_release_failed_models") == {
        (("outcome", "in_use"), ("package", "pack_a")): 1, (("outcome", "survivor"), ("package", "pack_a")): 1}
    live[:] = live[2:]
    assert named(scrape(m), "comfy_memx_release_failed_models") == {}


def test_counters_count_every_request_event_that_the_events_file_has_no_room_for(tmp_path):
    from comfy_memx.core.events import EventLog
    m, _ = new_metrics()
    log = EventLog(str(tmp_path / "events.jsonl"), request_rate=1)
    log.subscribe(m.observe)
    for _ in range(30):
        log.emit_request("release", package="pack_a", outcome="in_use", died=False, bytes=10)
        log.emit_request("free", origin={"kind": "http", "route": "/memx/free"}, freed_bytes=1, survivors=0,
                         memory={})
    log.close()
    assert log.stats()["dropped"]["rate"] >= 50   # the file kept a few lines ...
    s = scrape(m)   # ... the counters every event
    assert s[("comfy_memx_releases_total", (("outcome", "in_use"), ("package", "pack_a")))] == 30
    assert s[("comfy_memx_frees_total", (("origin", "/memx/free"),))] == 30
