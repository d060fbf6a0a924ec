"""``python -m comfy_memx free``: the receipt as text, and its exit statuses, against a stub server."""

import contextlib
import http.server
import json
import socket
import threading

import pytest

from comfy_memx.cli import free as free_cmd

OWNER = {"prompt_id": "p", "node_id": "1", "class_type": "LeakyLoader", "package": "leaky_pack"}
FREED = {"model": "BaseModel", "model_id": "BaseModel#2", "unloaded_bytes": 16384, "device": "cuda:0",
         "bytes": 16384, "released": True, "owner": OWNER}
SURVIVOR = {"model": "BaseModel", "model_id": "BaseModel#1", "owner": OWNER, "bytes": 2 ** 20, "resident_bytes": 0,
            "reason": "leaked", "leak": {"stage": "rooted"},
            "holders": [{"path": "leaky_pack.LeakyLoader._cache['a']", "package": "leaky_pack",
                         "root_kind": "class_attribute", "pattern": "class_cache",
                         "suggestion": "cache per instance instead of on the class"}],
            "search": {"seconds": 0.1, "objects_visited": 4, "complete": True, "note": None}}


def receipt(**changes):
    base = {"status": "done", "worker": "done", "waited_s": 0.2,
            "request": {"unload_models": True, "free_memory": True}, "freed": [FREED], "freed_bytes": 16384,
            "released_bytes": 16384, "still_loaded": [], "survivors": [], "survivor_bytes": 0,
            "prompt_running_at_request": False}
    base.update(changes)
    return base


class Stub(http.server.BaseHTTPRequestHandler):
    answer = (200, b"{}")
    seen = []
    tokens = []

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        Stub.seen.append((self.path, json.loads(self.rfile.read(length))))
        Stub.tokens.append(self.headers.get("X-Memx-Token"))
        status, body = Stub.answer
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    Stub.seen, Stub.tokens = [], []

    def answer(status, payload):
        Stub.answer = (status, payload if isinstance(payload, bytes) else json.dumps(payload).encode())
        return f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield answer
    finally:
        server.shutdown()
        server.server_close()


def test_everything_freed_is_status_0(stub, capsys):
    url = stub(200, receipt())
    assert free_cmd.main(["--url", url, "--timeout", "12"]) == 0
    out = capsys.readouterr().out
    assert Stub.seen == [("/memx/free?timeout=12", {"unload_models": True, "free_memory": True})]
    assert ("freed 1 model(s), 16.0 KiB gone from memory; unloaded 1 model(s), 16.0 KiB, from their devices\n"
            in out)
    assert "BaseModel#2 (BaseModel)  16.0 KiB unloaded from cuda:0, gone from memory; loaded by node 1 (LeakyLoader)" in out
    assert "survivors: none" in out


def test_survivors_are_status_1_and_printed_with_their_chains(stub, capsys):
    url = stub(200, receipt(survivors=[SURVIVOR], survivor_bytes=2 ** 20))
    assert free_cmd.main(["--url", url + "/"]) == 1
    out = capsys.readouterr().out
    assert "survivors: 1 model(s), 1.0 MiB still alive although ComfyUI no longer holds them" in out
    assert "held by leaky_pack.LeakyLoader._cache['a']  [package leaky_pack, class_attribute]" in out
    assert "fix (class_cache): cache per instance instead of on the class" in out


def test_a_model_unloaded_but_still_in_ram_is_never_counted_as_freed(stub, capsys):
    """On ``--cpu`` an unload moves nothing out of RAM: the survivor it leaves is unloaded, not freed."""
    kept = dict(FREED, model_id="BaseModel#1", device="cpu", released=False)
    url = stub(200, receipt(freed=[kept], released_bytes=0, survivors=[SURVIVOR], survivor_bytes=16384))
    assert free_cmd.main(["--url", url]) == 1
    out = capsys.readouterr().out
    assert ("freed 0 model(s), 0 B gone from memory; unloaded 1 model(s), 16.0 KiB, from their devices, 1 of them "
            "still in RAM\n" in out), out
    assert "BaseModel#1 (BaseModel)  16.0 KiB unloaded from cpu, still in RAM" in out
    assert "freed 1 model(s)" not in out


