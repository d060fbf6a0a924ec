"""Handing the GPU over: idle unload and the host-wide hand-off, with real processes of the stand-in server."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from comfy_memx.core.state import STATE
from comfy_memx.core.hostshare import Peer
from comfy_memx.sharing import asking, handoff
from bench.harness.waits import no_progress, process_alive, wait_for_prompt, wait_for_server, wait_until
from fake_comfy.loader import PACKS_DIR, shape_root
from memx_helpers import memx_on, read_events
from test_server_process import HOST, call, free_port

SLEEPY = '''
import time


class Sleep:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seconds": ("FLOAT", {"default": 1.0})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "sleep"
    OUTPUT_NODE = True

    def sleep(self, seconds):
        time.sleep(seconds)
        return (0,)


NODE_CLASS_MAPPINGS = {"Sleep": Sleep}
'''


class Instance:
    """One stand-in ComfyUI 0.27.0 process started with COMFY_MEMX=1 and ``settings``."""

    def __init__(self, tmp_path, name, runtime_dir, listen=HOST, **settings):
        self.port = free_port()
        self.url = f"http://{listen}:{self.port}"
        nodes_dir = tmp_path / name / "custom_nodes"
        shutil.copytree(os.path.join(PACKS_DIR, "leaky_pack"), nodes_dir / "leaky_pack")
        (nodes_dir / "sleepy_pack").mkdir()
        (nodes_dir / "sleepy_pack" / "__init__.py").write_text(SLEEPY)
        self.events = tmp_path / name / "events.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
        env.update(FAKE_COMFY_CUSTOM_NODE_DIRS=str(nodes_dir), PYTHONUNBUFFERED="1", COMFY_MEMX="1",
                   COMFY_MEMX_EVENTS=str(self.events), XDG_RUNTIME_DIR=str(runtime_dir),
                   **{"COMFY_MEMX_" + key.upper(): str(value) for key, value in settings.items()})
        self.log = tmp_path / name / "server.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, os.path.join(shape_root("0.27.0"), "main.py"), "--cpu", "--listen", listen,
                 "--port", str(self.port)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path))
        self.pid = self.process.pid

    def wait_ready(self):
        wait_for_server(self.url, self.process, self.log)
        return self

    def queue(self, prompt):
        status, body = call("POST", self.url + "/prompt", {"prompt": prompt})
        assert status == 200, body
        return body["prompt_id"]

    def run(self, prompt):
        prompt_id = self.queue(prompt)
        entry = wait_for_prompt(self.url, prompt_id, process_alive(self.process), self.log)
        assert entry["status"]["status_str"] == "success", entry
        return prompt_id

    def wait_events(self, kind, count):
        """Wait (bounded by the server's life and the stall window) until ``count`` events of ``kind`` are written."""
        wait_until(lambda: len(self.events_of(kind)) >= count, process_alive(self.process), no_progress,
                   f"{count} {kind} event(s)")

    def states(self):
        return sorted(row["state"] for row in call("GET", self.url + "/memx/models")[1])

    def events_of(self, kind):
        return [e for e in read_events(self.events) if e["event"] == kind] if self.events.exists() else []

    def stop(self, kill=False):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.log.read_text()


def leaky(name):
    return {"1": {"class_type": "LeakyLoader", "inputs": {"name": name, "leak": False}},
            "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}


@pytest.fixture
def instances(tmp_path):
    started = []

    def start(name, listen=HOST, **settings):
        instance = Instance(tmp_path, name, tmp_path, listen, **settings)
        started.append(instance)
        return instance
    yield start
    for instance in started:
        instance.stop()


def test_an_idle_server_unloads_its_models_once_per_idle_period(instances):
    server = instances("idle", idle_unload=1).wait_ready()
    server.run(leaky("a"))
    assert server.states() == ["loaded"]
    server.wait_events("idle_unload", 1)
    [event] = server.events_of("idle_unload")
    assert event["status"] == "done" and event["freed_bytes"] > 0 and len(event["freed"]) == 1
    assert server.states() == ["offloaded"]             # unloaded by the worker; ComfyUI's cache keeps it
    [unload] = server.events_of("unload")
    assert unload["reason"] == "free_request"
    assert unload["requested_by"] == {"kind": "comfy_memx", "via": "idle_unload", "idle_s": 1.0}
    time.sleep(2.5)
    assert len(server.events_of("idle_unload")) == 1      # once per idle period
    server.run(leaky("b"))                                # a new prompt (and load) starts a new idle period
    server.wait_events("idle_unload", 2)
    assert len(server.events_of("idle_unload")) == 2
    assert "comfy_memx: the queue was idle for 1 s" in server.stop()


def test_an_instance_asks_its_idle_peer_and_both_record_the_handoff(instances):
    giver = instances("giver", handoff="host").wait_ready()
    asker = instances("asker", handoff="host").wait_ready()
    giver.run(leaky("a"))
    status, answer = call("POST", asker.url + "/memx/handoff/request?bytes=1000")
    assert status == 200 and answer["role"] == "requester" and answer["asked_bytes"] == 1000
    assert answer["peers_asked"] == [{"pid": giver.pid, "status": "done"}]
    [given] = answer["givers"]
    assert given["pid"] == giver.pid and given["freed_bytes"] > 0 and answer["freed_bytes"] == given["freed_bytes"]
    assert giver.states() == ["offloaded"]
    [requested] = asker.events_of("handoff")
    assert requested["role"] == "requester" and requested["givers"] == answer["givers"]
    [gave] = giver.events_of("handoff")
    assert gave["role"] == "giver" and gave["to"] == asker.pid and gave["freed_bytes"] == given["freed_bytes"]
    [unload] = giver.events_of("unload")
    assert unload["requested_by"] == {"kind": "comfy_memx", "via": "handoff", "peer": asker.pid}


def test_a_busy_peer_is_never_interrupted_and_a_crashed_one_is_ignored(instances):
    busy = instances("busy", handoff="host").wait_ready()
    crashed = instances("crashed", handoff="host").wait_ready()
    asker = instances("asker", handoff="host").wait_ready()
    busy.run(leaky("a"))
    crashed.stop(kill=True)
    sleeping = busy.queue({"9": {"class_type": "Sleep", "inputs": {"seconds": 4.0}}})
    time.sleep(0.5)
    status, answer = call("POST", asker.url + "/memx/handoff/request?bytes=1000")
    assert status == 200 and answer["freed_bytes"] == 0 and answer["givers"] == []
    assert answer["peers_asked"] == [{"pid": busy.pid, "status": "busy"}]   # the killed one is not asked
    wait_for_prompt(busy.url, sleeping, process_alive(busy.process), busy.log)   # the whole busy period
    assert busy.events_of("unload") == [] and busy.events_of("handoff") == []


def test_a_load_short_of_device_memory_asks_the_peers_first(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with memx_on("0.27.0", handoff="host", events=tmp_path / "events.jsonl") as mm:
        handoff.start(1)
        asked = []

        def answer(peer, body, deadline):
            asked.append((peer.data["url"], body["bytes"], body["device"]))
            return {"status": "done", "freed_bytes": body["bytes"], "freed": ["BaseModel#7"]}
        monkeypatch.setattr(asking, "ask", answer)
        monkeypatch.setattr(handoff.part().registry, "peers", lambda: {
            4242: Peer(4242, 0, {"device": handoff.part().device, "url": "http://127.0.0.1:9", "held_bytes": 2 ** 40}),
            4343: Peer(4343, 0, {"device": "cuda:other", "url": "http://127.0.0.1:10", "held_bytes": 2 ** 40})})
        from fake_comfy.loader import make_patcher
        small = make_patcher(tensor_count=2, tensor_numel=1024)
        mm.load_models_gpu([small])
        assert asked == []                                # room enough: nobody is asked
        mm.SIM_VRAM_TOTAL = int(mm.minimum_inference_memory() + 4096)
        big = make_patcher(tensor_count=4, tensor_numel=4096)
        mm.load_models_gpu([big])
        [(url, nbytes, device)] = asked                   # only the peer on the same device
        assert url == "http://127.0.0.1:9" and device == handoff.part().device == "cuda:0"
        assert nbytes >= big.model_size() + handoff.RESERVE_BYTES - 4096
        [event] = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "handoff"]
        assert event["role"] == "requester" and event["reason"] == "load" and event["freed_bytes"] == nbytes
        assert event["givers"] == [{"pid": 4242, "freed_bytes": nbytes, "freed": ["BaseModel#7"]}]
        assert STATE.config.handoff == "host"


def test_a_squatter_on_the_loopback_port_of_an_instance_listening_elsewhere_is_never_asked(instances):
    from peer_helpers import LIAR_ANSWER, fake_peer
    elsewhere = instances("elsewhere", listen="127.0.0.2", handoff="host").wait_ready()
    other = instances("other", handoff="host").wait_ready()
    asker = instances("asker", handoff="host").wait_ready()
    elsewhere.run(leaky("a"))
    other.run(leaky("b"))
    squatter = fake_peer(port=elsewhere.port)      # another user binds 127.0.0.1:<its port>
    try:
        status, answer = call("POST", asker.url + "/memx/handoff/request?bytes=%d" % 2 ** 40)
    finally:
        squatter.shutdown()
    registry = json.loads((asker.events.parent.parent / "comfy_memx-instances-default.json").read_text())
    urls = {entry["pid"]: entry["data"]["url"] for entry in registry.values()}
    assert squatter.seen == [], squatter.seen                       # never asked: no secret, no nonce
    assert urls[elsewhere.pid] == elsewhere.url                     # the address it listens on
    assert status == 200 and LIAR_ANSWER["freed_bytes"] > answer["freed_bytes"] > 0, answer
    assert sorted(row["pid"] for row in answer["peers_asked"] if row["status"] == "done") == sorted(
        [elsewhere.pid, other.pid]), answer
    assert elsewhere.states() == other.states() == ["offloaded"]
