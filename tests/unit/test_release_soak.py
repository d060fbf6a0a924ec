"""Offline checks of ``bench.soak --workload release`` (no ComfyUI server): its options, the workload against the
release pack's declared inputs, the verdict's rules (survivors, RSS growth, images, receipts, latency), the summary,
and the release pack's caches against a stubbed ``comfy``: each keeps its model, a cut entry is recomputed with the
same weights and the same image, and ``MEMX_RELEASE_NODES_CACHE=off`` keeps nothing."""

import gc
import hashlib
import json
import types
import weakref
from pathlib import Path

import pytest

from bench import harness, soak
from bench.soak import release, release_verdict as verdict
from bench.soak.config import RELEASE_LAG, RELEASE_LOADERS, RELEASE_SERVERS
from bench.soak.release_workload import (LEAK, REUSE, build_release_workload, built_after, distinct_keys,
                                         model_bytes, recent_keys, release_census_prompt)
from memx_helpers import load_module, stub_comfy_modules

PACK = Path(harness.pack_source("memx_release_nodes")) / "__init__.py"
MIB = 1024 ** 2

pack = load_module("memx_release_nodes_offline", PACK)


@pytest.fixture
def tree(tmp_path):
    folder = tmp_path / "ComfyUI"
    folder.mkdir()
    (folder / "main.py").write_text("")
    return str(folder)


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

def test_release_defaults(tree):
    options = soak.parse_args(["--comfyui", tree, "--workload", "release"])
    assert (options.prompts, options.reuse_every, options.features, options.depth) == (300, 10, 1024, 2)
    assert soak.parse_args(["--comfyui", tree]).prompts == 500          # the other workloads keep theirs
    assert soak.parse_args(["--comfyui", tree, "--workload", "release", "--prompts", "40"]).prompts == 40


@pytest.mark.parametrize("args", [["--no-plain"], ["--reuse-every", "1"], ["--features", "4"],
                                  ["--features", "9000"], ["--depth", "65"], ["--depth", "0"]])
