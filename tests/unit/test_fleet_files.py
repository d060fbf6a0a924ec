"""The shipped fleet files: where they are, the Grafana dashboard's schema basics, and that the rules and the
dashboard only ask for metrics that comfy_memx exports."""

import json
import os
import re
import subprocess
import sys

import pytest

from comfy_memx import fleet
from comfy_memx.cli import fleet as fleet_cli
from comfy_memx.surface import metrics
from bench.harness import prom
from fleet_queries import (GRAFANA_VARIABLES, dashboard_exprs, data_panels, grafana_free,  # noqa: F401
                           load_dashboard)

prometheus_parser = pytest.importorskip("prometheus_client.parser")

SELECTOR = 'job=~"$job", instance=~"$instance"'
GRID_COLUMNS = 24


def rules_text():
    with open(fleet.rules_path(), encoding="utf-8") as handle:
        return handle.read()


def metric_names(text):
    """The comfy_memx metric names a PromQL text mentions (rule group names and comments left out)."""
    text = re.sub(r"^\s*(#.*|- name: .*)$", "", text, flags=re.M)
    return set(re.findall(r"\bcomfy_memx_[a-z0-9_]+", text))


def test_the_files_are_shipped_next_to_the_package_and_named_by_path():
    assert os.path.isfile(fleet.rules_path()) and os.path.isfile(fleet.dashboard_path())
    assert os.path.dirname(fleet.rules_path()) == os.path.dirname(os.path.abspath(fleet.__file__))
    assert fleet.path("dashboard.json") == fleet.dashboard_path()
    with pytest.raises(ValueError):
        fleet.path("../setup.py")


def test_the_fleet_command_prints_the_paths_and_a_scrape_config(capsys):
    assert fleet_cli.main(["--rules-path"]) == 0
    assert capsys.readouterr().out == fleet.rules_path() + "\n"
    assert fleet_cli.main(["--scrape-config", "10.0.0.5:8188", "10.0.0.6:8188", "--metrics-path", "/memx/metrics"]) == 0
    text = capsys.readouterr().out
    # no rule_files: the README copies the rules where prometheus.yml looks, and two entries would load them twice
    assert "rule_files" not in text and fleet.rules_path() not in text and "job_name: comfyui\n" in text
    assert 'targets: ["10.0.0.5:8188", "10.0.0.6:8188"]' in text and "metrics_path: /memx/metrics" in text
    assert "scrape_interval: 15s\n" in text and "scrape_timeout: 10s\n" in text


def test_the_fleet_help_is_plain_text_that_says_what_the_operations_page_says(capsys):
    with pytest.raises(SystemExit):
        fleet_cli.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "``" not in shown and "rules loaded" not in shown, shown
    assert ("python -m comfy_memx fleet: where the shipped Prometheus rules and Grafana dashboard are, a scrape "
            "config that uses them") in shown, shown
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                           "operations.md"), encoding="utf-8") as handle:
        page = handle.read()
    for option in ("--rules-path", "--dashboard-path", "--scrape-config", "--rules", "--job-selector",
                   "--runbook-base", "--set NAME=VALUE", "--metrics-path"):
        assert option in shown and option in page, option


def test_the_launcher_dispatches_the_fleet_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "comfy_memx", "fleet", "--dashboard-path"], capture_output=True,
                          text=True, timeout=60, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == fleet.dashboard_path()


def test_the_dashboard_has_grafanas_schema_basics():
    dashboard = load_dashboard()
    assert dashboard["title"] and dashboard["uid"] and isinstance(dashboard["schemaVersion"], int)
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels] + [p["id"] for panel in panels for p in panel.get("panels", [])]
    assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), ids
    cells = set()
    for panel in panels:
        assert panel["type"] and panel["title"], panel
        grid = panel["gridPos"]
        assert all(isinstance(grid[key], int) for key in ("h", "w", "x", "y")), panel["title"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= GRID_COLUMNS, panel["title"]
        covered = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
    for panel in data_panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}" and target["expr"].strip(), panel["title"]


