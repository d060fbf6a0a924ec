"""bench/pins.py: record format, MRU against LRU and the optimum, and the optimum against exhaustive search.
bench/gpu_check.py: its verdict without CUDA, its argument handling, and its orchestration of the checks."""

import functools
import importlib.util
import itertools
import json
import os
import random
import stat
import subprocess
import sys
import textwrap

import pytest

from bench import gpu_check, pins
from memx_helpers import bench_env

M = pins.MODULE_BYTES

GPU_CHECK = [sys.executable, "-m", "bench.gpu_check"]


@pytest.fixture(scope="module")
def records():
    return pins.run(quick=True)


def per_cycle(records):
    return {(r["config"], r["policy"]): r["value"] for r in records if r["metric"] == "bytes_registered_per_cycle"}


def test_records_have_the_specified_shape(records):
    assert records
    for record in records:
        assert record["case"] == "pins" and record["unit"] == "bytes" and record["policy"] in pins.POLICIES
        assert record["metric"] in ("bytes_registered_per_cycle", "bytes_registered_total")
        assert record["config"].startswith("N=") and ",k=" in record["config"]
        assert isinstance(record["value"], int) and record["value"] >= 0
    configs = {r["config"] for r in records}
    assert {(c, p) for c in configs for p in pins.POLICIES} == set(per_cycle(records))


def test_mru_never_registers_more_than_lru_and_is_near_optimal_on_pure_cycles(records):
    values = per_cycle(records)
    configs = {c for c, _ in values}
    for config in configs:
        assert values[(config, "mru")] <= values[(config, "lru")], config
        assert values[(config, "optimal")] <= min(values[(config, p)] for p in pins.POLICIES), config
        if "pattern=" not in config:
            assert values[(config, "mru")] <= 1.1 * values[(config, "optimal")], config


def test_lru_thrashes_on_a_pure_cycle_of_equal_models():
    sizes = [8 * M] * 4
    for k in (1, 2, 3):
        history = pins.simulate("lru", sizes, pins.cap_for(sizes, k), list(range(4)) * 5)
        assert history[-1] - history[-5] == sum(sizes)


def test_comfyui_order_over_evicts_by_its_hysteresis():
    sizes = [64 * M, 64 * M, 64 * M]  # 4 GiB each; the 2 GiB hysteresis costs extra registrations
    cap = pins.cap_for(sizes, 2) + 16 * M
    sequence = [0, 1, 2] * 4
    assert pins.simulate("comfyui", sizes, cap, sequence)[-1] > pins.simulate("lru", sizes, cap, sequence)[-1]


def exhaustive_minimum(sizes, cap, sequence):
    """Fewest units registered, over every schedule that pins each requested model fully (units of 1)."""
    states = {tuple(0 for _ in sizes): 0}
    for model in sequence:
        following = {}
        for state, cost in states.items():
            ranges = [range(sizes[m] + 1) if m == model else range(state[m] + 1) for m in range(len(sizes))]
            for kept in itertools.product(*[[sizes[model]] if m == model else ranges[m] for m in range(len(sizes))]):
                if sum(kept) > cap:
                    continue
                total = cost + sizes[model] - state[model]
                if total < following.get(kept, float("inf")):
                    following[kept] = total
        states = following
    return min(states.values())


@pytest.mark.parametrize("seed", range(25))
def test_optimal_matches_exhaustive_search(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 4)
    sizes = [rng.randint(1, 3) for _ in range(n)]
    cap = rng.randint(max(sizes), sum(sizes) - 1)
    sequence = [rng.randrange(n) for _ in range(rng.randint(6, 9))]
    assert pins.simulate("optimal", sizes, cap, sequence)[-1] == exhaustive_minimum(sizes, cap, sequence)


def test_mru_and_lru_policies_drive_the_real_budget(monkeypatch):
    seen = []
    real = pins.PinBudget

    @functools.wraps(real)
    def spy(*args, **kwargs):
        seen.append(kwargs.get("policy"))
        return real(*args, **kwargs)

    monkeypatch.setattr(pins, "PinBudget", spy)
    sizes = [2 * M, 2 * M, 2 * M]
    for policy in ("mru", "lru"):
        pins.simulate(policy, sizes, 4 * M, [0, 1, 2, 0])
    assert seen == ["mru", "lru"]


# -- bench/gpu_check.py -----------------------------------------------------------------------------------------

