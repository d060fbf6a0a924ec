"""The Prometheus rules file rendered from its template: the job selector, the runbook links and every threshold
are set here, in one place, and ``alerts.yml`` (shipped) is the rendering with the defaults.

Thresholds on memory are fractions of ``comfy_memx_host_memory_bytes`` (what the server may use) with a byte
threshold beside each, and an alert fires above the lower of the two: a fraction alone says nothing on a large host
(2 % of 128 GiB is 2.6 GiB, more than one leaked SD1.5 UNet), bytes alone would page a small one for nothing.  An
operator who wants other numbers renders the file again (``python -m comfy_memx fleet --rules --set
leak_package_bytes=2GiB``) instead of editing expressions.

Failed scrapes: Prometheus marks every series of a target stale when one scrape fails, which empties an instant
query until the next good scrape and resets the ``for:`` of every pending alert.  Every rule therefore reads the
last sample within ``scrape_gap`` (``last_over_time``: a range never holds a stale marker), and every alert keeps
firing for ``keep_firing`` once its condition ends (``keep_firing_for``: Prometheus 2.42 or newer; ``--set
keep_firing=0`` renders the file without it for an older Prometheus, 2.26 at least for ``last_over_time``).
"""

import os
import re

from comfy_memx.core.units import format_bytes

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "alerts.template.yml")
SELECTOR = 'job=~"comfyui.*"'
# Where the runbooks live: the page that the server which raised the alert serves (``/memx/runbooks``, rendered from
# runbooks.md), one heading per alert whose id is the alert's name in lower case; Prometheus fills in the scrape
# address when the alert fires.  Alertmanager and Grafana show runbook_url as a link, so it must be absolute: a fleet
# that keeps its own copy of the page renders the file with --runbook-base https://<its copy>.
PER_SERVER = "{{$labels.instance}}"
RUNBOOK_BASE = "http://" + PER_SERVER + "/memx/runbooks"
SERVERLESS = ("comfymemxabsent",)   # alerts without an instance label: their description says what to do

GIB = 1024 ** 3
MIB = 1024 ** 2
THRESHOLDS = {
    "leak_package_fraction": 0.02,     # leaked weights held by one package, of the server's memory (warning) ...
    "leak_package_bytes": GIB,         # ... or this many bytes, whichever is lower
    "leak_total_fraction": 0.05,       # leaked weights of all packages together (warning) ...
    "leak_total_bytes": 4 * GIB,       # ... or this many bytes, whichever is lower
    "leak_critical_fraction": 0.2,     # leaked weights of all packages together (critical)
    "new_leak_window": "15m",          # a rooted leak found this recently pages (ComfyMemxRootedLeak)
    "rss_growth_fraction": 0.01,       # unexplained RSS growth per hour over the long fit, of the memory (warning) ...
    "rss_growth_bytes": 512 * MIB,     # ... or this many bytes per hour, whichever is lower
    "rss_window": "2h",                # the window of the long growth fit
    "rss_warmup": "30m",               # start-up left out of the long fit
    "rss_fast_growth_fraction": 0.05,  # unexplained RSS growth per hour over the short fit (a fast leak) ...
    "rss_fast_growth_bytes": 4 * GIB,  # ... or this many bytes per hour, whichever is lower
    "rss_fast_window": "15m",          # the window of the short fit (also the alert's for:, so one step never fires)
    "rss_fast_warmup": "10m",          # start-up left out of the short fit
    "rss_floor_window": "5m",          # the fits read the lowest unexplained RSS over this window (no load spikes)
    "rss_critical_fraction": 0.9,      # resident memory of the process, of the server's memory (critical)
    "reload_seconds": 300,             # seconds per hour reloading what unloads moved away (warning)
    "pin_cap_fraction": 0.9,           # pinned memory, of comfy_memx's pin cap (warning)
    "scrape_gap": "2m",                # the longest run of failed scrapes that changes no alert
    "keep_firing": "5m",               # how long an alert keeps firing after its condition ends (0: no keep_firing_for)
}
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?$")
_UNIT_BYTES = {None: 1, "B": 1, "KiB": 1024, "MiB": MIB, "GiB": GIB, "TiB": 1024 * GIB}


