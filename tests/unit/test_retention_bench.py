"""Offline checks of bench/retention.py (no ComfyUI server): argument errors and the per-mode summary."""

import importlib.util
import subprocess
import sys

import pytest

from fake_comfy import shape_root
from memx_helpers import bench_env



def load():
    return importlib.import_module("bench.retention")


@pytest.mark.parametrize("args, message", [
    ([], "--comfyui"),
    (["--comfyui", "/nonexistent"], "no main.py there"),
    (["--comfyui", shape_root("0.27.0"), "--rounds", "0"], "--rounds"),
    (["--comfyui", shape_root("0.27.0"), "--checkpoint", "/nonexistent.safetensors"],
     "no such file"),
])
def test_bad_arguments_exit_2_naming_the_option(args, message):
    process = subprocess.run([sys.executable, "-m", "bench.retention", *args], capture_output=True, text=True,
                             timeout=60, env=bench_env())
    assert process.returncode == 2 and message in process.stderr, process.stderr


def test_summary_is_the_median_per_mode_and_leaves_out_what_is_not_a_number():
    retention = load()
    rounds = [{"trim": {"rss_after_mib": 900.0, "trim_s": 0.02, "trim_skipped": None},
               "no_trim": {"rss_after_mib": 1500.0, "trim_s": None, "trim_skipped": "COMFY_MEMX_TRIM=0"}},
              {"trim": {"rss_after_mib": 700.0, "trim_s": 0.04, "trim_skipped": None},
               "no_trim": {"rss_after_mib": 1300.0, "trim_s": None, "trim_skipped": "COMFY_MEMX_TRIM=0"}},
              {"trim": {"rss_after_mib": 800.0, "trim_s": 0.01, "trim_skipped": None},
               "no_trim": {"rss_after_mib": 1700.0, "trim_s": None, "trim_skipped": "COMFY_MEMX_TRIM=0"}}]
    summary = retention.summarize(rounds)
    assert summary == {"trim": {"rss_after_mib": 800.0, "trim_s": 0.02}, "no_trim": {"rss_after_mib": 1500.0}}
