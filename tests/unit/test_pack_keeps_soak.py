"""Offline checks of ``bench.soak --workload pack-keeps`` (no ComfyUI server): its options, the workload against the
keeps pack's declared inputs and the free schedule, what the packs hold at each point, the verdict's rules
(survivors by census and by ``/memx/models``, RSS growth at the troughs, images, receipts, run health), the summary,
and the keeps pack against stubbed ComfyUI modules: each loader keeps ComfyUI's tuple, ``MEMX_KEEPS_NODES_CACHE=off``
keeps nothing, the witness and the census keep nothing alive."""

import gc
import sys
import types
from pathlib import Path

import pytest

from bench import harness, soak
from bench.soak import keeps, keeps_verdict as verdict
from bench.soak.config import (INSPIRE_CKPT_SLOTS, KEEPS_CHECKPOINT_NAME, KEEPS_LOADER_ID, KEEPS_LOADERS,
                               KEEPS_SAMPLER_ID, KEEPS_SERVERS, KEEPS_TEXT_CHECKPOINT_NAME, KEEPS_TEXT_LOADER_ID,
                               KEEPS_WITNESS_ID)
from bench.soak.keeps_workload import (build_keeps_workload, entries_to_release, held_keys, keep_key,
                                       keeps_census_prompt)
from memx_helpers import load_module, stub_comfy_modules

PACK = Path(harness.pack_source("memx_keeps_nodes")) / "__init__.py"
MIB = 1024 ** 2
MODEL = 62 * MIB

pack = load_module("memx_keeps_nodes_offline", PACK)


@pytest.fixture
def tree(tmp_path):
    folder = tmp_path / "ComfyUI"
    folder.mkdir()
    (folder / "main.py").write_text("")
    return str(folder)


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

def test_pack_keeps_defaults(tree):
    options = soak.parse_args(["--comfyui", tree, "--workload", "pack-keeps"])
    assert (options.prompts, options.free_every, options.inspire, options.sequential) == (100, 10, None, False)
    assert keeps.keeps_loaders(options) == ("dict", "lru")


def test_inspire_adds_its_loader_and_package(tree, tmp_path):
    archive = tmp_path / "inspire.tar.xz"
    archive.write_bytes(b"")
    options = soak.parse_args(["--comfyui", tree, "--workload", "pack-keeps", "--inspire", str(archive)])
    assert keeps.keeps_loaders(options) == ("dict", "lru", "inspire")
    assert keeps.keeps_packages(True) == "memx_keeps_nodes,ComfyUI-Inspire-Pack"
    assert keeps.keeps_packages(False) == "memx_keeps_nodes"


@pytest.mark.parametrize("args", [["--workload", "pack-keeps", "--no-plain"], ["--sequential"],
                                  ["--memx-env", "COMFY_MEMX_TRIM=0"],
                                  ["--workload", "pack-keeps", "--memx-env", "SEARCH_CPU=30"],
                                  ["--workload", "pack-keeps", "--memx-env", "COMFY_MEMX_RELEASE=ask"],
                                  ["--workload", "pack-keeps", "--memx-env", "COMFY_MEMX_TRIM"],
                                  ["--inspire", "/nonexistent.tar.xz"],
                                  ["--workload", "pack-keeps", "--inspire", "/nonexistent.tar.xz"],
                                  ["--workload", "pack-keeps", "--free-every", "0"]])
