"""The shipped Grafana dashboard against Grafana's dashboard schema (the ``Dashboard`` type of the npm package
``@grafana/schema``, ``dist/types/raw/dashboard/x/types.gen.d.ts``), and its table panels against what Grafana's
table needs to show every series in one table.

No Grafana server can be installed here (it is published neither on npm nor on PyPI, and Debian does not package
it), so the board is checked two ways: the facts of the schema below, in Python, everywhere; and, where
``MEMX_GRAFANA_SCHEMA`` names a folder whose ``node_modules`` holds ``@grafana/schema`` and ``typescript``
(``npm install --prefix DIR @grafana/schema typescript``; ``.ci/run`` does), by TypeScript itself: the board as an
object literal of type ``Dashboard`` under ``tsc --strict``, which also refuses properties the schema does not know.
"""

import json
import os
import shutil
import subprocess

import pytest

from fleet_queries import data_panels, load_dashboard

# Facts of @grafana/schema's dashboard types (enums by value).
VARIABLE_TYPES = {"query", "adhoc", "groupby", "constant", "datasource", "interval", "textbox", "custom", "system",
                  "snapshot", "switch"}
DASHBOARD_KEYS = {"annotations", "description", "editable", "fiscalYearStartMonth", "gnetId", "graphTooltip", "id",
                  "links", "liveNow", "panels", "preload", "refresh", "revision", "schemaVersion", "snapshot", "tags",
                  "templating", "time", "timepicker", "timezone", "title", "uid", "version", "weekStart"}
PANEL_KEYS = {"autoMigrateFrom", "cacheTimeout", "datasource", "description", "fieldConfig", "gridPos",
              "hideTimeOverride", "id", "interval", "libraryPanel", "links", "maxDataPoints", "maxPerRow", "options",
              "pluginVersion", "queryCachingTTL", "repeat", "repeatDirection", "targets", "timeCompare", "timeFrom",
              "timeShift", "title", "transformations", "transparent", "type"}
ROW_KEYS = {"collapsed", "datasource", "gridPos", "id", "panels", "repeat", "title", "type"}
VARIABLE_KEYS = {"allValue", "allowCustomValue", "current", "datasource", "description", "enableGroupBy", "hide",
                 "includeAll", "label", "multi", "name", "options", "query", "refresh", "regex", "regexApplyTo",
                 "skipUrlSync", "sort", "staticOptions", "staticOptionsOrder", "type", "valuesFormat"}
CURSOR_SYNC = {0, 1, 2}
VARIABLE_HIDE = {0, 1, 2, 3}
VARIABLE_REFRESH = {0, 1, 2}
VARIABLE_SORT = set(range(9))


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_row(panel):
    if panel.get("type") != "row":
        return []
    if isinstance(panel.get("collapsed"), bool) and is_number(panel.get("id")) and isinstance(panel.get("panels"), list):
        return []
    return ["a row needs collapsed, id and panels"]


def check_grid_and_source(panel):
    problems = []
    grid = panel.get("gridPos", {})
    if set(grid) - {"h", "w", "x", "y", "static"} or not all(is_number(grid.get(key)) for key in "hwxy"):
        problems.append(f"gridPos {grid}")
    if "datasource" in panel and not all(isinstance(v, str) for v in panel["datasource"].values()):
        problems.append("datasource ref is not {type, uid} strings")
    return problems


def check_queries(panel):
    problems = []
    if not all(isinstance(target, dict) for target in panel.get("targets", [])):
        problems.append("a target is not an object")
    for transformation in panel.get("transformations", []):
        if not isinstance(transformation.get("id"), str) or "options" not in transformation:
            problems.append(f"transformation {transformation} needs id and options")
    return problems


def check_field_config(panel):
    config = panel.get("fieldConfig")
    if config is None:
        return []
    if not (isinstance(config.get("defaults"), dict) and isinstance(config.get("overrides"), list)):
        return ["fieldConfig needs defaults and overrides"]
    return [f"override {override}" for override in config["overrides"]
            if not isinstance(override.get("matcher", {}).get("id"), str)
            or not all(isinstance(item.get("id"), str) for item in override.get("properties", []))]


def check_panel(panel):
    """Problems of one panel (a Panel or a RowPanel of the schema), as text."""
    keys = ROW_KEYS if panel.get("type") == "row" else PANEL_KEYS
    problems = [f"unknown property {key}" for key in set(panel) - keys]
    if not isinstance(panel.get("type"), str):
        problems.append("type is not a string")
    return (problems + check_row(panel) + check_grid_and_source(panel) + check_queries(panel)
            + check_field_config(panel))


