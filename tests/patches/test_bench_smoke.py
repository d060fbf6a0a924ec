"""bench/run.py end to end with tiny sizes: valid JSON records for every case, each figure recomputed from the
per-round timings it was made of, targets judged, no negative added cost, temp files removed (no timing checks)."""

import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys

import pytest

from fake_comfy import shape_root
from memx_helpers import bench_env

CASES = ("load", "offload", "overhead", "leak", "pins", "features")
STAND_IN_TREE = shape_root("0.27.0")
# record() keeps 4 significant digits (values < 1) or 4 decimals: at most this relative error, and nothing more
ROUNDING = 5.001e-4


def bench_module(name):
    return importlib.import_module(f"bench.{name}")


def run_bench(tmp_path, *args):
    """Run bench/run.py with TMPDIR inside ``tmp_path``; returns (process, records or None, leftovers in TMPDIR)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    out = tmp_path / "records.json"
    env = bench_env(dict(os.environ, TMPDIR=str(scratch)))
    process = subprocess.run([sys.executable, "-m", "bench.run", *args, "--json", str(out), "--no-chart"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    records = json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
    return process, records, sorted(p.name for p in scratch.iterdir())


def rounded(recorded, exact):
    """``recorded`` is ``exact`` as record() rounds it (and not merely close to it)."""
    return recorded == pytest.approx(exact, rel=ROUNDING, abs=1e-12)


def check_rate(r):
    """A GB/s record against its per-round seconds: value, min, max, floor and ratio as the README defines them."""
    seconds = r["per_round"]["seconds"]
    rates = [r["bytes"] / s / 1e9 for s in seconds]
    assert r["rounds"] == len(seconds) > 0, r
    assert rounded(r["value"], statistics.median(rates)), r
    assert rounded(r["min"], min(rates)) and rounded(r["max"], max(rates)), r
    if "floor_seconds" in r["per_round"]:
        floor_seconds = r["per_round"]["floor_seconds"]
        assert len(floor_seconds) == len(seconds), r
        floors = [r["floor_bytes"] / s / 1e9 for s in floor_seconds]
        assert rounded(r["floor"], statistics.median(floors)), r
        # the median of the per-round ratios, which is not value / floor in general
        assert rounded(r["ratio"], statistics.median(a / b for a, b in zip(rates, floors))), r
    else:
        assert "floor" not in r and "ratio" not in r, r


def check_ratio(r):
    """A patched/unpatched (or pageable/pinned) record against its per-round seconds."""
    numerators, denominators = r["per_round"]["numerator"], r["per_round"]["denominator"]
    ratios = [a / b for a, b in zip(numerators, denominators)]
    assert r["pairs"] == len(ratios) == len(numerators) == len(denominators) > 0, r
    assert rounded(r["value"], statistics.median(ratios)) and r["ratio"] == r["value"], r
    assert rounded(r["min"], min(ratios)) and rounded(r["max"], max(ratios)), r


def check_difference(r):
    """An added cost against its per-round seconds; it is a positive value or an upper bound, never negative."""
    treated, control, again = (r["per_round"][k] for k in ("treated", "control", "control_again"))
    per = r["calls"]
    differences = [(t - c) / per * 1e6 for t, c in zip(treated, control)]
    resolution = statistics.median(abs(a - c) / per * 1e6 for a, c in zip(again, control))
    estimate = statistics.median(differences)
    assert r["unit"] == "us" and r["rounds"] == len(differences) == len(again) > 0, r
    assert rounded(r["resolution"], resolution) and r["resolution"] >= 0, r
    if estimate > resolution:
        assert rounded(r["value"], estimate) and r["value"] > 0 and "below_resolution" not in r, r
    else:
        assert r["value"] is None and r["below_resolution"] is True, r
        assert rounded(r["upper_bound"], max(estimate, 0.0) + resolution) and r["upper_bound"] >= 0, r


def check_seconds(r):
    seconds = r["per_round"]["seconds"]
    assert rounded(r["value"], statistics.median(seconds)) and r["rounds"] == len(seconds), r


def check_values(r):
    """A median of per-round values in another unit (MiB returned by malloc_trim, say)."""
    values = r["per_round"]["values"]
    assert rounded(r["value"], statistics.median(values)) and r["rounds"] == len(values) > 0, r
    assert rounded(r["min"], min(values)) and rounded(r["max"], max(values)), r


def check_formula(r, records):
    """A ratio of two other records of the same case (``formula`` "a/b"), from their rounded values."""
    top, bottom = r["formula"].split("/")
    (a,) = [x["value"] for x in records if x["case"] == r["case"] and x["metric"] == top]
    (b,) = [x["value"] for x in records if x["case"] == r["case"] and x["metric"] == bottom]
    decimals = len(str(r["ratio"]).split(".")[1]) if "." in str(r["ratio"]) else 0
    # a and b carry up to 5e-5 of rounding each; the ratio is rounded to its own decimals on top
    tolerance = a / b * (5e-5 / a + 5e-5 / b) * 1.01 + 0.5 * 10 ** -decimals + 1e-12
    assert abs(r["ratio"] - a / b) <= tolerance, (r, a, b)
    assert r["value"] == r["ratio"], r


def check_target(r):
    """``met`` says whether the judged figure (ratio, else value, else upper bound) meets target_min/target_max."""
    if "target_min" not in r and "target_max" not in r:
        assert "met" not in r, r
        return
    low, high = r.get("target_min"), r.get("target_max")
    if r.get("below_resolution"):
        assert r["met"] is (True if high is not None and low is None and r["upper_bound"] <= high else None), r
        return
    figure = r["ratio"] if "ratio" in r else r["value"]
    assert r["met"] is ((low is None or figure >= low) and (high is None or figure <= high)), r


def check_records(records):
    assert isinstance(records, list) and records
    for r in records:
        assert {"case", "metric", "value", "unit"} <= set(r), r
        assert r["metric"] != "error", r
        assert not any(isinstance(v, float) and not math.isfinite(v) for v in r.values()), r
        kind = set(r.get("per_round", {}))
        if "ratio" in r:
            assert kind or "formula" in r, f"a ratio that cannot be checked: {r}"
        if kind >= {"treated", "control", "control_again"}:
            check_difference(r)
        elif kind == {"numerator", "denominator"}:
            check_ratio(r)
        elif r["unit"] == "GB/s" and kind:
            check_rate(r)
        elif r["unit"] == "s" and kind:
            check_seconds(r)
        elif kind == {"values"}:
            check_values(r)
        else:
            assert not kind, f"per-round data of an unknown kind: {r}"
        if "formula" in r:
            check_formula(r, records)
        if r["unit"] == "us":
            assert "per_round" in r, f"an added cost that is not measured against a resolution: {r}"
        check_target(r)


@pytest.fixture(scope="module")
def all_cases(tmp_path_factory):
    return run_bench(tmp_path_factory.mktemp("bench"), "--quick", "--tiny")


def test_quick_run_of_every_case_writes_valid_records(all_cases):
    process, records, leftovers = all_cases
    assert process.returncode == 0, process.stderr[-3000:]
    check_records(records)
    assert {r["case"] for r in records} == set(CASES) | {"run"}
    for case in CASES:
        measured = [r for r in records if r["case"] == case and r["metric"] != "skipped"]
        assert measured, f"case {case} measured nothing: {[r for r in records if r['case'] == case]}"
    # the test extra installs objgraph, matplotlib and numpy: only the CUDA part of offload may be skipped here
    import torch
    skipped = [r for r in records if r["metric"] == "skipped"]
    if torch.cuda.is_available():
        assert skipped == []
    else:
        assert [(r["case"], r["path"]) for r in skipped] == [("offload", "cuda")], skipped
    assert leftovers == [], "generated checkpoints were not cleaned up"


def test_every_case_measures_what_it_says(all_cases):
    _, records, _ = all_cases
    by_metric = {}
    for r in records:
        by_metric.setdefault((r["case"], r["metric"]), []).append(r)
    warm = {r["path"]: r for r in by_metric[("load", "warm_gb_per_s")]}
    assert warm["safetensors.load_file"]["target_min"] == 0.6 and warm["safetensors.load_file"]["tensors"] == 1250
    assert warm["safetensors.load_file"]["floor"] == by_metric[("load", "memcpy_gb_per_s")][0]["value"]
    assert {r["path"] for r in by_metric[("load", "cold_gb_per_s")]} >= {"safetensors.load_file", "raw_read"}
    for metric in ("ram_to_device_gb_per_s", "device_to_ram_gb_per_s", "event_load_gb_per_s",
                   "event_unload_gb_per_s"):
        (offload,) = by_metric[("offload", metric)]
        assert offload["value"] > 0 and offload["bytes"] == warm["safetensors.load_file"]["bytes"]
    loader = {r["config"].split(":")[0]: r for r in by_metric[("overhead", "loader_patched_over_unpatched")]}
    assert set(loader) == {"big", "small"} and all(r["min"] <= r["value"] <= r["max"] for r in loader.values())
    assert {r["target_max"] for r in loader.values()} == {1.02, 1.03}
    assert by_metric[("overhead", "loader_added_us_per_load")][0]["unit"] == "us"
    sites = {r["site"] for r in by_metric[("overhead", "wrapper_added_us")]}
    assert {"load_models_gpu", "free_memory", "LoadedModel.model_load"} <= sites
    assert all(r["target_max"] == 0.6 for r in by_metric[("overhead", "wrapper_added_us")])
    assert len(by_metric[("overhead", "added_us_per_wrapped_call")]) == 2
    leak = {metric: rs[0] for (case, metric), rs in by_metric.items() if case == "leak"}
    assert {"search_s", "objgraph_s", "scan_s", "speedup_vs_objgraph", "search_in_scans"} <= set(leak)
    assert leak["speedup_vs_objgraph"]["target_min"] == 2.5 and leak["search_in_scans"]["target_max"] == 6.0
    assert len(by_metric[("pins", "bytes_registered_per_cycle")]) > 0
    (pattern,) = by_metric[("features", "pattern_s_per_chain")]
    assert pattern["value"] > 0 and pattern["chains"] == 9
    assert set(pattern["patterns"]) == {"class_cache", "callback_registry", "closure", "lru_cache", "module_registry",
                                        "module_global", "singleton", "thread_frame", "reference_cycle"}
    (idle,) = by_metric[("features", "idle_check_s")]
    (share,) = by_metric[("features", "idle_check_share")]
    assert idle["value"] > 0 and rounded(share["value"], idle["value"] / share["check_every_s"]), share
    assert by_metric[("features", "malloc_trim_s")][0]["rounds"] == 2
    (returned,) = by_metric[("features", "malloc_trim_returned_mib")]
    assert returned["allocated_mib"] == 16 and 0 <= returned["value"] <= 16, returned


def test_table_names_every_case_and_flags_every_missed_target(all_cases):
    process, records, _ = all_cases
    for case in CASES:
        assert f"== {case}" in process.stdout
    header = [line for line in process.stdout.splitlines() if line.strip().startswith("metric")]
    assert header and all(" target " in line for line in header)
    judged = [r for r in records if "met" in r]
    missed = [r for r in records if r.get("met") is False]
    assert len(judged) >= 13     # load 2, leak 2, loader 2, wrappers 7
    assert process.stdout.count("MISSED:") == len(missed)
    assert re.search(rf"== targets: {len(judged)} judged, \d+ met, {len(missed)} MISSED, \d+ unresolved",
                     process.stdout)
    rows = [line for line in process.stdout.splitlines() if " MISSED  " in line + "  "]
    assert len(rows) == len(missed), rows


def test_no_added_cost_is_printed_negative(all_cases):
    process, records, _ = all_cases
    for line in process.stdout.splitlines():
        cells = line.split()
        if cells and cells[0] in ("wrapper_added_us", "added_us_per_wrapped_call", "loader_added_us_per_load"):
            assert not cells[1].startswith("-"), line
            assert cells[1] == "<" or float(cells[1]) > 0, line


def test_comfyui_tree_runs_in_a_child_process(tmp_path):
    process, records, leftovers = run_bench(tmp_path, "load", "offload", "--tiny", "--comfyui", str(STAND_IN_TREE))
    assert process.returncode == 0, process.stderr[-3000:]
    check_records(records)
    load = [r for r in records if r["case"] == "load"]
    assert {r["comfyui"] for r in load} == {"0.27.0"}
    assert "comfy.utils.load_torch_file" in {r["path"] for r in load if r["metric"] == "warm_gb_per_s"}
    skipped = [r for r in records if r["case"] == "offload" and r["metric"] == "skipped"]
    assert any("--cpu" in r["reason"] for r in skipped)
    assert leftovers == []


@pytest.mark.parametrize("args, message", [(["nosuchcase"], "unknown case nosuchcase"),
                                           (["--comfyui", "/nonexistent"], "no main.py"),
                                           (["--python", sys.executable], "--python needs --comfyui")])
def test_bad_arguments_exit_2(tmp_path, args, message):
    process, records, _ = run_bench(tmp_path, *args)
    assert process.returncode == 2 and message in process.stderr and records is None


def test_generated_checkpoint_is_a_valid_diffusion_shaped_safetensors_file(tmp_path):
    from safetensors import safe_open
    common = bench_module("common")
    layout = common.checkpoint_layout(8 * common.MIB)
    path = tmp_path / "model.safetensors"
    size = common.write_checkpoint(str(path), layout)
    assert size == path.stat().st_size
    with safe_open(str(path), framework="pt") as f:
        keys = list(f.keys())
        assert len(keys) == len(layout) == common.TENSORS
        dtypes = {str(f.get_tensor(k).dtype) for k in keys}
        nbytes = sum(f.get_tensor(k).nbytes for k in keys)
        shapes = {name: tuple(f.get_tensor(name).shape) for name in keys}
    assert dtypes == {"torch.float16", "torch.bfloat16"}
    assert 0.5 * 8 * common.MIB < nbytes <= 8 * common.MIB
    assert shapes == {name: shape for name, shape, _ in layout}
    assert any(len(shape) == 4 for shape in shapes.values()) and any(len(shape) == 1 for shape in shapes.values())


def test_interleaving_rotates_the_order_and_times_every_round():
    common = bench_module("common")
    calls = []
    times = common.interleaved({"a": lambda: calls.append("a"), "b": (lambda: calls.append("b"),
                                                                      lambda: calls.append("prepare b"))}, 3)
    assert calls == ["a", "prepare b", "b",              # warm-up round, untimed
                     "prepare b", "b", "a", "a", "prepare b", "b", "prepare b", "b", "a"]
    assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3}


def test_rate_record_takes_the_median_of_per_round_ratios():
    common = bench_module("common")
    record = common.rate_record("x", "m", 10 ** 9, [1.0, 2.0, 4.0], [0.5, 0.5, 1.0], floor_bytes=2 * 10 ** 9)
    # rates 1, 0.5, 0.25 GB/s; floors 4, 4, 2 GB/s; per-round ratios 0.25, 0.125, 0.125
    assert (record["value"], record["min"], record["max"], record["floor"], record["ratio"]) == (0.5, 0.25, 1.0, 4.0,
                                                                                                 0.125)
    assert record["per_round"] == {"seconds": [1.0, 2.0, 4.0], "floor_seconds": [0.5, 0.5, 1.0]}
    check_rate(record)
    # rates 1, 0.25; floors 1, 4; per-round ratios 1, 0.0625 -> 0.53125, where value / floor = 0.625 / 2.5 = 0.25
    other = common.rate_record("x", "m", 10 ** 9, [1.0, 4.0], [1.0, 0.25])
    assert other["ratio"] == 0.5312 and other["value"] / other["floor"] != pytest.approx(other["ratio"], rel=0.1)
    check_rate(other)


def test_difference_record_is_never_negative_and_says_below_resolution():
    common = bench_module("common")
    # wrapped 2.9-3.1 us per call above direct; the two direct timings 0.1 us apart, but for one preempted round
    resolved = common.difference_record("x", "added_us", [4e-6, 4.2e-6, 3.9e-6], [1e-6, 1.1e-6, 1e-6],
                                        [1.1e-6, 1.0e-6, 6e-6], target_max=3.5)
    assert resolved["value"] == pytest.approx(3.0, rel=1e-9) and resolved["resolution"] == pytest.approx(0.1)
    assert "below_resolution" not in resolved and resolved["met"] is True
    check_difference(resolved)
    # "wrapped" faster than direct (noise): no negative figure, an upper bound from the resolution instead
    noisy = common.difference_record("x", "added_us", [2e-6, 2e-6, 2e-6], [2.5e-6, 2.6e-6, 2.4e-6],
                                     [2.0e-6, 2.1e-6, 2.9e-6], per=2, target_max=0.6)
    assert noisy["value"] is None and noisy["below_resolution"] is True
    assert noisy["upper_bound"] == pytest.approx(0.25) and noisy["resolution"] == pytest.approx(0.25)
    assert noisy["met"] is True
    check_difference(noisy)
    # a 1 us difference where two identical timings differed by 1.5 us: below resolution, bound above the target
    coarse = common.difference_record("x", "added_us", [3e-6, 3e-6], [2e-6, 2e-6], [0.5e-6, 0.5e-6], target_max=0.6)
    assert coarse["below_resolution"] and coarse["upper_bound"] == pytest.approx(2.5) and coarse["met"] is None
    check_difference(coarse)
    table = common.format_table([resolved, noisy, coarse])
    assert "< 0.25" in table and "< 2.5" in table and "below resolution" in table and "unresolved" in table
    assert "-" not in " ".join(line.split()[1] for line in table.splitlines()[2:5])


def test_table_and_records_flag_missed_targets():
    common = bench_module("common")
    met = common.rate_record("load", "warm_gb_per_s", 10 ** 9, [1.0, 1.0], [0.5, 0.5], target_min=0.4, path="a")
    missed = common.rate_record("load", "warm_gb_per_s", 10 ** 9, [1.0, 1.0], [0.5, 0.5], target_min=0.6, path="b")
    too_slow = common.ratio_record("overhead", "loader_patched_over_unpatched", [1.1], [1.0], target_max=1.02)
    by_hand = common.judge({"case": "leak", "metric": "speedup", "value": 2.5, "unit": "x", "ratio": 2.5,
                            "target_min": 3.0})
    plain = common.record("pins", "bytes", 5, "bytes")
    assert (met["met"], missed["met"], too_slow["met"], by_hand["met"]) == (True, False, False, False)
    assert "met" not in plain
    table = common.format_table([met, missed, too_slow, by_hand, plain])
    rows = {line.split()[-1]: line for line in table.splitlines() if "warm_gb_per_s" in line}
    assert ">= 0.4 met" in rows["path=a"] and ">= 0.6 MISSED" in rows["path=b"]
    assert "<= 1.02 MISSED" in table and ">= 3 MISSED" in table
    assert "== targets: 4 judged, 1 met, 3 MISSED, 0 unresolved" in table
    assert "MISSED: load warm_gb_per_s [b]: ratio 0.5, target >= 0.6" in table
    assert common.judge(common.skipped_record("load", "no disk", target_min=0.6)).get("met") is None
