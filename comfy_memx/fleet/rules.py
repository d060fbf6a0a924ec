"""The Prometheus rules file rendered from its template: the job selector, the runbook links and every threshold
are set here, in one place, and ``alerts.yml`` (shipped) is the rendering with the defaults.

Thresholds on memory are fractions of ``comfy_memx_host_memory_bytes`` (what the server may use), so one rendering
fits small and large hosts; an operator who wants other numbers renders the file again (``python -m comfy_memx fleet
--rules --set leak_package_fraction=0.05``) instead of editing expressions."""

import os
import re

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "alerts.template.yml")
SELECTOR = 'job=~"comfyui.*"'
# Where the runbooks live: the operations page of the documentation, one heading per alert (the anchor is the
# alert's name in lower case).  The project has no public address yet, so the default is the page's path in the
# repository; a fleet renders its own with --runbook-base https://<its copy>/docs/operations.md.
RUNBOOK_BASE = "docs/operations.md"

THRESHOLDS = {
    "leak_package_fraction": 0.02,    # leaked weights held by one package, of the server's memory (warning)
    "leak_total_fraction": 0.05,      # leaked weights of all packages together (warning)
    "leak_critical_fraction": 0.2,    # leaked weights of all packages together (critical)
    "rss_growth_fraction": 0.01,      # unexplained RSS growth per hour, of the server's memory (warning)
    "rss_critical_fraction": 0.9,     # resident memory of the process, of the server's memory (critical)
    "rss_window": "3h",               # the window of the growth fit
    "rss_warmup": "1h",               # start-up left out of the growth fit
    "reload_seconds": 300,            # seconds per hour reloading what unloads moved away (warning)
    "pin_cap_fraction": 0.9,          # pinned memory, of comfy_memx's pin cap (warning)
}
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(duration):
    """Seconds of a Prometheus duration of one unit (``90m``, ``3h``); ValueError for anything else."""
    match = _DURATION.match(str(duration))
    if match is None:
        raise ValueError(f"not a duration like 30m or 3h: {duration!r}")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _fraction(name, value):
    number = float(value)
    if not 0 < number <= 1:
        raise ValueError(f"{name} must be a fraction in (0, 1], not {value!r}")
    return number


def _percent(fraction):
    return f"{fraction * 100:g} %"


def checked_thresholds(overrides=None):
    """The default thresholds with ``overrides`` (a mapping, values as numbers or text) applied and checked:
    ValueError names an unknown threshold or a value out of range."""
    values = dict(THRESHOLDS)
    for name, value in (overrides or {}).items():
        if name not in THRESHOLDS:
            raise ValueError(f"unknown threshold {name!r}; known: {', '.join(THRESHOLDS)}")
        values[name] = value
    for name in THRESHOLDS:
        if name.endswith("_fraction"):
            values[name] = _fraction(name, values[name])
    seconds(values["rss_window"]), seconds(values["rss_warmup"])
    values["reload_seconds"] = int(values["reload_seconds"])
    if values["reload_seconds"] <= 0:
        raise ValueError("reload_seconds must be positive")
    return values


def _placeholders(selector, runbook_base, values):
    """The template's ``@NAME@`` placeholders and their text."""
    window, warmup = values["rss_window"], values["rss_warmup"]
    table = {"SELECTOR": selector, "SELECTOR_TEXT": selector.replace("\\", "\\\\").replace('"', '\\"'),
             "RUNBOOK_BASE": runbook_base, "RSS_WINDOW": window, "RSS_WARMUP": warmup,
             "RSS_SETTLED_S": str(seconds(window) + seconds(warmup)),
             "RELOAD_SECONDS": str(values["reload_seconds"])}
    for name in THRESHOLDS:
        if name.endswith("_fraction"):
            stem = name[:-len("_fraction")].upper()
            table[f"{stem}_FRACTION"] = f"{values[name]:g}"
            table[f"{stem}_PERCENT"] = _percent(values[name])
    return table


def render(selector=SELECTOR, runbook_base=RUNBOOK_BASE, overrides=None):
    """The rules file (text) for scrape jobs matched by ``selector`` (a PromQL label matcher such as
    ``job="comfyui"``), with runbook links under ``runbook_base`` and the thresholds ``overrides`` changes; the
    defaults render the shipped ``alerts.yml`` byte for byte."""
    if not selector.strip() or "{" in selector or "}" in selector:
        raise ValueError(f"a label matcher such as job=\"comfyui\" is expected, not {selector!r}")
    table = _placeholders(selector.strip(), runbook_base.rstrip("#"), checked_thresholds(overrides))
    with open(TEMPLATE, encoding="utf-8") as handle:
        text = handle.read()
    rendered = re.sub(r"@([A-Z_]+)@", lambda match: table[match.group(1)], text)
    return rendered
