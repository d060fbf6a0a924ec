"""``bench.exposed``'s verdicts: ``/memx/models`` p99 judged against ``/queue`` p99 of the same round (target 1.05) per
load (with and without the CPU-bound node) and variant, never against an absolute latency; a p99 on too few samples
left unjudged; both routes drawn with the same share; the prompt-latency ratio judged under the CPU-bound node only."""

import pytest

from bench import exposed


def timings(models_p99, queue_p99, samples=200, prompt=1.0):
    """One round's timings whose p99s are the given seconds (every other sample 0.01 s)."""
    def spread(top):
        return [0.01] * (samples - 5) + [top] * 5
    return {"models_s": spread(models_p99), "queue_s": spread(queue_p99), "prompt_s": [prompt] * 5,
            "statuses": {"models 200": samples}}


def results(cpu_node_models_p99, no_cpu_node_models_p99, samples=200, prompts=(1.0, 1.0)):
    out = {}
    for load, models_p99 in (("cpu_node", cpu_node_models_p99), ("no_cpu_node", no_cpu_node_models_p99)):
        for variant, prompt in zip(("searches", "no_searches"), prompts):
            out[load, variant] = [timings(models_p99, 0.4, samples, prompt), timings(models_p99, 0.4, samples, prompt)]
    return out


def judged(records, metric):
    return {(r.get("load"), r.get("variant")): r for r in records if r["metric"] == metric}


def test_the_p99_ratio_is_judged_per_load_and_variant_against_queue():
    records = exposed.records_of(results(0.41, 0.5), requests=2000, clients=8, busy_s=0.3)
    ratios = judged(records, "models_p99_over_queue_p99")
    assert set(ratios) == {(load, variant) for load in exposed.LOADS for variant in exposed.MIX}
    for (load, _variant), record in ratios.items():
        assert record["target_max"] == exposed.RATIO_TARGET == 1.05
        assert record["ratio"] == pytest.approx(0.41 / 0.4 if load == "cpu_node" else 0.5 / 0.4, rel=1e-3)
        assert record["met"] is (load == "cpu_node")
        assert record["per_round"]["denominator"] == [0.4, 0.4]   # /queue's p99 of the same rounds


def test_no_latency_is_judged_by_its_absolute_value():
    records = exposed.records_of(results(5.0, 5.0), requests=2000, clients=8, busy_s=0.3)
    seconds = [r for r in records if r["unit"] == "s"]
    assert {r["metric"] for r in seconds} >= {"models_p50_s", "models_p99_s", "comfyui_queue_p50_s",
                                              "comfyui_queue_p99_s"}
    assert all("target_max" not in r and "met" not in r for r in seconds)


def test_a_p99_on_too_few_samples_is_left_unjudged():
    records = exposed.records_of(results(0.4, 0.4, samples=exposed.MIN_P99_SAMPLES - 1), requests=100)
    for record in judged(records, "models_p99_over_queue_p99").values():
        assert record["met"] is None and "--requests" in record["why"]
        assert record["p99_samples"] == exposed.MIN_P99_SAMPLES - 1


def test_the_prompt_latency_ratio_is_judged_under_the_cpu_bound_node_only():
    records = exposed.records_of(results(0.4, 0.4, prompts=(1.2, 1.0)), requests=2000, busy_s=0.3)
    medians = judged(records, "prompt_median_ratio")
    assert medians["cpu_node", None]["met"] is False and medians["cpu_node", None]["target_max"] == 1.10
    assert "target_max" not in medians["no_cpu_node", None] and "met" not in medians["no_cpu_node", None]


def test_both_routes_have_the_same_share_enough_for_a_p99_at_the_default_requests():
    for variant, mix in exposed.MIX.items():
        weights = dict(mix)
        assert weights["models"] == weights["queue"], variant
        assert 2000 * weights["queue"] / sum(weights.values()) >= 5 * exposed.MIN_P99_SAMPLES


def test_cpu_node_choices_and_a_bad_one_named(capsys):
    assert exposed.CPU_NODE_CHOICES["both"] == ("cpu_node", "no_cpu_node")
    with pytest.raises(SystemExit):
        exposed.main(["--cpu-node", "maybe"])
    assert "--cpu-node" in capsys.readouterr().err
