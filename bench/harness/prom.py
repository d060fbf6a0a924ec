"""A real Prometheus on loopback for tests and benchmarks: its own config, data folder and port, queried through its
HTTP API.

Standard library only (like ``drive.py``, next to it). ``prometheus`` is the server binary (Debian's ``prometheus``
package installs it, with ``promtool``); :func:`find_binary` looks it up on ``PATH`` unless
``COMFY_MEMX_PROMETHEUS`` names one.

Example::

    with PrometheusServer(out_dir, targets=["127.0.0.1:8188"], rule_files=[rules]) as prom:
        prom.wait_ready(60)
        prom.query('comfy_memx_info')      # [{"metric": {...}, "value": [time, "1"]}, ...]
        prom.alerts()                      # [{"labels": {...}, "state": "firing", ...}, ...]
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request

from bench.harness import waits

HOST = "127.0.0.1"
BINARY_ENV = "COMFY_MEMX_PROMETHEUS"
JOB = "comfyui"


def find_binary(name="prometheus"):
    """The path of the ``prometheus`` (or ``promtool``) binary: ``$COMFY_MEMX_PROMETHEUS``'s folder first for
    promtool, else ``PATH``; None when absent."""
    named = os.environ.get(BINARY_ENV)
    if named:
        candidate = named if name == "prometheus" else os.path.join(os.path.dirname(named), name)
        return candidate if os.path.isfile(candidate) and os.access(candidate, os.X_OK) else None
    return shutil.which(name)


def free_port():
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def config_text(targets, rule_files=(), interval="1s", metrics_path="/metrics", job=JOB):
    """A Prometheus configuration (JSON is YAML): one scrape job over ``targets``, scraped and evaluated every
    ``interval``, with ``rule_files`` loaded."""
    return json.dumps({
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [os.path.abspath(path) for path in rule_files],
        "scrape_configs": [{"job_name": job, "metrics_path": metrics_path,
                            "static_configs": [{"targets": list(targets)}]}],
    }, indent=2)


class PrometheusServer:
    """One Prometheus process on 127.0.0.1 and a free port, with its config and TSDB under ``out``."""

    def __init__(self, out, targets, rule_files=(), interval="1s", metrics_path="/metrics", binary=None,
                 job=JOB):
        self.out = os.path.abspath(out)
        os.makedirs(self.out, exist_ok=True)
        self.binary = binary or find_binary()
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.config_path = os.path.join(self.out, "prometheus.yml")
        with open(self.config_path, "w", encoding="utf-8") as handle:
            handle.write(config_text(targets, rule_files, interval, metrics_path, job))
        self.log_path = os.path.join(self.out, "prometheus.log")
        self.process = None

    def start(self):
        """Start the server; its output goes to ``prometheus.log``."""
        argv = [self.binary, f"--config.file={self.config_path}", f"--storage.tsdb.path={self.out}/data",
                f"--web.listen-address={HOST}:{self.port}", "--storage.tsdb.retention.time=1d",
                "--log.level=warn"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, cwd=self.out, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self):
        """True while the process runs."""
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, timeout=60.0):
        """Poll ``/-/ready`` until it answers 200 (True); False when the process exits or its log did not grow for
        ``timeout`` seconds (a slow start that keeps logging is waited for)."""
        try:
            return waits.wait_until(lambda: self._get("/-/ready", raw=True)[0] == 200, self.alive,
                                    waits.log_size(self.log_path), "Prometheus to be ready", timeout, poll_s=0.2)
        except waits.WaitFailed:
            return False

    def _get(self, path, params=None, raw=False, timeout=10.0):
        url = self.url + path + ("?" + urllib.parse.urlencode(params, doseq=True) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, body = error.code, error.read()
        except (urllib.error.URLError, OSError) as error:
            return 0, str(error)
        text = body.decode("utf-8", "replace")
        if raw:
            return status, text
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def api(self, path, **params):
        """``GET /api/v1/<path>``; returns its ``data``, raises RuntimeError with the answer when not a success."""
        status, body = self._get("/api/v1/" + path, params)
        if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            raise RuntimeError(f"/api/v1/{path} {params}: HTTP {status}: {str(body)[:500]}")
        return body["data"]

    def query(self, expr, at=None):
        """The instant vector (or scalar) of ``expr`` now or at ``at`` (Unix seconds): the API's ``result``."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.api("query", **params)["result"]

    def query_range(self, expr, start, end, step=1.0):
        """The range vectors of ``expr`` between ``start`` and ``end`` (Unix seconds), one point per ``step``."""
        return self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")["result"]

    def alerts(self):
        """Active alerts (pending and firing) as the API lists them."""
        return self.api("alerts")["alerts"]

    def rules(self):
        """The loaded rule groups with their health (``/api/v1/rules``)."""
        return self.api("rules")["groups"]

    def series(self, match, start, end):
        """Every series matching ``match`` that had samples between ``start`` and ``end`` (Unix seconds)."""
        return self.api("series", **{"match[]": match, "start": f"{start:.3f}", "end": f"{end:.3f}"})

    def targets(self):
        """The active scrape targets with their health and last error."""
        return self.api("targets")["activeTargets"]

    def stop(self, grace=10.0):
        """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5.0)
            except ProcessLookupError:
                pass
        return self.process.poll()

    def log_text(self):
        """What the server logged (warnings and errors)."""
        try:
            with open(self.log_path, "rb") as handle:
                return handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