def test_the_dashboard_has_a_datasource_variable_and_job_and_instance_variables_fed_by_the_info_metric():
    variables = {v["name"]: v for v in load_dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for name in ("job", "instance"):
        variable = variables[name]
        assert variable["type"] == "query" and variable["datasource"]["uid"] == "${datasource}"
        assert variable["includeAll"] and variable["multi"] and variable["allValue"] == ".*"
        assert "comfy_memx_info" in variable["query"]["query"] and f"{name})" in variable["query"]["query"]
    assert '{job=~"$job"}' in variables["instance"]["query"]["query"]


def test_every_dashboard_query_selects_the_chosen_job_and_instance():
    for title, ref, expr in dashboard_exprs():
        selectors = re.findall(r"\b(?:comfy_memx[_:][a-z0-9_:]+|process_start_time_seconds)(\{[^}]*\})?", expr)
        assert selectors and all(re.fullmatch(r"\{" + re.escape(SELECTOR) + r'(, [a-z_]+="[a-z_]+")*\}', selector)
                                 for selector in selectors), (title, ref, expr)


def test_the_dashboard_shows_every_group_the_issue_asks_for():
    names = set()
    for _, _, expr in dashboard_exprs():
        names |= metric_names(expr)
    wanted = {"comfy_memx_loaded_bytes", "comfy_memx_model_bytes", "comfy_memx_leaked_bytes", "comfy_memx_leaks_total",
              "comfy_memx_reload_seconds_total", "comfy_memx_pinned_bytes", "comfy_memx_pin_cap_bytes",
              "comfy_memx_frees_total", "comfy_memx_free_survivors_total", "comfy_memx_load_gbps_bucket",
              "comfy_memx_offload_gbps_bucket", "comfy_memx_info", "comfy_memx_releases_total",
              "comfy_memx_released_bytes_total", "comfy_memx_release_failed_models", "comfy_memx_free_survivor_models"}
    assert wanted <= names, wanted - names


def test_every_aggregating_panel_names_the_server():
    """A fleet view must say which server to drain: every aggregation keeps ``instance``, except the heatmaps, which
    Grafana repeats once per selected server."""
    for panel in data_panels(load_dashboard()):
        for target in panel["targets"]:
            for grouping in re.findall(r"\b(?:sum|max|min|avg) by \(([^)]*)\)", target["expr"]):
                labels = {label.strip() for label in grouping.split(",")}
                assert "instance" in labels or (panel.get("repeat") == "instance" and labels == {"le"}), (
                    panel["title"], target["expr"])


def test_the_board_reads_the_growth_fits_that_the_rules_record():
    recorded = set(re.findall(r"^\s*- record: (\S+)$", rules_text(), re.M))
    read = {name for _, _, expr in dashboard_exprs() for name in re.findall(r"\bcomfy_memx:[a-z0-9_:]+", expr)}
    assert {"comfy_memx:rss_unexplained_growth:bytes_per_hour", "comfy_memx:rss_unexplained_fast_growth:bytes_per_hour"} \
        <= read <= recorded, (read, recorded)


def every_family_exported():
    """Names of every sample comfy_memx exports once each kind of event happened (histograms with suffixes)."""
    owner = {"package": "p"}
    leak = {"stage": "rooted", "time": 1.0, "found_by": "after_free", "holder_package": "p"}
    m = metrics.Metrics(model_rows=lambda: [{"model": "M", "model_id": "M#1", "owner": owner, "load_device": "cpu",
                                             "loaded_bytes": 0, "bytes": 1, "state": "leaked", "leak": leak,
                                             "release": {"last": "in_use"}}],
                        pin_facts=lambda: {"pinned_bytes": 1, "cap_bytes": 2, "comfyui_cap_bytes": 3},
                        process_facts=lambda: {"sites": [{"patch": "p", "site": "s", "state": "skipped",
                                                          "reason": "absent in this ComfyUI"}]})
    for event in [
        {"event": "load", "owner": owner, "bytes": 1, "seconds": 1.0, "gb_per_s": 1.0,
         "reload": {"package": "p", "seconds": 1.0}},
        {"event": "unload", "owner": owner, "reason": "other", "bytes": 1, "seconds": 1.0, "gb_per_s": 1.0},
        {"event": "leak", "owner": owner, "stage": "rooted", "search": {"seconds": 0.1}},
        {"event": "leak_seen", "owner": owner},
        {"event": "pin_evict", "reason": "cap", "bytes": 1},
        {"event": "pin_refused", "reason": "eviction_failed"},
        {"event": "release", "package": "p", "outcome": "released", "died": True, "bytes": 1},
        {"event": "free", "origin": None, "survivors": 1, "survivor_bytes": 1, "freed_bytes": 1,
         "memory": {"trim": {"returned_bytes": 1}, "held_bytes": 1, "rss_after": 1},
         "survivor_packages": [{"package": "p", "loader_package": "p"}]},
    ]:
        m.observe(event)
    return {sample.name for family in prometheus_parser.text_string_to_metric_families(m.exposition()[0].decode())
            for sample in family.samples}


def test_the_rules_and_the_dashboard_ask_only_for_metrics_that_comfy_memx_exports():
    exported = every_family_exported()
    asked = metric_names(rules_text())
    for _, _, expr in dashboard_exprs():
        asked |= metric_names(expr)
    assert asked and asked <= exported, asked - exported


def test_dashboard_queries_are_valid_promql(tmp_path):
    """Every query, with Grafana's interval variables replaced, as a recording rule checked by promtool."""
    promtool = prom.find_binary("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (apt-get install prometheus)")
    lines = ["groups:", "  - name: dashboard", "    rules:"]
    for number, (_, _, expr) in enumerate(dashboard_exprs()):
        lines += [f"      - record: dashboard:query_{number}", f"        expr: {json.dumps(grafana_free(expr))}"]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(dashboard_exprs())} rules found" in done.stdout