def seconds(duration):
    """Seconds of a Prometheus duration of one unit (``90m``, ``3h``; ``0`` is 0); ValueError for anything else."""
    if str(duration) == "0":
        return 0
    match = _DURATION.match(str(duration))
    if match is None:
        raise ValueError(f"not a duration like 30m or 3h: {duration!r}")
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def size(name, value):
    """Bytes of a size given as a number or with a binary unit (``1GiB``, ``512MiB``); ValueError naming ``name``
    for anything else or for 0."""
    match = _SIZE.match(str(value).strip())
    number = float(match.group(1)) * _UNIT_BYTES[match.group(2)] if match else 0
    if number < 1:
        raise ValueError(f"{name} must be a size like 1GiB, 512MiB or a number of bytes, not {value!r}")
    return int(number)


def _fraction(name, value):
    number = float(value)
    if not 0 < number <= 1:
        raise ValueError(f"{name} must be a fraction in (0, 1], not {value!r}")
    return number


def _percent(fraction):
    return f"{fraction * 100:g} %"


def _size_text(nbytes):
    return format_bytes(nbytes).replace(".0 ", " ")


def defaults_text():
    """Every threshold with its default, as ``--set`` takes them (``leak_package_bytes=1GiB, ...``)."""
    return ", ".join(f"{name}={_size_text(value).replace(' ', '') if name.endswith('_bytes') else value}"
                     for name, value in THRESHOLDS.items())


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
        elif name.endswith("_bytes"):
            values[name] = size(name, values[name])
        elif isinstance(THRESHOLDS[name], str):
            values[name] = str(values[name])
            if seconds(values[name]) == 0 and name != "keep_firing":
                raise ValueError(f"{name} must be a duration above 0, like 30m or 3h")
    values["reload_seconds"] = int(values["reload_seconds"])
    if values["reload_seconds"] <= 0:
        raise ValueError("reload_seconds must be positive")
    return values


def _placeholders(selector, runbook_base, values):
    """The template's ``@NAME@`` placeholders and their text."""
    settled = {"RSS_SETTLED_S": ("rss_window", "rss_floor_window", "rss_warmup"),
               "RSS_FAST_SETTLED_S": ("rss_fast_window", "rss_floor_window", "rss_fast_warmup")}
    table = {"SELECTOR": selector, "SELECTOR_TEXT": selector.replace("\\", "\\\\").replace('"', '\\"'),
             "RUNBOOK_BASE": runbook_base, "RELOAD_SECONDS": str(values["reload_seconds"]),
             "NEW_LEAK_S": str(seconds(values["new_leak_window"]))}
    for name, parts in settled.items():
        table[name] = str(sum(seconds(values[part]) for part in parts))
    for name, value in values.items():
        stem = name.upper()
        if name.endswith("_fraction"):
            table[stem] = f"{value:g}"
            table[stem[:-len("_FRACTION")] + "_PERCENT"] = _percent(value)
        elif name.endswith("_bytes"):
            table[stem] = str(value)
            table[stem + "_TEXT"] = _size_text(value)
        elif isinstance(value, str):
            table[stem] = value
    return table


def render(selector=SELECTOR, runbook_base=RUNBOOK_BASE, overrides=None):
    """The rules file (text) for scrape jobs matched by ``selector`` (a PromQL label matcher such as
    ``job="comfyui"``), with runbook links under ``runbook_base`` (an absolute http(s) address) and the thresholds
    ``overrides`` changes; the defaults render the shipped ``alerts.yml`` byte for byte."""
    if not selector.strip() or "{" in selector or "}" in selector:
        raise ValueError(f"a label matcher such as job=\"comfyui\" is expected, not {selector!r}")
    if not re.match(r"^https?://[^/\s#]+", runbook_base) or any(c.isspace() or c == '"' for c in runbook_base):
        raise ValueError(f"the runbook base must be an absolute http(s) address (Alertmanager shows it as a link), "
                         f"such as {RUNBOOK_BASE}, not {runbook_base!r}")
    values = checked_thresholds(overrides)
    table = _placeholders(selector.strip(), runbook_base.rstrip("#"), values)
    with open(TEMPLATE, encoding="utf-8") as handle:
        text = handle.read()
    rendered = re.sub(r"@([A-Z_]+)@", lambda match: table[match.group(1)], text)
    if seconds(values["keep_firing"]) == 0:   # for a Prometheus older than 2.42, which refuses the field
        rendered = re.sub(r"^ *keep_firing_for: .*\n", "", rendered, flags=re.M)
    if PER_SERVER in runbook_base:   # no server is left to serve the runbook of an alert that has no instance
        rendered = re.sub(r"^ *runbook_url: .*#(%s)\"\n" % "|".join(SERVERLESS), "", rendered, flags=re.M)
    return rendered
