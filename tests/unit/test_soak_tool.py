"""Offline checks of bench.soak (no ComfyUI server): argument errors, statistics, log and event-log scanning,
the workload against the node pack and the default workflow, survivor and census verdicts, targets, and the
leaking pack's two leak patterns against a stubbed ``comfy``."""

import gc
import json
import os
import weakref
from pathlib import Path

import pytest

from bench import harness, soak
from memx_helpers import load_module, stub_comfy_modules

SOAK_PACK = Path(harness.pack_source("memx_soak_nodes")) / "__init__.py"
MIB = 1024 ** 2


pack = load_module("memx_soak_nodes_offline", SOAK_PACK)
WORKFLOW = json.loads(Path(harness.workflow_path("default_t2i")).read_text())


@pytest.fixture
def tree(tmp_path):
    folder = tmp_path / "ComfyUI"
    folder.mkdir()
    (folder / "main.py").write_text("")
    return str(folder)


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------

def test_defaults(tree):
    options = soak.parse_args(["--comfyui", tree])
    assert (options.prompts, options.leak_mode, options.check, options.free_every) == (500, "strict", False, 10)
    assert options.no_plain is False and soak.parse_args(["--comfyui", tree, "--no-plain"]).no_plain
    assert options.timeout == 900 + 30 * 500
    assert soak.parse_args(["--comfyui", tree, "--prompts", "50", "--timeout", "60"]).timeout == 60


