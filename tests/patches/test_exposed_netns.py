"""The exposed surface from a real non-loopback address: the stand-in server under ``python -m comfy_memx`` listens on
0.0.0.0, and requests come from a network namespace of the test's own (``netns_helpers``).  The read routes and
``/memx/free`` answer as ComfyUI's own would; the holder search, ``/memx/free``'s searches and the hand-off
request need the token; the same calls from loopback need nothing."""

import os
import shutil
import signal
import subprocess
import sys
from urllib.parse import quote

import pytest

from bench.harness.waits import process_alive, wait_for_prompt, wait_for_server
from fake_comfy.loader import PACKS_DIR, shape_root
from netns_helpers import call_from, remote_namespace
from test_server_process import call, free_port

TOKEN = "remote-service-token-0123456789"


@pytest.fixture
def server(tmp_path):
    port = free_port()
    nodes_dir = tmp_path / "custom_nodes"
    shutil.copytree(os.path.join(PACKS_DIR, "leaky_pack"), nodes_dir / "leaky_pack")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
    env.update(FAKE_COMFY_CUSTOM_NODE_DIRS=str(nodes_dir), PYTHONUNBUFFERED="1", COMFY_MEMX_TOKEN=TOKEN,
               COMFY_MEMX_HANDOFF="host", XDG_RUNTIME_DIR=str(tmp_path))
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "comfy_memx", os.path.join(shape_root("0.27.0"), "main.py"),
                                    "--cpu", "--listen", "0.0.0.0", "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path))
    local = f"http://127.0.0.1:{port}"
    try:
        wait_for_server(local, process, log)
        yield port, local, process_alive(process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert "Traceback" not in log.read_text()


def leak(local, alive):
    for name, keep in (("a", True), ("b", False)):
        status, body = call("POST", local + "/prompt", {"prompt": {
            "1": {"class_type": "LeakyLoader", "inputs": {"name": name, "leak": keep}},
            "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}})
        assert status == 200, body
        wait_for_prompt(local, body["prompt_id"], alive)
    rows = call("GET", local + "/memx/models")[1]
    return next(r["model_id"] for r in rows if r["state"] == "leaked")


def test_guarded_routes_from_a_non_loopback_address_need_the_token(server):
    port, local, alive = server
    model_id = leak(local, alive)
    search = f"/memx/models/{quote(model_id, safe='')}/search"
    with remote_namespace() as (namespace, address, _there):
        remote = f"http://{address}:{port}"
        status, rows, _ = call_from(namespace, "GET", remote + "/memx/models")
        assert status == 200 and [r["model_id"] for r in rows if r["state"] == "leaked"] == [model_id]
        status, body, _ = call_from(namespace, "POST", remote + search)
        assert status == 403 and body["error"] == "forbidden" and model_id not in str(body)
        status, body, _ = call_from(namespace, "POST", remote + search, {"Authorization": "Bearer wrong-" + TOKEN})
        assert status == 403
        status, body, _ = call_from(namespace, "POST", remote + search, {"Authorization": "Bearer " + TOKEN})
        assert status == 200 and body["holders"]
        status, body, _ = call_from(namespace, "POST", remote + "/memx/handoff/request?bytes=10")
        assert status == 403
        status, body, _ = call_from(namespace, "POST", remote + "/memx/handoff",
                                    body={"bytes": 1, "device": "cpu", "from": 1})
        assert status == 403 and "device" not in body
        # The remote service that frees after each job: works without the token, searches with it.
        status, receipt, _ = call_from(namespace, "POST", remote + "/memx/free?timeout=60",
                                       body={"unload_models": True, "free_memory": True})
        assert status == 200 and receipt["status"] == "done"
        assert receipt["survivors"] and all(s["holders"] is None for s in receipt["survivors"])
        status, receipt, _ = call_from(namespace, "POST", remote + "/memx/free?timeout=60",
                                       {"X-Memx-Token": TOKEN}, body={"unload_models": True, "free_memory": True})
        assert status == 200 and receipt["survivors"][0]["holders"]
        status, text, _ = call_from(namespace, "GET", remote + "/memx/models")
        assert _there not in str(text)                 # the caller's address is never shown
    status, body = call("POST", local + search)       # loopback needs nothing
    assert status == 200 and body["holders"]
