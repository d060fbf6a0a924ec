"""``python -m comfy_memx fleet``: where the shipped Prometheus rules and Grafana dashboard are, and a scrape
config that uses them.

::

    python -m comfy_memx fleet --rules-path
    python -m comfy_memx fleet --dashboard-path
    python -m comfy_memx fleet --scrape-config 10.0.0.5:8188 10.0.0.6:8188 [--metrics-path /memx/metrics]
"""

import argparse
import sys

from comfy_memx import fleet


def main(argv=None):
    """Print the asked-for path or scrape config (both paths when nothing is asked); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m comfy_memx fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rules-path", action="store_true", help="print the path of the Prometheus rules file")
    parser.add_argument("--dashboard-path", action="store_true", help="print the path of the Grafana dashboard")
    parser.add_argument("--scrape-config", nargs="+", metavar="HOST:PORT",
                        help="print a prometheus.yml fragment scraping these ComfyUI servers with the rules loaded")
    parser.add_argument("--metrics-path", default="/metrics",
                        help="path scraped (/memx/metrics when another extension serves /metrics)")
    options = parser.parse_args(argv)
    if options.rules_path:
        print(fleet.rules_path())
    if options.dashboard_path:
        print(fleet.dashboard_path())
    if options.scrape_config:
        sys.stdout.write(fleet.scrape_config(options.scrape_config, options.metrics_path))
    if not (options.rules_path or options.dashboard_path or options.scrape_config):
        print(f"rules:     {fleet.rules_path()}\ndashboard: {fleet.dashboard_path()}")
    return 0
