"""The fleet dashboard's queries, read outside Grafana, and the shipped alert names: shared by the offline fleet
tests (tests/unit/test_fleet_files.py, test_fleet_rules.py) and the end-to-end one (tests/real/test_fleet_e2e.py)."""

import json
import re
from pathlib import Path

from comfy_memx import fleet

# Grafana's built-in interval variables, replaced by a fixed window to check or run a query outside Grafana.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def alert_names():
    """The alert names of the shipped rules file, in order."""
    return re.findall(r"^\s*- alert: (\w+)\s*$", Path(fleet.rules_path()).read_text(encoding="utf-8"), re.M)


def load_dashboard():
    """The Grafana dashboard that comfy_memx ships, parsed."""
    with open(fleet.dashboard_path(), encoding="utf-8") as handle:
        return json.load(handle)


def data_panels(dashboard):
    """Every panel that queries (rows only group), with nested row panels included."""
    found = []
    for panel in dashboard["panels"]:
        found.extend(panel.get("panels", []))
        if panel["type"] != "row":
            found.append(panel)
    return found


def dashboard_exprs(dashboard=None):
    """``[(panel title, refId, expr)]`` of every target of the dashboard."""
    dashboard = dashboard or load_dashboard()
    return [(panel["title"], target["refId"], target["expr"]) for panel in data_panels(dashboard)
            for target in panel["targets"]]


def grafana_free(expr, variables=None):
    """``expr`` with Grafana's interval variables replaced by fixed windows (``$job``/``$instance`` stay: inside
    a regex matcher they are valid PromQL; pass ``variables`` to replace them too)."""
    for name, value in {**GRAFANA_VARIABLES, **(variables or {})}.items():
        expr = expr.replace(name, value)
    return expr
