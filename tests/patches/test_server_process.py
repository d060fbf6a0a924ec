"""Every route from a real aiohttp server: the stand-in main.py started by ``python -m comfy_memx`` on 127.0.0.1,
queried over HTTP, and ``python -m comfy_memx free`` against it."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from bench.harness.waits import process_alive, wait_for_prompt, wait_for_server
from fake_comfy.loader import PACKS_DIR, shape_root

VERSIONS = ["0.27.0"]   # both shapes are served in-process by test_routes.py
HOST = "127.0.0.1"


def free_port():
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def call(method, url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw, kind = response.status, response.read(), response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get("Content-Type", "")
    text = raw.decode()
    return status, (json.loads(text) if "json" in kind else text)


class Server:
    def __init__(self, version, tmp_path):
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        nodes_dir = tmp_path / version / "custom_nodes"
        shutil.copytree(os.path.join(PACKS_DIR, "leaky_pack"), nodes_dir / "leaky_pack")
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
        env.update(FAKE_COMFY_CUSTOM_NODE_DIRS=str(nodes_dir), PYTHONUNBUFFERED="1")
        self.log = tmp_path / f"server-{version}.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "comfy_memx", "--leak-mode", "report",
                 os.path.join(shape_root(version), "main.py"), "--cpu", "--listen", HOST, "--port", str(self.port)],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path))

    def wait_ready(self):
        wait_for_server(self.url, self.process, self.log)

    def run(self, prompt):
        status, body = call("POST", self.url + "/prompt", {"prompt": prompt})
        assert status == 200, body
        prompt_id = body["prompt_id"]
        entry = wait_for_prompt(self.url, prompt_id, process_alive(self.process), self.log)
        assert entry["status"]["status_str"] == "success", entry
        return prompt_id

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.log.read_text()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The stand-ins, started when the module starts."""
    tmp_path = tmp_path_factory.mktemp("served")
    started = {version: Server(version, tmp_path) for version in VERSIONS}
    yield started
    for server in started.values():
        server.stop()


def leaky(name, leak=False):
    return {"1": {"class_type": "LeakyLoader", "inputs": {"name": name, "leak": leak}},
            "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_route_from_a_served_stand_in(servers, version):
    server = servers[version]
    server.wait_ready()
    assert call("GET", server.url + "/memx/models") == (200, [])
    server.run(leaky("a", leak=True))
    server.run(leaky("b"))

    status, rows = call("GET", server.url + "/memx/models")
    assert status == 200 and sorted(r["state"] for r in rows) == ["leaked", "loaded"]
    assert {r["owner"]["package"] for r in rows} == {"leaky_pack"}
    assert all(sum(r["bytes_by_device"].values()) == r["bytes"] for r in rows)

    for path in ("/metrics", "/memx/metrics", "/api/metrics"):
        status, text = call("GET", server.url + path)
        assert status == 200 and 'comfy_memx_loads_total{package="leaky_pack"} 2.0' in text
        assert ('comfy_memx_leaks_total{found_by="comfyui_warning",loader_package="leaky_pack",package="leaky_pack",'
                'stage="rooted"}') in text

    cli = subprocess.run([sys.executable, "-m", "comfy_memx", "free", "--url", server.url, "--timeout", "30"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1, cli.stderr
    assert "freed 1 model(s)" in cli.stdout and "survivors: 1 model(s)" in cli.stdout
    assert "held by leaky_pack.LeakyLoader._cache['a']  [package leaky_pack, class_attribute]" in cli.stdout

    status, receipt = call("POST", server.url + "/api/memx/free?timeout=30", {"unload_models": True})
    assert status == 200 and receipt["status"] == "done" and receipt["freed"] == []
    assert [s["reason"] for s in receipt["survivors"]] == ["leaked"]
    assert call("POST", server.url + "/memx/free", {"free_memory": False})[1]["error"] == "nothing_to_free"

    log = server.stop()
    assert server.process.returncode is not None and "Traceback" not in log, log
    assert "patched" in log and "PromptServer.add_routes" in log
    assert f"To see the GUI go to: http://{HOST}:{server.port}" in log


def test_free_command_reports_an_unreachable_server():
    out = subprocess.run([sys.executable, "-m", "comfy_memx", "free", "--url", f"http://{HOST}:{free_port()}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "cannot reach" in out.stderr