def test_a_pending_receipt_is_status_3_and_models_still_loaded_are_status_1(stub, capsys):
    url = stub(202, receipt(status="pending", worker="waiting", freed=[], note="a running prompt delays it"))
    assert free_cmd.main(["--url", url, "--unload-only", "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["status"] == "pending"
    assert Stub.seen[-1][1] == {"unload_models": True, "free_memory": False}
    url = stub(200, receipt(still_loaded=[{"model": "X", "model_id": "X#1", "loaded_bytes": 5, "device": "cpu"}]))
    assert free_cmd.main(["--url", url]) == 1
    assert "still loaded: 1 model(s)\n  X#1 (X)  5 B on cpu" in capsys.readouterr().out


@pytest.mark.parametrize("status, payload, message", [
    (404, b"404: Not Found", "comfy_memx is not installed or not active in that ComfyUI"),
    (500, {"error": "internal", "message": "RuntimeError: boom"}, "answered 500: RuntimeError: boom"),
    (200, b"<html>not json</html>", "not JSON"),
    # a ComfyUI without comfy_memx: the server answers, just not as comfy_memx does; say so and how to check
    (501, b"501: Not Implemented", "answered 501 with something that is not JSON: the server answered, but it has no "
                                   "comfy_memx routes, so comfy_memx is not installed or not active in that ComfyUI"),
    (405, b"405: Method Not Allowed", "/memx/status answers JSON with comfy_memx's version when it is active"),
])
def test_a_server_without_the_route_or_with_errors_is_status_2(stub, capsys, status, payload, message):
    url = stub(status, payload)
    assert free_cmd.main(["--url", url]) == 2
    assert message in capsys.readouterr().err


def test_nobody_listening_is_status_2(capsys):
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert free_cmd.main(["--url", f"http://127.0.0.1:{port}"]) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_a_bad_url_is_status_2(capsys):
    assert free_cmd.main(["--url", "127.0.0.1:8188"]) == 2
    assert "--url must look like http://127.0.0.1:8188" in capsys.readouterr().err


def test_a_failed_search_and_an_unsearched_survivor_are_said(capsys):
    lines = free_cmd.format_receipt(receipt(survivors=[
        {**SURVIVOR, "holders": None, "search": {"error": "RuntimeError: search bug"}},
        {**SURVIVOR, "model_id": "BaseModel#3", "holders": None, "search": None},
        {**SURVIVOR, "model_id": "BaseModel#4", "holders": [], "search": {"complete": True, "note": "C-held"}},
        {**SURVIVOR, "model_id": "BaseModel#5", "holders": [],
         "search": {"result": "incomplete", "complete": False, "stopped_by": "budget", "note": "C-held"}}]))
    text = "\n".join(lines)
    # an incomplete search never claims that the holder is out of its sight
    assert "no holder found within the budget (stopped by budget)" in text and text.count("C-held") == 1
    assert "holder search failed: RuntimeError: search bug" in text
    assert "BaseModel#3 (BaseModel)" in text and "holders not searched" in text
    assert "no holder found: C-held" in text


def test_the_memory_figures_tell_allocator_retention_from_held_bytes():
    from comfy_memx.cli.free import format_receipt
    memory = {"rss_before": 3 * 2 ** 30, "rss_after": 2 * 2 ** 30, "rss_after_trim": 2 ** 30,
              "trim": {"returned_bytes": 2 ** 30, "seconds": 0.01}, "held_bytes": 512 * 2 ** 20}
    lines = format_receipt({"status": "done", "freed": [], "still_loaded": [], "survivors": [], "memory": memory})
    assert lines[-1] == ("memory: process RSS 3.0 GiB before, 1.0 GiB after; malloc_trim gave 1.0 GiB back to the "
                         "kernel (kept by the allocator, not by Python); live models hold 512.0 MiB of RAM")
    skipped = format_receipt({"status": "done", "memory": {**memory, "trim": {"skipped": "COMFY_MEMX_TRIM=0"},
                                                            "rss_after_trim": None}})
    assert "2.0 GiB after; malloc_trim skipped: COMFY_MEMX_TRIM=0;" in skipped[-1]


def test_the_token_of_this_environment_is_sent_so_a_remote_receipt_gets_its_searches(stub, capsys, monkeypatch):
    url = stub(200, receipt())
    monkeypatch.delenv("COMFY_MEMX_TOKEN", raising=False)
    assert free_cmd.main(["--url", url]) == 0
    monkeypatch.setenv("COMFY_MEMX_TOKEN", "s3cret-token-of-16+chars")
    assert free_cmd.main(["--url", url]) == 0
    assert Stub.tokens == [None, "s3cret-token-of-16+chars"]


def test_a_survivor_a_pack_built_and_core_loaded_says_who_built_it():
    built = {"prompt_id": "p", "node_id": "3", "class_type": "CachedCheckpointLoader", "package": "LeakyLoader"}
    loaded = {"prompt_id": "p", "node_id": "5", "class_type": "KSampler", "package": "core"}
    lines = free_cmd.format_receipt(receipt(survivors=[
        {**SURVIVOR, "created_by": built, "owner": loaded},
        {**SURVIVOR, "model_id": "BaseModel#3", "created_by": built, "owner": built}]))
    text = "\n".join(lines)
    assert ("; built by node 3 (CachedCheckpointLoader), package LeakyLoader; loaded by node 5 (KSampler), "
            "package core") in text, text
    assert "built by" not in next(line for line in lines if "BaseModel#3 (BaseModel)" in line)   # it loaded it too