def test_pack_keeps_bad_arguments_exit_with_status_2(tree, args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        soak.parse_args(["--comfyui", tree] + args)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_server_environments():
    assert keeps.keeps_server_env("plain", "strict", None, True) == {"MEMX_KEEPS_NODES_CACHE": "off"}
    off = keeps.keeps_server_env("off", "strict", "/e.jsonl", True)
    assert off == {"COMFY_MEMX_LEAK_MODE": "strict", "COMFY_MEMX_EVENTS": "/e.jsonl", "COMFY_MEMX_RELEASE": "off"}
    auto = keeps.keeps_server_env("auto", "report", "/e.jsonl", True)
    assert auto["COMFY_MEMX_RELEASE"] == "auto"
    assert auto["COMFY_MEMX_RELEASE_PACKAGES"] == "memx_keeps_nodes,ComfyUI-Inspire-Pack"
    tuned = keeps.keeps_server_env("off", "strict", "/e.jsonl", False, [("COMFY_MEMX_SEARCH_CPU", "30")])
    assert tuned == {**off, "COMFY_MEMX_SEARCH_CPU": "30"}
    assert keeps.keeps_server_env("plain", "strict", None, False, [("COMFY_MEMX_SEARCH_CPU", "30")]) == {
        "MEMX_KEEPS_NODES_CACHE": "off"}


def test_memx_env_takes_comfy_memx_settings_only(tree):
    options = soak.parse_args(["--comfyui", tree, "--workload", "pack-keeps", "--memx-env", "COMFY_MEMX_SEARCH_CPU=30",
                               "--memx-env", "COMFY_MEMX_TRIM=0"])
    assert options.memx_env == [("COMFY_MEMX_SEARCH_CPU", "30"), ("COMFY_MEMX_TRIM", "0")]


# ---------------------------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------------------------

def declared_inputs(node_class):
    types_ = node_class.INPUT_TYPES()
    return {**types_.get("required", {}), **types_.get("optional", {})}


@pytest.fixture
def offline_folder_paths(monkeypatch):
    folder_paths = types.ModuleType("folder_paths")
    folder_paths.get_filename_list = lambda kind: [KEEPS_CHECKPOINT_NAME, KEEPS_TEXT_CHECKPOINT_NAME]
    monkeypatch.setitem(sys.modules, "folder_paths", folder_paths)


def test_every_prompt_keeps_a_new_key_through_the_pack_and_samples_it(offline_folder_paths):
    workload = build_keeps_workload(30, ("dict", "lru", "inspire"), 10)
    assert [item["index"] for item in workload] == list(range(30))
    assert len({item["key"] for item in workload}) == 30
    assert [item["loader"] for item in workload[:4]] == ["dict", "lru", "inspire", "dict"]
    for item in workload:
        for variant in ("prompt", "plain_prompt"):
            prompt = item[variant]
            loader = prompt[KEEPS_LOADER_ID]
            assert loader["inputs"]["ckpt_name"] == KEEPS_CHECKPOINT_NAME
            assert item["key"] in loader["inputs"].values()
            assert prompt[KEEPS_TEXT_LOADER_ID]["inputs"]["ckpt_name"] == KEEPS_TEXT_CHECKPOINT_NAME
            assert prompt[KEEPS_SAMPLER_ID]["inputs"]["model"] == [KEEPS_WITNESS_ID, 0]
            assert prompt[KEEPS_SAMPLER_ID]["inputs"]["seed"] == item["index"]
            for node in prompt.values():
                if node["class_type"] not in pack.NODE_CLASS_MAPPINGS:
                    continue
                declared = declared_inputs(pack.NODE_CLASS_MAPPINGS[node["class_type"]])
                assert set(node["inputs"]) <= set(declared)
                assert set(declared_inputs(pack.NODE_CLASS_MAPPINGS[node["class_type"]]).keys()) - set(
                    node["inputs"]) <= {"clip"}
                for value in node["inputs"].values():
                    if isinstance(value, list):
                        assert value[0] in prompt
        assert item["prompt"][KEEPS_LOADER_ID]["class_type"] == KEEPS_LOADERS[item["loader"]][0]
        plain_class = item["plain_prompt"][KEEPS_LOADER_ID]["class_type"]
        assert plain_class == (KEEPS_LOADERS["dict"][0] if item["loader"] == "inspire" else
                               item["prompt"][KEEPS_LOADER_ID]["class_type"])
    inspire = workload[2]["prompt"][KEEPS_LOADER_ID]
    assert inspire == {"class_type": "CheckpointLoaderSimpleShared //Inspire",
                       "inputs": {"ckpt_name": KEEPS_CHECKPOINT_NAME, "key_opt": keep_key(2), "mode": "Auto"}}


def test_a_free_follows_every_kth_prompt_and_the_last():
    workload = build_keeps_workload(23, free_every=10)
    assert [item["index"] for item in workload if item["free_after"]] == [9, 19, 22]
    assert [i["index"] for i in build_keeps_workload(20, free_every=5) if i["free_after"]] == [4, 9, 14, 19]


@pytest.mark.parametrize("kwargs", [{"free_every": 0}, {"loaders": ("dict", "nope")}, {"loaders": ()}])
def test_workload_rejects_bad_shapes(kwargs):
    with pytest.raises(ValueError):
        build_keeps_workload(10, **kwargs)


def test_held_keys_bound_inspire_to_its_lru_and_release_empties_at_frees():
    workload = build_keeps_workload(30, ("dict", "lru", "inspire"), 10)
    inspire = [item["key"] for item in workload if item["loader"] == "inspire"]
    others = [item["key"] for item in workload if item["loader"] != "inspire"]
    assert held_keys(workload) == sorted(others + inspire[-INSPIRE_CKPT_SLOTS:])
    assert held_keys(workload, upto=4) == sorted(keep_key(i) for i in range(5))
    assert held_keys(workload, release_at_frees=True) == []
    assert held_keys(workload, upto=12, release_at_frees=True) == [keep_key(10), keep_key(11), keep_key(12)]
    # every free cuts what the ten prompts before it kept (Inspire's four never overflow its five slots)
    assert entries_to_release(workload) == 30
    assert entries_to_release(build_keeps_workload(30, ("inspire",), 10)) == 3 * INSPIRE_CKPT_SLOTS


def test_census_prompt_uses_the_census_node():
    (node,) = keeps_census_prompt(7).values()
    assert node == {"class_type": "MemxKeepsCensus", "inputs": {"nonce": 7}}
    assert set(declared_inputs(pack.NODE_CLASS_MAPPINGS["MemxKeepsCensus"])) == {"nonce"}


# ---------------------------------------------------------------------------------------------------------------
# Verdict
# ---------------------------------------------------------------------------------------------------------------

PROMPTS, FREE_EVERY = 40, 10


def server_summary(label, items, troughs_mib, alive=(), rows=None, images=None, releases=None):
    """A server's report entry as :func:`bench.soak.keeps.summarize_keeps_server` writes it: ``troughs_mib`` the
    settled RSS after each free."""
    frees = [item["index"] for item in items if item["free_after"]]
    summary = {"prompts_run": len(items), "failed": 0, "images": images or [f"h{i}" for i in range(len(items))],
               "e2e_s": [0.5] * len(items), "rss_after": [[item["index"], 1500 * MIB, 0] for item in items],
               "rss_after_free": [[index, mib * MIB, 0] for index, mib in zip(frees, troughs_mib)],
               "census_rss": [1400 * MIB, 0],
               "frees": [{"index": index, "status": 200, "receipt_status": "done"} for index in frees],
               "log": {"tracebacks": 0, "comfy_memx_tracebacks": 0, "internal_errors": []},
               "census": {"alive": sorted(alive), "witnessed_bytes": {item["key"]: MODEL for item in items},
                          "alive_bytes": MODEL * len(alive)}}
    if label != "plain":
        summary["events"] = {"lines": 10, "valid": 10, "invalid": 0}
        summary["releases"] = releases or {"count": 0, "by_outcome": {}, "died": 0}
        summary["models_after"] = {"from_workload": len(alive) if rows is None else rows, "by_model": {},
                                   "by_state": {}, "prompt_indices": []}
    return summary


def good_report(**changes):
    """A report of a run that met every target: auto keeps nothing and released every entry, off keeps every key
    and grew by the models it kept, plain stayed flat."""
    items = build_keeps_workload(PROMPTS, ("dict", "lru"), FREE_EVERY)
    held = held_keys(items)
    needed = entries_to_release(items)
    kept_growth = [1000 + 62 * n for n in (10, 20, 30, 40)]   # off: RSS follows what the packs hold
    servers = {
        "plain": server_summary("plain", items, [1000, 1001, 1000, 1002]),
        "off": server_summary("off", items, kept_growth, alive=held),
        "auto": server_summary("auto", items, [1030, 1031, 1030, 1032],
                               releases={"count": needed, "by_outcome": {"released": needed}, "died": needed}),
    }
    report = {"prompts": PROMPTS, "error": None, "servers": servers,
              "workload": {"frees": sum(1 for i in items if i["free_after"]), "entries_to_release": needed,
                           "free_every": FREE_EVERY, "loaders": ["dict", "lru"]},
              "workload_items": [{k: item[k] for k in ("index", "loader", "key", "free_after")} for item in items]}
    for path, value in changes.items():
        target = report
        *parents, last = path.split("/")
        for part in parents:
            target = target[part]
        target[last] = value
    return report


def targets_of(report):
    verdict.analyse(report)
    return {target["name"]: target for target in verdict.evaluate_keeps(report, check=True)}


def missed(report):
    return sorted(name for name, target in targets_of(report).items() if target["met"] is not True)


def test_a_good_run_meets_every_target():
    report = good_report()
    assert missed(report) == []
    assert soak.exit_status(list(targets_of(report).values())) == 0
    figures = report["figures"]
    assert figures["model_bytes"] == MODEL
    assert figures["servers"]["off"]["window"] == [9, 29]        # the first free of each window of two
    assert figures["kept_bytes"] == 20 * MODEL                     # prompts 10..29 kept one model each


def test_a_survivor_on_auto_misses_by_census_and_by_rows():
    report = good_report()
    report["servers"]["auto"]["census"]["alive"] = [keep_key(3)]
    report["servers"]["auto"]["models_after"]["from_workload"] = 2
    assert missed(report) == ["survivors older than the last free on auto, by /memx/models",
                              "survivors older than the last free on auto, by the pack's census"]


def test_off_must_hold_exactly_what_the_packs_keep():
    report = good_report()
    report["servers"]["off"]["census"]["alive"] = report["servers"]["off"]["census"]["alive"][1:]
    assert missed(report) == ["without release (off) the packs hold every key they kept (census; /memx/models rows)"]
    report = good_report()
    report["servers"]["off"]["models_after"]["from_workload"] = 3
    assert missed(report) == ["without release (off) the packs hold every key they kept (census; /memx/models rows)"]


def test_plain_must_hold_nothing():
    report = good_report()
    report["servers"]["plain"]["census"]["alive"] = [keep_key(0)]
    assert missed(report) == ["plain ComfyUI (caches off) holds no workload model"]


def test_rss_growth_of_auto_beyond_plain_and_two_models_misses():
    report = good_report()
    troughs = report["servers"]["auto"]["rss_after_free"]
    for sample, mib in zip(troughs, (1030, 1060, 1250, 1330)):
        sample[1] = mib * MIB
    assert missed(report) == ["RSS growth with release (auto) <= plain's + 2 models, MiB"]
    for sample, value in zip(troughs, (1030 * MIB, 1030 * MIB, 1030 * MIB + 2 * MODEL, 1030 * MIB + 2 * MODEL)):
        sample[1] = value                                   # two models more than at the start, plain 0.5 MiB: met
    assert missed(report) == []


def test_rss_growth_of_off_below_half_of_what_was_kept_misses():
    report = good_report()
    for sample in report["servers"]["off"]["rss_after_free"]:
        sample[1] = 1000 * MIB
    assert missed(report) == ["RSS growth without release (off) >= half of what the packs kept, MiB"]


def test_rss_growth_uses_the_troughs_and_adapts_its_window():
    points = [(9, 100), (19, 101), (29, 300), (39, 102), (49, 110), (59, 111)]
    assert verdict.rss_growth(points, window=3) == (110 - 101, 19, 49)
    assert verdict.rss_growth(points[:2], window=3) == (1, 9, 19)
    assert verdict.rss_growth(points[:1]) == (None, None, None)
    report = good_report()
    assert [p[0] for p in verdict.troughs(report["servers"]["plain"])] == [9, 19, 29, 39]


def test_too_few_releases_or_a_release_on_off_misses():
    report = good_report()
    needed = report["workload"]["entries_to_release"]
    report["servers"]["auto"]["releases"] = {"count": needed - 1, "by_outcome": {"released": needed - 1},
                                             "died": needed - 1}
    assert missed(report) == ["entries released on auto (every entry the packs held at a free; models died)"]
    report = good_report()
    report["servers"]["off"]["releases"] = {"count": 1, "by_outcome": {"released": 1}, "died": 1}
    assert missed(report) == ["release receipts on off"]


def test_a_differing_or_missing_image_misses():
    report = good_report()
    report["servers"]["auto"]["images"][5] = "other"
    assert missed(report) == ["images identical (every prompt on the three servers)"]
    report = good_report()
    report["servers"]["plain"]["images"][0] = None
    assert missed(report) == ["images identical (every prompt on the three servers)"]


def test_run_health_targets():
    report = good_report()
    report["servers"]["auto"]["log"]["comfy_memx_tracebacks"] = 1
    assert missed(report) == ["comfy_memx tracebacks + internal errors"]
    report = good_report()
    report["servers"]["off"]["frees"][1]["receipt_status"] = "pending"
    assert missed(report) == ["/memx/free receipts finished (off, auto)"]
    report = good_report()
    report["servers"]["plain"]["failed"] = 1
    assert missed(report) == ["failed prompts"]
    report = good_report(error="RuntimeError: boom")
    assert "all prompts ran on every server" in missed(report)


def test_summary_names_every_server_and_target():
    report = good_report()
    report["targets"] = verdict.evaluate_keeps(report, check=True)
    text = verdict.format_keeps_summary(report)
    for label in KEEPS_SERVERS:
        assert label in text.splitlines()[1]
    assert text.count("[met   ]") == len(report["targets"])


def test_models_after_keeps_the_workloads_rows_only():
    rows = [{"model_id": "BaseModel#1", "model": "BaseModel", "state": "leaked", "owner": {"prompt_id": "p1"},
             "created_by": {"prompt_id": "p1", "package": "memx_keeps_nodes"},
             "leak": {"found_by": "after_free", "holder": {"package": "memx_keeps_nodes"}}},
            {"model_id": "SD1ClipModel#1", "model": "SD1ClipModel", "state": "offloaded", "owner": {"prompt_id": "x"}},
            {"model_id": "TAESD#1", "model": "TAESD", "state": "offloaded", "owner": {"prompt_id": "p2"},
             "created_by": None},
            {"model_id": "BaseModel#2", "model": "BaseModel", "state": "built", "owner": {"prompt_id": "x"},
             "created_by": {"prompt_id": "p2", "package": "ComfyUI-Inspire-Pack"}}]
    summary = keeps.models_after(rows, {"p1": 0, "p2": 1})
    assert (summary["rows"], summary["from_workload"]) == (4, 3)
    assert summary["by_model"] == {"BaseModel": 2, "TAESD": 1}
    assert summary["by_creator"] == {"memx_keeps_nodes": 1, "None": 1, "ComfyUI-Inspire-Pack": 1}
    assert summary["examples"][0]["holder_package"] == "memx_keeps_nodes"


# ---------------------------------------------------------------------------------------------------------------
# The keeps pack against stubbed ComfyUI modules
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def stub_comfy(monkeypatch, offline_folder_paths):
    torch = pytest.importorskip("torch")
    stub_comfy_modules(monkeypatch)
    loads = []

    def load_checkpoint(name):
        loads.append(name)
        model = types.SimpleNamespace(model=torch.nn.Linear(8, 8))
        vae = types.SimpleNamespace(first_stage_model=torch.nn.Linear(4, 4))
        return (model, None, vae)

    nodes = types.ModuleType("nodes")
    nodes.CheckpointLoaderSimple = lambda: types.SimpleNamespace(load_checkpoint=load_checkpoint)
    sd = types.ModuleType("comfy.sd")
    sd.load_checkpoint_guess_config = lambda path, **kwargs: load_checkpoint(path) + (None,)
    sys.modules["comfy"].sd = sd
    sys.modules["folder_paths"].get_full_path = lambda kind, name: f"/{kind}/{name}"
    sys.modules["folder_paths"].get_folder_paths = lambda kind: []
    monkeypatch.setitem(sys.modules, "nodes", nodes)
    monkeypatch.setitem(sys.modules, "comfy.sd", sd)
    monkeypatch.delenv("MEMX_KEEPS_NODES_CACHE", raising=False)
    yield load_module("memx_keeps_nodes_stubbed", PACK), loads


def census(node_pack):
    return node_pack.MemxKeepsCensus().count(0)["ui"]["memx_keeps_census"][0]


@pytest.mark.parametrize("loader", ["MemxKeepsCheckpointLoader", "MemxKeepsLruCheckpointLoader"])
def test_each_loader_keeps_comfyuis_tuple_per_key(stub_comfy, loader):
    node_pack, loads = stub_comfy
    node = node_pack.NODE_CLASS_MAPPINGS[loader]()
    first = node.load(KEEPS_CHECKPOINT_NAME, "a")
    assert node.load(KEEPS_CHECKPOINT_NAME, "a") is first
    node.load(KEEPS_CHECKPOINT_NAME, "b")
    assert len(loads) == 2
    node_pack.MemxKeepsWitness().witness(first[0], first[2], "a", clip=first[1])
    del first
    gc.collect()
    record = census(node_pack)
    assert record["alive"] == ["a"]
    assert sum(record["held"].values()) == 2
    assert record["witnessed_bytes"]["a"] == 4 * (8 * 8 + 8 + 4 * 4 + 4)


def test_cache_off_keeps_nothing_and_the_witness_keeps_nothing_alive(stub_comfy, monkeypatch):
    node_pack, loads = stub_comfy
    monkeypatch.setenv("MEMX_KEEPS_NODES_CACHE", "off")
    for loader in ("MemxKeepsCheckpointLoader", "MemxKeepsLruCheckpointLoader"):
        node = node_pack.NODE_CLASS_MAPPINGS[loader]()
        model, clip, vae = node.load(KEEPS_CHECKPOINT_NAME, "k")
        assert node_pack.MemxKeepsWitness().witness(model, vae, f"k-{loader}") == (model, vae)
        assert census(node_pack)["alive"] == [f"k-{loader}"]
        del model, clip, vae
        gc.collect()
        assert census(node_pack)["alive"] == []
    assert len(loads) == 2
    assert census(node_pack)["held"] == {"dict": 0, "lru": 0}
    assert census(node_pack)["caching"] is False


def test_a_cut_entry_is_loaded_again(stub_comfy):
    node_pack, loads = stub_comfy
    node = node_pack.MemxKeepsCheckpointLoader()
    node.load(KEEPS_CHECKPOINT_NAME, "a")
    node_pack.CHECKPOINTS.clear()        # what a release of the dict entry does
    node.load(KEEPS_CHECKPOINT_NAME, "a")
    assert loads == [KEEPS_CHECKPOINT_NAME, KEEPS_CHECKPOINT_NAME]
    assert list(node_pack.CHECKPOINTS) == ["a"]


def test_pending_releases_are_the_workloads_releasable_leaks_never_tried():
    def row(prompt, state="leaked", possible=True, last=None, by_creator=True):
        return {"state": state, "owner": {"prompt_id": "x" if by_creator else prompt},
                "created_by": {"prompt_id": prompt} if by_creator else None,
                "release": {"possible": possible, "last": last}}

    rows = [row("p1"), row("p2", by_creator=False), row("p1", last={"outcome": "refused"}), row("p1", possible=False),
            row("p1", state="offloaded"), row("other"), {"state": "leaked", "release": None}]
    assert keeps.pending_releases(rows, {"p1": 0, "p2": 1}) == rows[:2]
