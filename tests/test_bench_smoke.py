"""bench/run.py end to end with tiny sizes: valid JSON records for every case, temp files removed (no timing checks)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "bench" / "run.py"
CASES = ("load", "offload", "overhead", "leak", "pins")
STAND_IN_TREE = ROOT / "tests" / "fake_comfy" / "v0_27_0"


def bench_module(name):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def run_bench(tmp_path, *args):
    """Run bench/run.py with TMPDIR inside ``tmp_path``; returns (process, records or None, leftovers in TMPDIR)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    out = tmp_path / "records.json"
    env = dict(os.environ, TMPDIR=str(scratch))
    process = subprocess.run([sys.executable, str(RUN), *args, "--json", str(out), "--no-chart"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
    records = json.loads(out.read_text(encoding="utf-8")) if out.exists() else None
    return process, records, sorted(p.name for p in scratch.iterdir())


def check_records(records):
    assert isinstance(records, list) and records
    for record in records:
        assert {"case", "metric", "value", "unit"} <= set(record), record
        assert record["metric"] != "error", record
        if isinstance(record.get("floor"), float) and record["unit"] == "GB/s":
            assert record["floor"] > 0 and record["ratio"] > 0 and math.isfinite(record["ratio"]), record
            assert record["ratio"] == pytest.approx(record["value"] / record["floor"], rel=1.0), record


@pytest.fixture(scope="module")
def all_cases(tmp_path_factory):
    return run_bench(tmp_path_factory.mktemp("bench"), "--quick", "--tiny")


def test_quick_run_of_every_case_writes_valid_records(all_cases):
    process, records, leftovers = all_cases
    assert process.returncode == 0, process.stderr[-3000:]
    check_records(records)
    assert {r["case"] for r in records} == set(CASES) | {"run"}
    for case in CASES:
        assert any(r["metric"] != "skipped" or case == "leak" for r in records if r["case"] == case), case
    assert leftovers == [], "generated checkpoints were not cleaned up"


def test_load_and_offload_report_gb_per_s_next_to_their_floors(all_cases):
    _, records, _ = all_cases
    by_metric = {}
    for r in records:
        by_metric.setdefault((r["case"], r["metric"]), []).append(r)
    warm = {r["path"]: r for r in by_metric[("load", "warm_gb_per_s")]}
    assert warm["safetensors.load_file"]["target"] == 0.6 and warm["safetensors.load_file"]["tensors"] == 1250
    assert warm["safetensors.load_file"]["floor"] == by_metric[("load", "memcpy_gb_per_s")][0]["value"]
    assert {r["path"] for r in by_metric[("load", "cold_gb_per_s")]} >= {"safetensors.load_file", "raw_read"}
    for metric in ("ram_to_device_gb_per_s", "device_to_ram_gb_per_s", "event_load_gb_per_s",
                   "event_unload_gb_per_s"):
        (offload,) = by_metric[("offload", metric)]
        assert offload["value"] > 0 and offload["bytes"] == warm["safetensors.load_file"]["bytes"]
    loader = {r["config"].split(":")[0]: r for r in by_metric[("overhead", "loader_patched_over_unpatched")]}
    assert set(loader) == {"big", "small"} and all(r["min"] <= r["value"] <= r["max"] for r in loader.values())
    assert by_metric[("overhead", "loader_added_us_per_load")][0]["unit"] == "us"


def test_table_names_every_case(all_cases):
    process, _, _ = all_cases
    for case in CASES:
        assert f"== {case}" in process.stdout


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
    record = common.rate_record("x", "m", 10 ** 9, [1.0, 2.0, 4.0], [0.5, 0.5, 1.0])
    assert (record["value"], record["min"], record["max"], record["floor"], record["ratio"]) == (0.5, 0.25, 1.0, 2.0,
                                                                                                 0.25)
