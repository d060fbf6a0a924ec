"""Files for fleets of ComfyUI servers: Prometheus alert rules (``alerts.yml``) and a Grafana dashboard
(``dashboard.json``), shipped inside the package so that an installed comfy_memx can say where they are
(``python -m comfy_memx fleet``).  Nothing here imports torch, ComfyUI or prometheus_client."""

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))
RULES = "alerts.yml"
DASHBOARD = "dashboard.json"
FILES = (RULES, DASHBOARD)
JOB = "comfyui"  # the scrape job name the rules select (job=~"comfyui.*")


def path(name=RULES):
    """Absolute path of one shipped file (``alerts.yml`` or ``dashboard.json``); ValueError for another name."""
    if name not in FILES:
        raise ValueError(f"unknown fleet file {name!r}; expected one of {', '.join(FILES)}")
    return os.path.join(FOLDER, name)


def rules_path():
    """Absolute path of the Prometheus rules file."""
    return path(RULES)


def dashboard_path():
    """Absolute path of the Grafana dashboard JSON."""
    return path(DASHBOARD)


def scrape_config(targets, metrics_path="/metrics", interval="15s", job=JOB, timeout="10s"):
    """A prometheus.yml fragment (text) that scrapes ``targets`` (``host:port`` of ComfyUI servers) under the job
    name the rules select, each scrape given ``timeout`` (``/metrics`` answers in milliseconds; a host short of
    memory can slow it to seconds, and a scrape that times out marks every series stale, which the rules bridge
    for 2 minutes).  It names no rules file: the rules are copied where prometheus.yml's ``rule_files``
    looks (docs/operations.md, Fleets), since a path into this Python environment moves with every upgrade and would load
    the rules a second time next to the copy."""
    listed = ", ".join(f'"{target}"' for target in targets)
    return (f"scrape_configs:\n"
            f"  - job_name: {job}\n"
            f"    scrape_interval: {interval}\n"
            f"    scrape_timeout: {timeout}\n"
            f"    metrics_path: {metrics_path}\n"
            f"    static_configs:\n"
            f"      - targets: [{listed}]\n")
