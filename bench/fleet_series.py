"""How many Prometheus series one ComfyUI server under comfy_memx costs a fleet: a real Prometheus scrapes the memx
server of a soak (``python -m bench.soak``, run unchanged) every second, and counts what it stored.

::

    python -m bench.fleet_series --comfyui PATH --python PY [--prompts 200] [--json OUT] [--keep]
                                 [-- extra bench.soak args]

Standard library only. ``prometheus`` comes from ``PATH`` (Debian's ``prometheus`` package) or
``$COMFY_MEMX_PROMETHEUS``. The soak runs with ``--no-plain`` (the comfy_memx server alone), ``--leak-mode strict``
unless the extra arguments say otherwise, and ``--port-base`` set to a free port that Prometheus scrapes
(``/metrics``, job ``comfyui``, with comfy_memx's alert rules loaded so that rule evaluation is part of the run).

Figures (printed, and written to ``--json``): distinct ``comfy_memx_*`` series Prometheus stored for the server over
the whole soak (every label set that ever appeared: the cost in the TSDB's head), the largest number of samples one
scrape returned (``scrape_samples_scraped``: the series of one scrape), and series per metric name. The soak's own
report goes next to ``--json`` (``<OUT>-soak.json``). The work folder (Prometheus's config and data) is removed at the
end unless ``--keep``. Exit status: the soak's (0 when it ran), 2 when Prometheus is missing or did not start.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench.harness import prom as prom_module

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def count_series(prom, job, start, end):
    """``{"distinct", "max_scrape_samples", "by_name"}`` of the comfy_memx series of ``job`` between two times."""
    series = prom.series(f'{{job="{job}",__name__=~"comfy_memx_.*"}}', start, end)
    by_name = {}
    for labels in series:
        by_name[labels["__name__"]] = by_name.get(labels["__name__"], 0) + 1
    span = max(1, int(end - start) + 1)
    scraped = prom.query(f'max_over_time(scrape_samples_scraped{{job="{job}"}}[{span}s])', at=end)
    return {"distinct": len(series), "max_scrape_samples": int(float(scraped[0]["value"][1])) if scraped else None,
            "by_name": dict(sorted(by_name.items(), key=lambda item: (-item[1], item[0])))}


def main(argv=None):
    """Run the soak under a scraping Prometheus; print and write the series figures; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comfyui", required=True, help="ComfyUI tree (folder with main.py)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs ComfyUI with comfy_memx")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (Prometheus config and data)")
    parser.add_argument("soak_args", nargs="*", help="more bench.soak arguments (after --)")
    options = parser.parse_args(argv)
    if prom_module.find_binary() is None:
        print("prometheus not found (apt-get install prometheus, or set COMFY_MEMX_PROMETHEUS)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="memx-fleet-series-")
    port = prom_module.free_port()
    rules = os.path.join(ROOT, "comfy_memx", "fleet", "alerts.yml")
    soak_args = list(options.soak_args)
    if "--leak-mode" not in soak_args:
        soak_args += ["--leak-mode", "strict"]
    soak_report = (os.path.abspath(os.path.splitext(options.json)[0]) + "-soak.json") if options.json \
        else os.path.join(work, "soak.json")
    python = os.path.abspath(options.python) if os.sep in options.python else options.python
    command = [sys.executable, "-m", "bench.soak", "--comfyui", os.path.abspath(options.comfyui), "--python", python,
               "--prompts", str(options.prompts), "--no-plain", "--port-base", str(port),
               "--json", soak_report] + soak_args
    try:
        with prom_module.PrometheusServer(os.path.join(work, "prometheus"), [f"127.0.0.1:{port}"], [rules]) as prom:
            if not prom.wait_ready(60):
                print(f"prometheus did not start: {prom.log_text()[-2000:]}", file=sys.stderr)
                return 2
            start = time.time()
            soak = subprocess.run(command, cwd=ROOT)   # python -m bench.soak from the checkout's root
            end = time.time()
            time.sleep(2.0)  # the last scrapes are committed
            figures = count_series(prom, prom_module.JOB, start, end)
    finally:
        if not options.keep:
            shutil.rmtree(work, ignore_errors=True)
    figures.update(prompts=options.prompts, soak_exit=soak.returncode, soak_command=command,
                   soak_report=soak_report if options.json else None, seconds=round(end - start, 1))
    print(f"\ncomfy_memx series of one server after {options.prompts} prompts: {figures['distinct']} distinct over "
          f"the run, at most {figures['max_scrape_samples']} samples in one scrape")
    for name, number in figures["by_name"].items():
        print(f"  {number:5d}  {name}")
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=2)
    return soak.returncode


if __name__ == "__main__":
    sys.exit(main())
