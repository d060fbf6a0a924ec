"""bench/fleet_series.py offline: how it counts the series Prometheus stored, and its exit status without Prometheus."""

import importlib.util
import subprocess
import sys
from pathlib import Path

from memx_helpers import bench_env

ROOT = Path(__file__).resolve().parents[2]


def load_tool():
    return importlib.import_module("bench.fleet_series")


class FakePrometheus:
    def __init__(self):
        self.asked = []

    def series(self, match, start, end):
        self.asked.append(("series", match, start, end))
        return [{"__name__": "comfy_memx_loads_total", "package": "a"},
                {"__name__": "comfy_memx_loads_total", "package": "b"},
                {"__name__": "comfy_memx_info", "version": "0.2.0"}]

    def query(self, expr, at=None):
        self.asked.append(("query", expr, at))
        return [{"metric": {}, "value": [at, "250"]}]


def test_series_are_counted_per_name_over_the_whole_run():
    prom = FakePrometheus()
    figures = load_tool().count_series(prom, "comfyui", 100.0, 160.0)
    assert figures == {"distinct": 3, "max_scrape_samples": 250,
                       "by_name": {"comfy_memx_loads_total": 2, "comfy_memx_info": 1}}
    assert prom.asked[0] == ("series", '{job="comfyui",__name__=~"comfy_memx_.*"}', 100.0, 160.0)
    assert prom.asked[1] == ("query", 'max_over_time(scrape_samples_scraped{job="comfyui"}[61s])', 160.0)


def test_without_prometheus_the_tool_says_so_and_exits_2(tmp_path):
    env = bench_env({"COMFY_MEMX_PROMETHEUS": str(tmp_path / "no-such-prometheus"), "PATH": "/usr/bin:/bin"})
    done = subprocess.run([sys.executable, "-m", "bench.fleet_series", "--comfyui", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 2 and "prometheus not found" in done.stderr
