"""``python -m comfy_memx fleet``: where the shipped Prometheus rules and Grafana dashboard are, a scrape config that
uses them, and the rules rendered for another job selector, runbook address or thresholds.

::

    python -m comfy_memx fleet --rules-path
    python -m comfy_memx fleet --dashboard-path
    python -m comfy_memx fleet --scrape-config 10.0.0.5:8188 10.0.0.6:8188 [--metrics-path /memx/metrics]
    python -m comfy_memx fleet --rules [--job-selector 'job="gpu-box"'] [--runbook-base URL] [--set NAME=VALUE ...]
"""

import argparse
import sys

from comfy_memx import fleet
from comfy_memx.fleet import rules


def _parser():
    description = __doc__.split("\n\n")[0].replace("``", "")   # --help is plain text, not reStructuredText
    parser = argparse.ArgumentParser(prog="python -m comfy_memx fleet", description=description)
    parser.add_argument("--rules-path", action="store_true", help="print the path of the Prometheus rules file")
    parser.add_argument("--dashboard-path", action="store_true", help="print the path of the Grafana dashboard")
    parser.add_argument("--scrape-config", nargs="+", metavar="HOST:PORT",
                        help="print a prometheus.yml scrape job for these ComfyUI servers, named as the rules expect")
    parser.add_argument("--metrics-path", default="/metrics",
                        help="path scraped (/memx/metrics when another extension serves /metrics)")
    parser.add_argument("--rules", action="store_true",
                        help="print the rules file rendered with the options below (no options: the shipped file)")
    parser.add_argument("--job-selector", default=rules.SELECTOR,
                        help=f"label matcher of the ComfyUI scrape jobs in every rule (default: {rules.SELECTOR})")
    parser.add_argument("--runbook-base", default=rules.RUNBOOK_BASE,
                        help="absolute address of the runbooks page; each alert links to #<its name in lower case> "
                             f"(default: {rules.RUNBOOK_BASE})")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="thresholds",
                        help="change one threshold; sizes as 2GiB or bytes, durations as 10m, keep_firing=0 for a "
                             f"Prometheus older than 2.42 (defaults: {rules.defaults_text()})")
    return parser


def _rendered(parser, options):
    overrides = {}
    for item in options.thresholds:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set takes NAME=VALUE, not {item!r}")
        overrides[name.strip()] = value.strip()
    try:
        return rules.render(options.job_selector, options.runbook_base, overrides)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv=None):
    """Print what was asked for (both paths when nothing is asked); returns the exit status (2 for bad options)."""
    parser = _parser()
    options = parser.parse_args(argv)
    if options.rules:
        sys.stdout.write(_rendered(parser, options))
    if options.rules_path:
        print(fleet.rules_path())
    if options.dashboard_path:
        print(fleet.dashboard_path())
    if options.scrape_config:
        sys.stdout.write(fleet.scrape_config(options.scrape_config, options.metrics_path))
    if not (options.rules or options.rules_path or options.dashboard_path or options.scrape_config):
        print(f"rules:     {fleet.rules_path()}\ndashboard: {fleet.dashboard_path()}")
    return 0