def comfy_tree(root, pins=True):
    """A folder shaped like a ComfyUI tree (gpu_check only looks at its files before handing it to ComfyUI)."""
    (root / "comfy").mkdir(parents=True)
    (root / "main.py").write_text("")
    if pins:
        (root / "comfy" / "pinned_memory.py").write_text("")
    return root


def test_gpu_check_without_cuda_is_a_skipped_verdict(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the skipped path does not apply")
    tree, out = comfy_tree(tmp_path / "ComfyUI"), tmp_path / "verdict.json"
    proc = subprocess.run(GPU_CHECK + ["--comfyui", str(tree), "--json", str(out)],
                          capture_output=True, text=True, timeout=120, env=bench_env())
    assert proc.returncode == 0, proc.stderr
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(printed) == 1 and printed[0] == json.loads(out.read_text())
    verdict = printed[0]
    assert verdict["verdict"] == "skipped" and verdict["reason"].startswith("skipped: no CUDA")
    assert verdict["checks"] == {} and verdict["device"]["cuda"] is False


@pytest.mark.parametrize("arguments, reason", [
    (["--comfyui", "{missing}"], "is not a folder"),
    (["--comfyui", "{plain}"], "is not a ComfyUI tree"),
    (["--comfyui", "{old}"], "does not pin"),
    (["--comfyui", "{tree}", "--python", "{missing}"], "does not exist"),
])
def test_gpu_check_refuses_what_it_cannot_check(arguments, reason, tmp_path, capsys):
    places = {"missing": str(tmp_path / "nowhere"), "plain": str(tmp_path),
              "old": str(comfy_tree(tmp_path / "old", pins=False)), "tree": str(comfy_tree(tmp_path / "new"))}
    assert gpu_check.main([a.format(**places) for a in arguments]) == 2
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "error" and reason in verdict["reason"]


def test_gpu_check_needs_a_tree(capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main([])
    assert exit_.value.code == 2 and "--comfyui is required" in capsys.readouterr().err


FAKE_PYTHON = textwrap.dedent("""\
    #!{python}
    # Stands in for a ComfyUI interpreter on a CUDA machine: canned answers, one check times out, one crashes.
    import json, sys, time
    args = sys.argv[1:]
    if "--measure" in args:
        what = args[args.index("--measure") + 1]
        if what == "probe":
            print(json.dumps({{"status": "pass", "result": {{"cuda": True, "torch": "fake", "name": "FakeGPU"}}}}))
        elif what == "transfers":
            time.sleep(60)
        else:
            sys.exit(3)
    else:  # bench/pin_invariant.py --comfyui TREE --register real --json OUT
        assert args[args.index("--register") + 1] == "real"
        verdict = {{"ok": True, "comfyui_version": "0.33.0", "cap_bytes": 2883584, "checks": {{"books": {{"ok": True,
                   "failures": []}}}}, "steps": [{{"step": "load A", "total_pinned_memory": 1, "memx": 1,
                   "registered": 1, "unregistered": []}}]}}
        with open(args[args.index("--json") + 1], "w") as f:
            json.dump(verdict, f)
""")


def test_gpu_check_runs_every_check_and_reports_each_failure(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setitem(gpu_check.LIMITS, "transfers", 3)
    status = gpu_check.main(["--comfyui", str(comfy_tree(tmp_path / "ComfyUI")), "--python", str(fake)])
    verdict = json.loads(capsys.readouterr().out)
    assert status == 1 and verdict["verdict"] == "fail"
    checks = verdict["checks"]
    assert checks["pins_in_comfyui"]["status"] == "pass" and checks["pins_in_comfyui"]["checks"] == {"books": True}
    assert checks["transfers"] == {"status": "timeout", "limit_seconds": 3}
    assert checks["registration"]["status"] == "error" and checks["registration"]["returncode"] == 3
    assert verdict["reason"] == "failed: transfers, registration" and verdict["device"]["name"] == "FakeGPU"


@pytest.mark.parametrize("measurement", ["transfers", "registration"])
def test_gpu_check_measurements_report_errors_instead_of_raising(measurement):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the measurement would run")
    proc = subprocess.run(GPU_CHECK + ["--measure", measurement, "--bytes", str(1024 ** 2)],
                          capture_output=True, text=True, timeout=120, env=bench_env())
    record = json.loads(proc.stdout.splitlines()[-1])
    assert proc.returncode == 0 and record["status"] == "error" and record["error"]