def test_release_bad_arguments_exit_with_status_2(tree, args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        soak.parse_args(["--comfyui", tree, "--workload", "release"] + args)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------------------------

def declared_inputs(node_class):
    types_ = node_class.INPUT_TYPES()
    return {**types_.get("required", {}), **types_.get("optional", {})}


def test_every_prompt_uses_the_packs_nodes_with_their_declared_inputs_and_comfyuis_save_image():
    workload = build_release_workload(300)
    assert [item["index"] for item in workload] == list(range(300))
    for item in workload:
        prompt = item["prompt"]
        for node in prompt.values():
            if node["class_type"] == "SaveImage":
                assert set(node["inputs"]) == {"images", "filename_prefix"}
                source, output = node["inputs"]["images"]
                assert pack.NODE_CLASS_MAPPINGS[prompt[source]["class_type"]].RETURN_TYPES[output] == "IMAGE"
                continue
            declared = declared_inputs(pack.NODE_CLASS_MAPPINGS[node["class_type"]])
            assert set(node["inputs"]) == set(declared)
            for name, value in node["inputs"].items():
                if isinstance(value, list):
                    source, output = value
                    source_class = pack.NODE_CLASS_MAPPINGS[prompt[source]["class_type"]]
                    assert source_class.RETURN_TYPES[output] == declared[name][0]
                elif declared[name][0] == "INT":
                    assert declared[name][1]["min"] <= value <= declared[name][1]["max"]
                    assert value % declared[name][1].get("step", 1) == 0
                else:
                    assert isinstance(value, str) and declared[name][0] == "STRING"


def test_leak_prompts_take_the_four_loaders_in_turn_each_with_a_key_never_asked_for_before():
    workload = build_release_workload(300)
    leaks = [item for item in workload if item["kind"] == LEAK]
    assert [item["loader"] for item in leaks[:8]] == list(RELEASE_LOADERS) * 2
    assert len({item["key"] for item in leaks}) == len(leaks)
    for item in leaks:
        node = item["prompt"]["1"]
        assert node["class_type"] == RELEASE_LOADERS[item["loader"]][0]
        render = item["prompt"]["2"]["inputs"]
        assert render["seed"] == item["index"] and item["origin"] == item["index"]
        if item["loader"] == "resolution":
            assert item["key"] == f"resolution:{node['inputs']['width']}x{node['inputs']['height']}"
            assert (render["width"], render["height"]) == (node["inputs"]["width"], node["inputs"]["height"])
        else:
            assert item["key"] == f"{item['loader']}:{node['inputs']['name']}"
    prefixes = [item["prompt"]["3"]["inputs"]["filename_prefix"] for item in leaks]
    assert len(set(prefixes)) == len(prefixes)


def test_reuse_prompts_repeat_an_old_leak_prompt_exactly():
    workload = build_release_workload(300, reuse_every=10, min_age=8)
    reuses = [item for item in workload if item["kind"] == REUSE]
    assert len(reuses) == 30 and all(item["index"] % 10 == 9 for item in reuses)
    origins = [item["origin"] for item in reuses]
    assert len(set(origins)) == len(origins)
    for item in reuses:
        original = workload[item["origin"]]
        assert original["kind"] == LEAK and item["index"] - original["index"] >= 8
        assert json.dumps(item["prompt"], sort_keys=True) == json.dumps(original["prompt"], sort_keys=True)
        assert item["key"] == original["key"]
    assert {item["loader"] for item in reuses} == set(RELEASE_LOADERS)
    assert [item["kind"] for item in build_release_workload(10, reuse_every=2, min_age=3)] == [
        LEAK, LEAK, LEAK, REUSE, LEAK, REUSE, LEAK, REUSE, LEAK, REUSE]   # prompt 1 is due, but nothing is 3 old
    with pytest.raises(ValueError):
        build_release_workload(10, reuse_every=1)


def test_key_sets_and_counts():
    workload = build_release_workload(30)
    assert len(distinct_keys(workload)) == sum(1 for item in workload if item["kind"] == LEAK) == 27
    assert recent_keys(workload, 2) == sorted({workload[-1]["key"], workload[-2]["key"]})
    assert recent_keys(workload, 0) == []
    assert built_after(workload, -1, release=True) == 30
    assert built_after(workload, -1, release=False) == 27
    assert built_after(workload, 19, release=False) == 9
    assert model_bytes(1024, 2) == pack.model_bytes(1024, 2) == 2 * 4 * (1024 * 1024 + 1024)


def test_census_prompt_uses_the_census_node():
    (node,) = release_census_prompt(7).values()
    census = pack.NODE_CLASS_MAPPINGS[node["class_type"]]
    assert set(node["inputs"]) == set(declared_inputs(census)) and census.OUTPUT_NODE


# ---------------------------------------------------------------------------------------------------------------
# Verdict
# ---------------------------------------------------------------------------------------------------------------

def test_rss_growth_compares_the_medians_of_two_windows():
    base = 900 * MIB
    samples = [(i, base + i * 8 * MIB, 0) for i in range(50)]
    samples[48] = (48, base + 10_000 * MIB, 0)              # one spike inside the last window: the median ignores it
    # window: prompts 10..14 and 45..49; medians after prompts 12 and 47
    assert verdict.growth_window(50, 0.2) == (10, 49)
    assert verdict.rss_growth(samples, 50, 0.2) == (47 - 12) * 8 * MIB
    assert verdict.rss_growth([(i, base, 0) for i in range(50)], 50, 0.2) == 0
    assert verdict.growth_window(12, 0.2) is None and verdict.rss_growth(samples[:12], 12, 0.2) is None
    assert verdict.rss_growth([(i, None, None) for i in range(50)], 50, 0.2) is None


def test_leaked_bytes_count_the_leak_prompts_between_the_window_middles():
    items = build_release_workload(50, reuse_every=10)
    leaks = sum(1 for item in items if item["kind"] == LEAK and 12 < item["index"] <= 47)
    assert verdict.leaked_bytes(items, 50, 0.2, 8 * MIB) == leaks * 8 * MIB
    assert leaks == 35 - 3                                      # reuse prompts 19, 29, 39 leak nothing new
    assert verdict.leaked_bytes(items[:12], 12, 0.2, MIB) is None


def test_survivors_with_release_allow_only_the_last_prompts_models():
    items = build_release_workload(30)
    last = [items[-1]["key"], items[-2]["key"]]
    ok = verdict.survivors({"alive": sorted(last)}, items, released=True)
    assert ok["ok"] and ok["stale"] == 0 and ok["recent_alive"] == sorted(last)
    stale = verdict.survivors({"alive": sorted(last + [items[0]["key"]])}, items, released=True)
    assert not stale["ok"] and stale["stale_keys"] == [items[0]["key"]]
    assert verdict.survivors({"alive": []}, items, released=True)["ok"]
    assert not verdict.survivors(None, items, released=True)["ok"]
    assert RELEASE_LAG == 2


def test_survivors_without_release_are_every_key_once():
    items = build_release_workload(30)
    keys = distinct_keys(items)
    assert verdict.survivors({"alive": list(keys)}, items, released=False)["ok"]
    missing = verdict.survivors({"alive": keys[1:]}, items, released=False)
    assert not missing["ok"] and missing["missing"] == [keys[0]]
    twice = verdict.survivors({"alive": keys + [keys[0]]}, items, released=False)
    assert not twice["ok"] and twice["extra"] == [keys[0]]
    stranger = verdict.survivors({"alive": keys + ["named:zz"]}, items, released=False)
    assert not stranger["ok"] and stranger["extra"] == ["named:zz"]


def hashes_for(items, salt=""):
    """What the four servers would save: a hash per key (a reuse saves its original's bytes)."""
    return [f"{salt}{item['key']}" for item in items]


def test_images_must_match_across_servers_and_a_reuse_its_original():
    items = build_release_workload(30)
    same = {label: hashes_for(items) for label in RELEASE_SERVERS}
    result = verdict.compare_images(items, same)
    assert result["ok"] and result["prompts_compared"] == 30 and result["reuses_compared"] == 3
    other = dict(same, auto=list(same["auto"]))
    other["auto"][4] = "different"
    result = verdict.compare_images(items, other)
    assert not result["ok"] and result["differing"] == 1 and result["differing_examples"][0]["index"] == 4
    reused = {label: list(hashes) for label, hashes in same.items()}
    reuse = next(item for item in items if item["kind"] == REUSE)
    for label in RELEASE_SERVERS:                              # every server agrees, but not with the original
        reused[label][reuse["index"]] = "recomputed-differently"
    result = verdict.compare_images(items, reused)
    assert not result["ok"] and result["differing"] == 0 and result["reuse_differing"] == 4
    gone = dict(same, off=list(same["off"]))
    gone["off"][3] = None
    assert verdict.compare_images(items, gone)["missing"] == 1
    short = dict(same, plain=same["plain"][:20])
    assert not verdict.compare_images(items, short)["ok"]


def server_summary(prompts, items, label, growth_mib):
    keys = distinct_keys(items)
    alive = keys if label in ("plain", "off") else recent_keys(items, 1)
    summary = {"prompts_run": prompts, "failed": 0, "log": {"comfy_memx_tracebacks": 0, "internal_errors": [],
                                                            "tracebacks": 0},
               "census": {"alive": list(alive), "alive_bytes": len(alive) * 8 * MIB},
               "images": hashes_for(items), "e2e_s": [0.5] * prompts, "exec_s": [0.4] * prompts,
               "rss_after": [(i, 900 * MIB + int(i * growth_mib * MIB), 0) for i in range(prompts)],
               "latency": {"e2e": {"median": 0.5}}}
    if label in ("off", "auto"):
        summary["events"] = {"lines": 10, "valid": 10, "invalid": 0}
        released = prompts - 1 if label == "auto" else 0
        summary["releases"] = {"count": released, "by_outcome": {"released": released} if released else {},
                               "died": released, "other_entries_dropped": 0,
                               "by_pattern": {"class_cache": released}, "by_method": {"dict_entry": released}}
    return summary


def good_release_report(prompts=300):
    items = build_release_workload(prompts)
    growth = {"plain": 7.2, "fixed": 0.02, "off": 7.2, "auto": 0.05}   # MiB per prompt
    servers = {label: server_summary(prompts, items, label, growth[label]) for label in RELEASE_SERVERS}
    servers["auto"]["e2e_s"] = [0.51] * prompts
    return {"prompts": prompts, "comfyui": "/t", "error": None,
            "workload": {"model_bytes": model_bytes(1024, 2), "warmup": 0.2, "leak_prompts": 270,
                         "reuse_prompts": 30},
            "workload_items": [{k: item[k] for k in ("index", "kind", "loader", "key", "origin")} for item in items],
            "servers": servers}


def targets_of(report, check=True):
    report.pop("figures", None)
    verdict.analyse(report)
    return verdict.evaluate_release(report, check)


def test_a_good_release_report_meets_every_target():
    report = good_release_report()
    targets = targets_of(report)
    assert all(t["met"] for t in targets), [t for t in targets if not t["met"]]
    assert soak.exit_status(targets) == 0
    figures = report["figures"]
    assert figures["latency_ratio"] == pytest.approx(0.51 / 0.5)
    assert figures["servers"]["off"]["rss_growth"] > 0.5 * figures["leaked_bytes"]


@pytest.mark.parametrize("change", [
    lambda r: r["servers"]["auto"]["census"]["alive"].append("named:n1"),            # a stale survivor
    lambda r: r["servers"]["off"]["census"]["alive"].pop(0),                          # off lost a model
    lambda r: r["servers"]["fixed"]["census"]["alive"].append("list:l3"),             # the baseline kept one
    lambda r: r["servers"]["auto"]["images"].__setitem__(5, "x"),                     # an image differs
    lambda r: r["servers"]["auto"]["log"].update(comfy_memx_tracebacks=1),
    lambda r: r["servers"]["off"]["log"].update(internal_errors=["x"]),
    lambda r: r["servers"]["auto"]["events"].update(invalid=1),
    lambda r: r["servers"]["auto"]["releases"]["by_outcome"].update(released=10),     # too few releases
    lambda r: r["servers"]["auto"]["releases"].update(died=10),                       # released but not dead
    lambda r: r["servers"]["off"]["releases"].update(count=1),                        # off released something
    lambda r: r["servers"]["plain"].update(failed=1),
    lambda r: r["servers"]["fixed"].update(prompts_run=299),
    lambda r: r.update(error="timeout"),
    lambda r: r["servers"]["auto"].update(rss_after=[(i, 900 * MIB + i * MIB, 0) for i in range(300)]),
    lambda r: r["servers"]["off"].update(rss_after=[(i, 900 * MIB + i * MIB, 0) for i in range(300)]),
    lambda r: r["servers"]["auto"].update(e2e_s=[0.6] * 300),                         # 1.2x plain
])
def test_each_missed_target_fails_the_check(change):
    report = good_release_report()
    change(report)
    targets = targets_of(report)
    assert soak.exit_status(targets) == 1
    assert soak.exit_status(targets_of(report, check=False)) == 0


def test_short_runs_report_the_latency_and_the_release_rss_without_checking_them():
    report = good_release_report(60)
    report["servers"]["auto"]["e2e_s"] = [0.6] * 60
    report["servers"]["auto"]["rss_after"] = [(i, 900 * MIB + i * MIB, 0) for i in range(60)]
    targets = targets_of(report)
    for prefix in ("median of paired latencies", "RSS growth with release"):
        target = next(t for t in targets if t["name"].startswith(prefix))
        assert target["met"] is False and not target["checked"], target
    assert soak.exit_status(targets) == 0
    report["servers"]["off"]["rss_after"] = [(i, 900 * MIB, 0) for i in range(60)]   # no growth without release
    assert soak.exit_status(targets_of(report)) == 1


def test_summary_renders_a_full_and_an_empty_report():
    report = good_release_report()
    report["targets"] = targets_of(report)
    text = verdict.format_release_summary(report)
    assert "pack models alive at the end" in text and "[met   ] images identical" in text
    assert all(label in text.splitlines()[1] for label in RELEASE_SERVERS)
    empty = {"prompts": 5, "comfyui": "/t", "servers": {}, "workload_items": []}
    empty["targets"] = targets_of(empty)
    assert "MISSED" in verdict.format_release_summary(empty)


def test_release_receipts_are_summed_from_the_event_log(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [{"event": "leak", "time": 1, "pid": 1},
             {"event": "release", "time": 2, "pid": 1, "outcome": "released", "trigger": "auto", "died": True,
              "pattern": "class_cache", "method": "dict_entry", "bytes": 100, "other_entries_dropped": 0},
             {"event": "release", "time": 3, "pid": 1, "outcome": "released", "trigger": "auto", "died": True,
              "pattern": "lru_cache", "method": "lru_cache_clear", "bytes": 100, "other_entries_dropped": 2},
             {"event": "release", "time": 4, "pid": 1, "outcome": "in_use", "trigger": "auto", "died": False,
              "pattern": "appended_list", "method": None, "bytes": 100, "reason": "running"}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\nnot json\n")
    summary = release.release_events(str(path))
    assert summary["count"] == 3 and summary["by_outcome"] == {"released": 2, "in_use": 1}
    assert summary["died"] == 2 and summary["released_bytes"] == 200 and summary["other_entries_dropped"] == 2
    assert summary["by_method"] == {"dict_entry": 1, "lru_cache_clear": 1, "None": 1}
    assert [r["reason"] for r in summary["not_released"]] == ["running"]
    assert release.release_events(str(tmp_path / "none.jsonl"))["count"] == 0


def test_server_environments():
    assert release.server_env("plain", "strict", "/e") == {}
    assert release.server_env("fixed", "strict", "/e") == {"MEMX_RELEASE_NODES_CACHE": "off"}
    assert release.server_env("off", "strict", "/e") == {"COMFY_MEMX_LEAK_MODE": "strict", "COMFY_MEMX_EVENTS": "/e",
                                                         "COMFY_MEMX_RELEASE": "off"}
    auto = release.server_env("auto", "strict", "/e")
    assert auto["COMFY_MEMX_RELEASE"] == "auto" and auto["COMFY_MEMX_RELEASE_PACKAGES"] == "memx_release_nodes"


def test_image_hash_reads_the_saved_file(tmp_path):
    server = types.SimpleNamespace(base=str(tmp_path))
    (tmp_path / "output" / "memx_release").mkdir(parents=True)
    (tmp_path / "output" / "memx_release" / "a_00001_.png").write_bytes(b"png")
    entry = {"outputs": {"3": {"images": [{"filename": "a_00001_.png", "subfolder": "memx_release",
                                           "type": "output"}]}}}
    assert release.ReleaseServer.image_hash(server, entry) == hashlib.sha256(b"png").hexdigest()
    assert release.ReleaseServer.image_hash(server, {"outputs": {}}) is None
    entry["outputs"]["3"]["images"][0]["filename"] = "gone.png"
    assert release.ReleaseServer.image_hash(server, entry) is None


# ---------------------------------------------------------------------------------------------------------------
# The release pack against a stubbed comfy
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def stub_comfy(monkeypatch):
    pytest.importorskip("torch")
    loaded = stub_comfy_modules(monkeypatch)
    monkeypatch.delenv("MEMX_RELEASE_NODES_CACHE", raising=False)
    node_pack = load_module("memx_release_nodes_stubbed", PACK)
    yield node_pack, loaded
    loaded.clear()


def cut_entry(node_pack, loader):
    """Drop the pack's cache entry the way a release does (the lru_cache loaders: their whole cache)."""
    if loader == "resolution":
        node_pack.MemxReleaseResolutionLoader._cache.clear()
    elif loader == "named":
        node_pack.load_named_model.cache_clear()
    elif loader == "bounded":
        node_pack.load_bounded_model.cache_clear()
    else:
        node_pack.LOADED_MODULES.clear()


def load(node_pack, loader, item):
    node = node_pack.NODE_CLASS_MAPPINGS[RELEASE_LOADERS[loader][0]]()
    (patcher,) = node.load(**{**item["prompt"]["1"]["inputs"], "features": 32, "depth": 2})
    return patcher


def render(node_pack, patcher, item):
    inputs = item["prompt"]["2"]["inputs"]
    (image,) = node_pack.MemxReleaseRender().render(patcher, inputs["seed"], inputs["width"], inputs["height"])
    return image


@pytest.mark.parametrize("loader", list(RELEASE_LOADERS))
def test_each_loader_keeps_its_model_and_recomputes_a_cut_entry_identically(stub_comfy, loader):
    node_pack, loaded = stub_comfy
    item = next(i for i in build_release_workload(8) if i["loader"] == loader)
    first = load(node_pack, loader, item)
    again = load(node_pack, loader, item)
    assert again is not first and again.model is first.model          # a fresh patcher around the cached module
    assert first.model.memx_release_key == item["key"]
    image = render(node_pack, again, item)
    assert loaded == [again]
    assert tuple(image.shape) == (1, item["prompt"]["2"]["inputs"]["height"], item["prompt"]["2"]["inputs"]["width"], 3)
    assert float(image.min()) >= 0 and float(image.max()) <= 1
    module, patcher = weakref.ref(first.model), weakref.ref(first)
    weights = [p.detach().clone() for p in first.model.parameters()]
    del first, again
    loaded.clear()
    gc.collect()
    assert patcher() is None and module() is not None                  # the leak ComfyUI warns about
    census = node_pack.MemxReleaseCensus().count(1)["ui"]["memx_release_census"][0]
    assert census["alive"] == [item["key"]] and census["held"][loader] == 1
    assert census["alive_bytes"] == node_pack.model_bytes(32, 2)
    cut_entry(node_pack, loader)
    gc.collect()
    assert module() is None                                             # cutting the entry frees the model
    assert node_pack.MemxReleaseCensus().count(2)["ui"]["memx_release_census"][0]["alive"] == []
    recomputed = load(node_pack, loader, item)                          # the next call recomputes it
    assert all((a == b).all() for a, b in zip(weights, recomputed.model.parameters()))
    assert (render(node_pack, recomputed, item) == image).all()
    census = node_pack.MemxReleaseCensus().count(3)["ui"]["memx_release_census"][0]
    assert census["alive"] == [item["key"]] and census["held"][loader] == 1


def test_with_the_cache_off_the_pack_keeps_nothing(stub_comfy, monkeypatch):
    node_pack, loaded = stub_comfy
    monkeypatch.setenv("MEMX_RELEASE_NODES_CACHE", "off")
    for item in build_release_workload(4):
        patcher = load(node_pack, item["loader"], item)
        render(node_pack, patcher, item)
    del patcher
    loaded.clear()
    gc.collect()
    census = node_pack.MemxReleaseCensus().count(1)["ui"]["memx_release_census"][0]
    assert census["alive"] == [] and not census["caching"]
    assert census["held"] == {"resolution": 0, "named": 0, "bounded": 0, "list": 0}


def test_models_differ_by_key_and_images_by_seed(stub_comfy):
    node_pack, _ = stub_comfy
    items = build_release_workload(8)
    a, b = (load(node_pack, "named", item) for item in items if item["loader"] == "named")
    assert not (a.model.layers[0].weight == b.model.layers[0].weight).all()
    one = node_pack.MemxReleaseRender().render(a, 1, 64, 64)[0]
    two = node_pack.MemxReleaseRender().render(a, 2, 64, 64)[0]
    assert not (one == two).all() and (one == node_pack.MemxReleaseRender().render(a, 1, 64, 64)[0]).all()


def test_pack_imports_without_torch_or_comfy():
    assert "torch" not in pack.__dict__ and "comfy" not in pack.__dict__
    assert set(pack.NODE_CLASS_MAPPINGS) == set(pack.NODE_DISPLAY_NAME_MAPPINGS)
    assert pack.NET_CLASS_NAME == soak.config.RELEASE_NET_CLASS_NAME
    assert pack.CACHE_SWITCH == soak.config.RELEASE_CACHE_SWITCH
    assert pack.BOUNDED_MAXSIZE > 2000        # the bounded lru_cache never evicts on its own during a soak
