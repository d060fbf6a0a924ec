"""bench/pins.py: record format, MRU against LRU and the optimum, and the optimum against exhaustive search."""

import functools
import importlib.util
import itertools
import os
import random

import pytest

_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "pins.py")
_spec = importlib.util.spec_from_file_location("bench_pins", _PATH)
pins = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pins)

M = pins.MODULE_BYTES


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