@pytest.mark.parametrize("args", [
    [],                                              # --comfyui is required
    ["--prompts", "0"],
    ["--prompts", "ten"],
    ["--leak-mode", "paranoid"],
    ["--port-base", "80"],
    ["--port-base", "65535"],                        # plain would need 65536
    ["--timeout", "0"],
    ["--timeout", "nan"],
    ["--warmup", "1"],
    ["--free-every", "-3"],
    ["--checkpoint", "/nonexistent/ckpt.safetensors"],
])
def test_bad_arguments_exit_with_status_2(tree, args, capsys):
    argv = args if args == [] else ["--comfyui", tree] + args
    with pytest.raises(SystemExit) as exit_info:
        soak.parse_args(argv)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_a_folder_without_main_py_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        soak.parse_args(["--comfyui", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "main.py" in capsys.readouterr().err


def test_an_interpreter_without_comfy_memx_exits_2_before_starting_anything(tree, tmp_path, capsys):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named comfy_memx' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert soak.main(["--comfyui", tree, "--python", str(fake), "--json", str(tmp_path / "r.json")]) == 2
    assert "cannot import comfy_memx" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()
    silent = tmp_path / "silent"
    silent.write_text("#!/bin/sh\nexit 3\n")
    silent.chmod(0o755)
    assert soak.check_importable(str(silent)) == "exit status 3"


# ---------------------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------------------

def test_median_ratio_and_paired_ratio():
    assert soak.median_ratio([1.1, 2.2, 3.3], [1, 2, 3]) == pytest.approx(1.1)
    assert soak.median_ratio([], [1]) is None
    assert soak.median_ratio([1], [0]) is None
    assert soak.median_ratio([2, None, 4], [1, 2, 3]) == pytest.approx(3 / 2)
    assert soak.paired_median_ratio([2, 3, 100], [1, 3, 1]) == pytest.approx(2)
    assert soak.paired_median_ratio([1, None], [0, 2]) is None


def test_theil_sen_ignores_outliers():
    points = [(x, 5 + 2 * x) for x in range(20)]
    points[3] = (3, 10_000)
    points[15] = (15, -10_000)
    assert soak.theil_sen_slope(points) == pytest.approx(2)
    assert soak.theil_sen_slope([(1, 1), (1, 5)]) is None


def test_rss_growth_per_100_prompts_leaves_out_the_warmup():
    base = 4 * 1024 * MIB
    # 1 GiB jump during the first prompts (first loads), then 10 KiB per prompt, plus one allocator spike
    samples = [(i, base + (0 if i < 5 else 1024 * MIB) + i * 10 * 1024) for i in range(100)]
    samples[60] = (60, samples[60][1] + 300 * MIB)
    growth = soak.rss_growth_per_100(samples, prompts=100, warmup=0.2)
    assert growth == pytest.approx(100 * 10 * 1024 / MIB, rel=1e-6)
    flat = [(i, base) for i in range(50)]
    assert soak.rss_growth_per_100(flat, prompts=50) == 0
    assert soak.rss_growth_per_100([(0, base), (1, base)], prompts=2) is None
    assert soak.rss_growth_per_100([(i, None) for i in range(10)], prompts=10) is None


def test_growth_caused_is_memx_minus_plain():
    report = {"servers": {"memx": {"rss": {"growth_mib_per_100": 3.5, "anon_growth_mib_per_100": 1.0}},
                          "plain": {"rss": {"growth_mib_per_100": 3.0, "anon_growth_mib_per_100": None}}},
              "comparison": {}}
    soak.compare_rss(report)
    assert report["comparison"]["rss_growth_caused_mib_per_100"] == pytest.approx(0.5)
    assert report["comparison"]["anon_growth_caused_mib_per_100"] is None


def test_thin_keeps_the_last_point():
    points = list(range(1001))
    kept = soak.thin(points, 100)
    assert len(kept) <= 101 and kept[0] == 0 and kept[-1] == 1000


def test_describe():
    figures = soak.describe([3, 1, 2, None, 10])
    assert figures["n"] == 4 and figures["median"] == 2.5 and figures["max"] == 10 and figures["p90"] == 10
    assert soak.describe([]) == {"n": 0}


def test_read_proc_memory_of_this_process():
    vmrss, anon = soak.read_proc_memory(os.getpid())
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc")
    assert vmrss > 0 and 0 < anon <= vmrss
    assert soak.read_proc_memory(2 ** 22 + 12345) == (None, None)


# ---------------------------------------------------------------------------------------------------------------
# Server log
# ---------------------------------------------------------------------------------------------------------------

LOG = """\
\x1b[32m[INFO]\x1b[0m comfy_memx 0.2.0 active (launcher, leak mode strict): patched load_models_gpu
\x1b[32m[INFO]\x1b[0m got prompt
\x1b[31m[ERROR]\x1b[0m !!! Exception during processing !!! boom
\x1b[31m[ERROR]\x1b[0m Traceback (most recent call last):
  File "/opt/ComfyUI/execution.py", line 496, in execute
    output_data = get_output_data(obj, input_data_all)
  File "/opt/ComfyUI/nodes.py", line 1500, in sample
    raise RuntimeError("boom")
RuntimeError: boom

Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/comfy_memx/patches/model_management.py", line 80, in load_models_gpu
    record = ledger.record_for(model)
  File "/venv/lib/python3.11/site-packages/comfy_memx/ledger/records.py", line 12, in record_for
    raise KeyError(key)
KeyError: 'x'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/opt/ComfyUI/main.py", line 10, in <module>
    run()
ValueError: raised while handling comfy_memx state
\x1b[1m\x1b[33m[WARNING]\x1b[0m comfy_memx: internal error in leakwatch.before_collect (ComfyUI continues)
[WARNING] WARNING, memory leak with model MemxSoakNet. Please make sure it is not being referenced from somewhere.
[WARNING] comfy_memx: leaked model MemxSoakNet (MemxSoakNet#1), loaded by node 102 (MemxSoakSampler)
"""


def test_tracebacks_are_found_and_attributed():
    blocks = soak.find_tracebacks(LOG)
    assert len(blocks) == 3
    assert blocks[0][-1] == "RuntimeError: boom"
    assert blocks[1][-1] == "KeyError: 'x'"
    assert [soak.mentions_comfy_memx(block) for block in blocks] == [False, True, True]


def test_a_traceback_at_the_end_of_the_log_is_kept():
    blocks = soak.find_tracebacks("Traceback (most recent call last):\n  File \"/x/comfy_memx/a.py\", line 1, in f\n")
    assert len(blocks) == 1 and soak.mentions_comfy_memx(blocks[0])
    assert not soak.mentions_comfy_memx(['  File "/x/not_comfy_memx_really/a.py", line 1, in f', "E: e"])


def test_scan_log_counts():
    scanned = soak.scan_log(LOG)
    assert scanned["tracebacks"] == 3 and scanned["comfy_memx_tracebacks"] == 2
    assert scanned["internal_errors"] == ["comfy_memx: internal error in leakwatch.before_collect (ComfyUI continues)"]
    assert scanned["comfyui_leak_warnings"] == 1 and scanned["comfy_memx_leak_lines"] == 1
    assert scanned["comfy_memx_version"] == "0.2.0"
    assert "KeyError" in scanned["comfy_memx_traceback_texts"][0]
    clean = soak.scan_log("[INFO] got prompt\nPrompt executed in 1.00 seconds\n")
    assert clean["tracebacks"] == 0 and clean["internal_errors"] == [] and clean["comfy_memx_version"] is None


# ---------------------------------------------------------------------------------------------------------------
# Event log
# ---------------------------------------------------------------------------------------------------------------

def test_event_log_validation():
    lines = [
        json.dumps({"event": "load", "time": 1.5, "pid": 7, "model": "X"}) + "\n",
        json.dumps({"event": "leak", "time": 2, "pid": 7}) + "\n",
        json.dumps({"event": "leak_seen", "time": 3.0, "pid": 7}) + "\n",
        "\n",
        '{"event": "load", "time": 1.0\n',                          # cut short
        json.dumps(["event", "load"]) + "\n",                       # not an object
        json.dumps({"event": "load", "time": 1.0}) + "\n",          # no pid
        json.dumps({"event": "", "time": 1.0, "pid": 7}) + "\n",    # empty name
        json.dumps({"event": "load", "time": True, "pid": 7}) + "\n",
        json.dumps({"event": "load", "time": 1.0, "pid": "7"}) + "\n",
    ]
    report = soak.validate_events(lines)
    assert (report["lines"], report["valid"], report["invalid"]) == (9, 3, 6)
    assert report["by_event"] == {"load": 1, "leak": 1, "leak_seen": 1}
    assert report["pids"] == [7]
    assert [example["line"] for example in report["invalid_examples"]] == [5, 6, 7, 8, 9]
    assert report["bytes"] == sum(len(line) for line in lines)


def test_event_file_missing_and_bytes(tmp_path):
    assert soak.validate_event_file(str(tmp_path / "none.jsonl"))["exists"] is False
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"event": "load", "time": 1, "pid": 1}\n\xff\xfe\n')
    report = soak.validate_event_file(str(path))
    assert report["exists"] and report["valid"] == 1 and report["invalid"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------------------------

def declared_inputs(node_class):
    types_ = node_class.INPUT_TYPES()
    return {**types_.get("required", {}), **types_.get("optional", {})}


def test_every_prompt_uses_the_default_workflow_or_pack_nodes_with_their_declared_inputs():
    workload = soak.build_workload(500, WORKFLOW)
    assert [item["index"] for item in workload] == list(range(500))
    for item in workload:
        prompt = item["prompt"]
        for node_id, node in prompt.items():
            if node_id in WORKFLOW:
                original = WORKFLOW[node_id]
                assert node["class_type"] == original["class_type"]
                assert set(node["inputs"]) == set(original["inputs"])
                changed = {k for k in node["inputs"] if node["inputs"][k] != original["inputs"][k]}
                assert changed <= {"seed"}
                continue
            node_class = pack.NODE_CLASS_MAPPINGS[node["class_type"]]
            declared = declared_inputs(node_class)
            assert set(node["inputs"]) == set(declared)
            for name, value in node["inputs"].items():
                if isinstance(value, list):
                    source_id, output = value
                    source = pack.NODE_CLASS_MAPPINGS[prompt[source_id]["class_type"]]
                    assert source.RETURN_TYPES[output] == declared[name][0]
                elif declared[name][0] == "INT":
                    assert declared[name][1]["min"] <= value <= declared[name][1]["max"]
                else:
                    assert isinstance(value, str) and declared[name][0] == "STRING"
        pack_nodes = [n for i, n in prompt.items() if i not in WORKFLOW]
        assert bool(pack_nodes) == (item["kind"] == "t2i+pack") == (item["index"] % 2 == 1)
        assert any(getattr(pack.NODE_CLASS_MAPPINGS[n["class_type"]], "OUTPUT_NODE", False) for n in pack_nodes) \
            or not pack_nodes


def test_seeds_vary_and_the_workflow_template_is_not_modified():
    before = json.dumps(WORKFLOW, sort_keys=True)
    workload = soak.build_workload(20, WORKFLOW)
    seeds = [item["prompt"][soak.SAMPLER_NODE_ID]["inputs"]["seed"] for item in workload]
    assert len(set(seeds)) == 20 and seeds == [item["seed"] for item in workload]
    assert json.dumps(WORKFLOW, sort_keys=True) == before


def test_six_slots_two_leak_patterns_and_generations():
    workload = soak.build_workload(500, WORKFLOW, generations=3)
    packed = [item for item in workload if "slot" in item]
    assert len(packed) == 250
    assert {item["loader"] for item in packed} == {"MemxSoakCachedLoader", "MemxSoakHookedLoader"}
    assert {item["slot"] for item in packed} == {f"s{i}" for i in range(6)}
    for slot in {item["slot"] for item in packed}:
        names = [item["name"] for item in packed if item["slot"] == slot]
        assert len(set(names)) == 3, slot           # each slot's model is rebuilt twice
        assert names == sorted(names)               # generations only move forward
    held = soak.expected_held(workload)
    assert held == {f"s{i}": f"soak-s{i}-g2" for i in range(6)}
    assert soak.expected_held(soak.build_workload(1, WORKFLOW)) == {}
    assert {item["generation"] for item in soak.build_workload(50, WORKFLOW) if "slot" in item} == {0, 1, 2}


def test_census_prompt_uses_the_census_node():
    prompt = soak.census_prompt(7)
    (node,) = prompt.values()
    assert set(node["inputs"]) == set(declared_inputs(pack.NODE_CLASS_MAPPINGS[node["class_type"]]))
    assert pack.NODE_CLASS_MAPPINGS[node["class_type"]].OUTPUT_NODE


# ---------------------------------------------------------------------------------------------------------------
# Survivors, census, targets, summary
# ---------------------------------------------------------------------------------------------------------------

def survivor(model_id, prompt_id, model="MemxSoakNet", package="memx_soak_nodes"):
    return {"model_id": model_id, "model": model, "reason": "leaked",
            "owner": {"prompt_id": prompt_id, "package": package, "node_id": "102"}}


def test_final_survivors_must_be_exactly_the_held_pack_models():
    workload = soak.build_workload(50, WORKFLOW)
    held = soak.expected_held(workload)
    items = {f"p{item['index']}": item for item in workload}
    last = {}
    for item in workload:
        if "slot" in item:
            last[item["slot"]] = item
    good = [survivor(f"MemxSoakNet#{n}", f"p{item['index']}") for n, item in enumerate(last.values())]
    verdict = soak.check_final_survivors({"survivors": good}, items, held)
    assert verdict["ok"] and verdict["matched"] == sorted(held)

    first_s0 = next(item for item in workload if item.get("slot") == "s0")
    assert first_s0["name"] != held["s0"]
    stale = soak.check_final_survivors({"survivors": good + [survivor("MemxSoakNet#90", f"p{first_s0['index']}")]},
                                       items, held)
    assert not stale["ok"] and stale["unexpected"][0]["name"] == first_s0["name"]
    sd = soak.check_final_survivors({"survivors": good + [survivor("BaseModel#1", "p0", "BaseModel", "core")]},
                                    items, held)
    assert not sd["ok"] and sd["unexpected"][0]["model"] == "BaseModel"
    missing = soak.check_final_survivors({"survivors": good[1:]}, items, held)
    assert not missing["ok"] and len(missing["missing"]) == 1
    assert not soak.check_final_survivors({"error": "x"}, items, held)["ok"]
    assert soak.unexpected_survivors({"survivors": good + [survivor("A#1", "p0", "AutoencoderKL", "core")]}) == [
        survivor("A#1", "p0", "AutoencoderKL", "core")]


def test_census_comparison():
    held = {"s0": "a", "s1": "b"}
    census = {"alive": ["a", "b"], "held": ["a", "b"], "model_patchers": 0, "base_models": 0}
    assert soak.compare_census(dict(census), dict(census), held)["ok"]
    kept = soak.compare_census({**census, "alive": ["a", "b", "old"]}, dict(census), held)
    assert not kept["ok"] and "memx" in kept["problems"][0]
    more = soak.compare_census({**census, "base_models": 1}, dict(census), held)
    assert not more["ok"] and more["problems"] == ["base_models: memx 1 != plain 0"]
    assert not soak.compare_census(None, census, held)["ok"]


def test_census_without_a_plain_server_expects_no_comfyui_models():
    held = {"s0": "a"}
    census = {"alive": ["a"], "held": ["a"], "model_patchers": 0, "base_models": 0}
    assert soak.compare_census(census, None, held, plain_ran=False)["ok"]
    left = soak.compare_census({**census, "model_patchers": 2}, None, held, plain_ran=False)
    assert not left["ok"] and left["problems"] == ["model_patchers: memx 2 != 0 after the final free"]


def test_no_plain_run_has_no_comparison_targets_checked():
    report = good_report(500, ratio=None, growth=None)
    report["no_plain"] = True
    report["servers"]["plain"] = {}
    targets = soak.evaluate(report, check=True)
    assert soak.exit_status(targets) == 0
    assert "failed prompts (plain, workload sanity)" not in {t["name"] for t in targets}
    perf = [t for t in targets if not t["hard"]]
    assert all(not t["checked"] and t["note"] == "not measured (--no-plain)" for t in perf)
    report["no_plain"] = False
    assert soak.exit_status(soak.evaluate(report, check=True)) == 1     # plain was expected and did not run


def test_census_from_history():
    entry = {"outputs": {"901": {"memx_soak_census": [{"alive": ["a"]}]}}}
    assert soak.census_from_history(entry) == {"alive": ["a"]}
    assert soak.census_from_history(None) is None


def test_exec_seconds_from_history_timestamps():
    entry = {"status": {"messages": [["execution_start", {"timestamp": 1000}], ["execution_cached", {}],
                                     ["execution_success", {"timestamp": 3500}]]}}
    assert soak.exec_seconds(entry) == 2.5
    assert soak.exec_seconds({"status": {"messages": []}}) is None


def good_report(prompts, ratio=1.02, growth=0.2):
    memx = {"prompts_run": prompts, "failed": 0, "log": {"comfy_memx_tracebacks": 0, "internal_errors": []},
            "events": {"lines": 10, "valid": 10, "invalid": 0}, "polls": {"server_errors": 0}}
    return {"prompts": prompts, "leak_mode": "strict", "comfyui": "/t", "error": None,
            "servers": {"memx": memx, "plain": {"prompts_run": prompts, "failed": 0}},
            "comparison": {"latency_ratio": ratio, "rss_growth_caused_mib_per_100": growth},
            "kept_alive": {"ok": True, "summary": "fine"}}


def test_targets_and_exit_status():
    assert soak.exit_status(soak.evaluate(good_report(500), check=True)) == 0
    slow = soak.evaluate(good_report(500, ratio=1.3, growth=5), check=True)
    assert soak.exit_status(slow) == 1
    assert {t["name"] for t in slow if t["met"] is False} == {
        "median latency memx / plain", "RSS growth caused by comfy_memx, MiB/100 prompts"}
    # short runs report latency and RSS but do not fail on them
    short = soak.evaluate(good_report(50, ratio=1.3, growth=5), check=True)
    assert soak.exit_status(short) == 0
    assert all(not t["checked"] for t in short if not t["hard"])
    # without --check nothing decides the exit status
    broken = good_report(50)
    broken["servers"]["memx"]["failed"] = 2
    assert soak.exit_status(soak.evaluate(broken, check=False)) == 0
    assert soak.exit_status(soak.evaluate(broken, check=True)) == 1
    for change in (lambda r: r["servers"]["memx"]["log"].update(comfy_memx_tracebacks=1),
                   lambda r: r["servers"]["memx"]["log"].update(internal_errors=["x"]),
                   lambda r: r["servers"]["memx"]["events"].update(invalid=1),
                   lambda r: r["servers"]["memx"]["events"].update(lines=0, valid=0),
                   lambda r: r["servers"]["memx"]["polls"].update(server_errors=1),
                   lambda r: r["kept_alive"].update(ok=False),
                   lambda r: r["servers"]["plain"].update(failed=1),
                   lambda r: r.update(error="timeout"),
                   lambda r: r["servers"]["memx"].update(prompts_run=49)):
        report = good_report(50)
        change(report)
        assert soak.exit_status(soak.evaluate(report, check=True)) == 1


def test_latency_target_is_the_one_the_command_line_names(tmp_path):
    (tmp_path / "main.py").write_text("")
    assert soak.parse_args(["--comfyui", str(tmp_path)]).latency_target == 1.10
    options = soak.parse_args(["--comfyui", str(tmp_path), "--latency-target", "1.05"])
    report = good_report(500, ratio=1.07)
    report["latency_target"] = options.latency_target
    (latency,) = [t for t in soak.evaluate(report, check=True) if t["name"] == "median latency memx / plain"]
    assert (latency["limit"], latency["met"]) == (1.05, False)
    assert soak.exit_status(soak.evaluate(good_report(500, ratio=1.07), check=True)) == 0   # 1.10 by default


def test_summary_renders_a_full_and_an_empty_report():
    report = good_report(500)
    report["targets"] = soak.evaluate(report, check=True)
    text = soak.format_summary(report)
    assert "median latency, end to end" in text and "[met   ] nothing kept alive" in text
    empty = {"prompts": 5, "leak_mode": "strict", "comfyui": "/t", "servers": {"memx": {}, "plain": {}},
             "comparison": {}, "kept_alive": {}}
    empty["targets"] = soak.evaluate(empty, check=True)
    assert "MISSED" in soak.format_summary(empty)


# ---------------------------------------------------------------------------------------------------------------
# The leaking pack against a stubbed comfy
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture
def stub_comfy(monkeypatch):
    pytest.importorskip("torch")
    loaded = stub_comfy_modules(monkeypatch)
    node_pack = load_module("memx_soak_nodes_stubbed", SOAK_PACK)
    yield node_pack, loaded
    node_pack.MemxSoakCachedLoader._cache.clear()
    node_pack.HOOK_REGISTRY.clear()


@pytest.mark.parametrize("loader", ["MemxSoakCachedLoader", "MemxSoakHookedLoader"])
def test_pack_keeps_the_module_not_the_patcher_and_releases_it_on_a_new_name(stub_comfy, loader):
    node_pack, loaded = stub_comfy
    node = node_pack.NODE_CLASS_MAPPINGS[loader]()
    (first,) = node.load("s0", "soak-s0-g0", 32, 2)
    (again,) = node.load("s0", "soak-s0-g0", 32, 2)
    assert again is not first and again.model is first.model        # a fresh patcher around the cached module
    result = node_pack.MemxSoakSampler().sample(again, 3)
    assert loaded == [again] and result["ui"]["memx_soak_sample"][0]["name"] == "soak-s0-g0"
    module = weakref.ref(first.model)
    patcher = weakref.ref(first)
    del first, again, result
    loaded.clear()
    gc.collect()
    assert patcher() is None and module() is not None                # the leak ComfyUI reports
    census = node_pack.MemxSoakCensus().count(1)["ui"]["memx_soak_census"][0]
    assert census["alive"] == census["held"] == ["soak-s0-g0"]
    node.load("s0", "soak-s0-g1", 32, 2)                             # next generation replaces the slot
    gc.collect()
    assert module() is None
    census = node_pack.MemxSoakCensus().count(2)["ui"]["memx_soak_census"][0]
    assert census["alive"] == census["held"] == ["soak-s0-g1"]
    assert census["model_patchers"] == 0 and census["base_models"] == 0


def test_hook_registry_holds_a_bound_method_and_a_closure(stub_comfy):
    node_pack, _ = stub_comfy
    (patcher,) = node_pack.MemxSoakHookedLoader().load("s3", "soak-s3-g0", 16, 1)
    method, closure = node_pack.HOOK_REGISTRY["s3"]["hooks"]
    assert method.__self__.module is patcher.model
    assert closure.__closure__[0].cell_contents is patcher.model


def test_pack_imports_without_torch_or_comfy():
    assert "torch" not in pack.__dict__ and "comfy" not in pack.__dict__
    assert set(pack.NODE_CLASS_MAPPINGS) == set(pack.NODE_DISPLAY_NAME_MAPPINGS)
    assert pack.NET_CLASS_NAME == soak.NET_CLASS_NAME