def check_variable(variable):
    problems = [f"unknown property {key}" for key in set(variable) - VARIABLE_KEYS]
    if not isinstance(variable.get("name"), str) or variable.get("type") not in VARIABLE_TYPES:
        problems.append("a variable needs a name and a known type")
    for option in [variable["current"]] if "current" in variable else []:
        if not ("text" in option and "value" in option):
            problems.append("current needs text and value")
    for key, allowed in (("hide", VARIABLE_HIDE), ("refresh", VARIABLE_REFRESH), ("sort", VARIABLE_SORT)):
        if key in variable and variable[key] not in allowed:
            problems.append(f"{key} {variable[key]!r}")
    return problems


def schema_problems(dashboard):
    """Every way ``dashboard`` departs from the facts of Grafana's Dashboard type, as text (empty: none)."""
    problems = [f"unknown property {key}" for key in set(dashboard) - DASHBOARD_KEYS]
    if not is_number(dashboard.get("schemaVersion")):
        problems.append("schemaVersion is required and a number")
    if dashboard.get("graphTooltip", 0) not in CURSOR_SYNC:
        problems.append("graphTooltip")
    time = dashboard.get("time", {"from": "", "to": ""})
    if not (isinstance(time.get("from"), str) and isinstance(time.get("to"), str)):
        problems.append("time needs from and to")
    for panel in dashboard.get("panels", []):
        problems += [f"panel {panel.get('id')}: {p}" for p in check_panel(panel)]
        for inner in panel.get("panels", []):
            problems += [f"panel {inner.get('id')}: {p}" for p in check_panel(inner)]
    for variable in dashboard.get("templating", {}).get("list", []):
        problems += [f"variable {variable.get('name')}: {p}" for p in check_variable(variable)]
    return problems


def test_the_board_meets_the_facts_of_grafanas_dashboard_schema():
    assert schema_problems(load_dashboard()) == []


def test_the_schema_facts_catch_what_grafana_refuses():
    board = load_dashboard()
    broken = json.loads(json.dumps(board))
    broken["__inputs"] = []
    broken["templating"]["list"][0]["current"] = {}
    broken["panels"][0].pop("collapsed")
    broken["panels"][1]["gridPos"] = {"h": 8, "w": "12", "x": 0, "y": 1}
    del broken["schemaVersion"]
    assert len(schema_problems(broken)) == 5


def test_table_panels_show_every_series_in_one_table():
    tables = [panel for panel in data_panels(load_dashboard()) if panel["type"] == "table"]
    assert len(tables) >= 4
    for panel in tables:
        for target in panel["targets"]:
            # Grafana's table shows one frame; a time-series answer is one frame per series (a selector to pick)
            assert target.get("format") == "table" and target.get("instant") is True, (panel["title"], target)
        ids = [transformation["id"] for transformation in panel.get("transformations", [])]
        if len(panel["targets"]) > 1:
            assert ids and ids[0] == "merge", panel["title"]   # one row per server across the queries
        assert "labelsToFields" not in ids, panel["title"]


def test_panels_show_counts_and_bytes_in_their_own_units():
    for panel in data_panels(load_dashboard()):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
        exprs = " ".join(target["expr"] for target in panel["targets"])
        if "survivor_models" in exprs or "last_free_survivors{" in exprs:
            assert unit == "short", panel["title"]
        if unit == "bytes":
            assert "survivors" not in exprs.replace("survivor_bytes", ""), panel["title"]


def schema_folder():
    folder = os.environ.get("MEMX_GRAFANA_SCHEMA")
    if not folder:
        pytest.skip("MEMX_GRAFANA_SCHEMA is not set (a folder with node_modules/@grafana/schema and typescript)")
    tsc = os.path.join(folder, "node_modules", ".bin", "tsc")
    if not (os.path.isfile(tsc) and os.path.isdir(os.path.join(folder, "node_modules", "@grafana", "schema"))
            and shutil.which("node")):
        pytest.skip(f"{folder} has no node_modules/@grafana/schema and typescript, or node is missing")
    return folder, tsc


def type_check(folder, tsc, dashboard, name):
    source = os.path.join(folder, f"{name}.ts")
    with open(source, "w", encoding="utf-8") as handle:
        handle.write('import type { Dashboard } from "@grafana/schema";\n'
                     f"export const board: Dashboard = {json.dumps(dashboard, indent=1)};\n")
    return subprocess.run([tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext",
                           "--target", "es2020", source], capture_output=True, text=True, timeout=300, cwd=folder)


def test_the_board_type_checks_as_a_grafana_dashboard():
    folder, tsc = schema_folder()
    board = load_dashboard()
    done = type_check(folder, tsc, board, "memx_board")
    assert done.returncode == 0, done.stdout + done.stderr
    board["templating"]["list"][0]["current"] = {}   # what Grafana's schema refuses, so the check can fail
    done = type_check(folder, tsc, board, "memx_board_broken")
    assert done.returncode != 0 and "VariableOption" in done.stdout, done.stdout + done.stderr
