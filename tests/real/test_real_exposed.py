"""The exposed surface against real ComfyUI servers (opt-in, gated like ``test_real_comfyui.py``: ``COMFY_MEMX_REAL_COMFYUI``
and ``COMFY_MEMX_REAL_PYTHON``): one server per tree under ``python -m comfy_memx`` with ``--listen 0.0.0.0``,
attacked from a network namespace of the test's own (``netns_helpers``) and from loopback.  The servers run on the
oldest and the newest tree: ComfyUI's middlewares in front of the routes differ between 0.3.64 and 0.27.0 (no
``Sec-Fetch-Site`` check in 0.3.64) and are the same in 0.27.0 and 0.33.0, as is the worker that unloads for a
hand-off; the FIFO check runs on the newest only (the launcher refuses before ComfyUI starts).

* the guarded routes (holder search, ``/memx/free``'s searches, ``/memx/handoff/request``) refuse a non-loopback
  caller without ``COMFY_MEMX_TOKEN`` and serve it with the token; ``/memx/free`` itself and the read routes answer
  it as ComfyUI's own routes would; ``/memx/handoff`` answers only a request signed with the peer secret of its
  group's registry (the raw secret is refused), and its 409 never names the device; no answer shows a client
  address;
* hostile bodies (100k levels deep, oversized, wrong types, ``NaN``/``1e999``) and query numbers (``²``, ``５``,
  signs, exponents, overlong) get 400/413, never 500, and leave no traceback or internal error in the log; a body
  split across TCP segments is read whole;
* from loopback, a browser's request from a page of a rebound name (``Host: evil.example``) or of another origin
  gets 403 from the guarded routes unless it has the token, with and without ComfyUI's ``--enable-cors-header``;
* the events file: a FIFO makes the launcher exit 2 naming ``--events`` before ComfyUI starts; a file renamed
  (logrotate) is reopened and the next events land in the new one;
* hand-off: a server listening on a non-loopback address (``--listen 10.213.n.1``) advertises that address, and a
  squatter that binds ``127.0.0.1:<its port>`` (another local user) is never asked, never sees the peer secret and
  is never credited; the real peer is asked and gives.
"""

import json
import os
import subprocess
import time
from urllib.parse import quote

import pytest

from bench.harness import waits
from netns_helpers import call_from, remote_namespace
from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python, memx_lines,  # noqa: F401
                               needs_real_comfyui, newest_tree_only, oldest_and_newest_trees, where)

TOKEN = "real-remote-service-token-0123456789"


def raw_call(session, path, data, headers=None, method="POST"):
    import urllib.error
    import urllib.request
    request = urllib.request.Request(session.base_url + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def post_in_parts(port, path, parts, pause_s=0.5):
    """POST ``parts`` to 127.0.0.1:``port`` over a raw socket, ``pause_s`` apart (a body split across TCP segments);
    returns (status, JSON answer)."""
    import socket
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
            f"Content-Length: {sum(len(part) for part in parts)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as connection:
        connection.sendall(head)
        for index, part in enumerate(parts):
            if index:
                time.sleep(pause_s)
            connection.sendall(part)
        answer = b""
        while True:
            data = connection.recv(65536)
            if not data:
                break
            answer += data
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def check_browser_defence(session, search, cors):
    """From loopback: a page of a rebound name (``Host: evil.example``) or of another origin gets 403 from the
    guarded routes, the same with the token, a page of this server's own names, 200.  ``cors``: the server runs
    with ``--enable-cors-header`` (ComfyUI's own origin check is off, so comfy_memx's is all there is)."""
    def page_of(host):   # a browser's same-origin fetch from a page served as http://host:port
        return {"Host": f"{host}:{session.port}", "Origin": f"http://{host}:{session.port}",
                "Sec-Fetch-Site": "same-origin"}
    rebound = page_of("evil.example")
    handoff_request = "/memx/handoff/request?bytes=1000"
    refused = [(search, rebound), (handoff_request, rebound), (search, {"Origin": "http://evil.example"}),
               (search, {"Sec-Fetch-Site": "cross-site"})]
    allowed = [(search, dict(rebound, Authorization="Bearer " + TOKEN)), (search, page_of("localhost")),
               (search, page_of("gpu-box.lan")), (handoff_request, page_of("gpu-box.lan"))]
    if cors:
        allowed.append((search, {"Origin": "http://evil.example", "X-Memx-Token": TOKEN}))
    for path, headers in refused:
        status, body = raw_call(session, path, b"", headers)
        assert status == 403 and "model" not in (body or {}), (path, headers, status, body)
    for path, headers in allowed:
        status, body = raw_call(session, path, b"", headers)
        assert status == 200, (path, headers, status, body)


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_real_server_with_cors_header_still_guards_against_other_sites_and_rebound_names(
        tree, memx_importable_by_real_python, tmp_path):  # noqa: F811
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps)")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    session = drive.Session(tree, configured_python(), str(tmp_path / "server"), launcher="module",
                            env={"COMFY_MEMX_TOKEN": TOKEN, "COMFY_MEMX_HANDOFF": "host", "COMFY_MEMX_SEARCH_CPU": "60",
                                 "COMFY_MEMX_ALLOWED_HOSTS": "gpu-box.lan", "XDG_RUNTIME_DIR": str(runtime)},
                            comfy_args=["--enable-cors-header"])
    try:
        assert session.start(), where(session)
        held = session.prompt("held", {"1": drive.loader_node("memx-cors"), "2": drive.sampler_node("1", 1),
                                       "3": drive.leaky_cache_node("1", "cors")})
        assert held["ok"], (held, where(session))
        model_id = session.call("models", "GET", "/memx/models")["body"][0]["model_id"]
        check_browser_defence(session, f"/memx/models/{quote(model_id, safe='')}/search", cors=True)
    finally:
        session.stop()
    text = session.log_text()
    assert session.failure_tracebacks() == [] and "comfy_memx: internal error" not in text, where(session)


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_real_server_exposed_on_all_interfaces(tree, memx_importable_by_real_python, tmp_path):  # noqa: F811
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps)")
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    session = drive.Session(tree, configured_python(), str(tmp_path / "server"), launcher="module",
                            env={"COMFY_MEMX_TOKEN": TOKEN, "COMFY_MEMX_HANDOFF": "host", "COMFY_MEMX_SEARCH_CPU": "60",
                                 "COMFY_MEMX_ALLOWED_HOSTS": "gpu-box.lan", "XDG_RUNTIME_DIR": str(runtime)},
                            comfy_args=["--listen", "0.0.0.0"])
    try:
        assert session.start(), where(session)
        held = session.prompt("held", {"1": drive.loader_node("memx-exposed"), "2": drive.sampler_node("1", 1),
                                       "3": drive.leaky_cache_node("1", "exposed")})
        assert held["ok"], (held, where(session))
        rows = session.call("models", "GET", "/memx/models")["body"]
        model_id = rows[0]["model_id"]
        search = f"/memx/models/{quote(model_id, safe='')}/search"

        with remote_namespace() as (namespace, address, there):
            remote = f"http://{address}:{session.port}"
            status, listed, _ = call_from(namespace, "GET", remote + "/memx/models")
            assert status == 200 and [r["model_id"] for r in listed] == [r["model_id"] for r in rows]
            status, body, _ = call_from(namespace, "POST", remote + search)
            assert status == 403 and body["error"] == "forbidden", body
            status, body, _ = call_from(namespace, "POST", remote + search, {"Authorization": "Bearer " + TOKEN})
            assert status == 200 and body["model_id"] == model_id, body
            status, body, _ = call_from(namespace, "POST", remote + "/memx/handoff/request?bytes=1000")
            assert status == 403, body
            status, body, _ = call_from(namespace, "POST", remote + "/memx/handoff",
                                        body={"bytes": 1, "from": 1, "device": "cpu"})
            assert status == 403 and "device" not in body, body
            status, receipt, _ = call_from(namespace, "POST", remote + "/memx/free?timeout=120",
                                           body={"unload_models": True, "free_memory": True})
            assert status == 200 and receipt["status"] == "done", receipt
            assert receipt["survivors"], receipt                  # MemxLeakyCache keeps the module
            assert all(s["holders"] is None and "not searched" in s["search"]["note"] for s in receipt["survivors"])
            status, receipt, _ = call_from(namespace, "POST", remote + "/memx/free?timeout=120",
                                           {"X-Memx-Token": TOKEN}, body={"unload_models": True})
            assert status == 200 and receipt["survivors"][0]["holders"], receipt
            status, text, _ = call_from(namespace, "GET", remote + "/memx/models")
            assert there not in json.dumps(text), text

        # DNS rebinding and other origins, from loopback (ComfyUI checks Origin only for a loopback Host).
        check_browser_defence(session, search, cors=False)

        # Hostile bodies, from loopback: 4xx, never 500.
        for path, data, expected in [
                ("/memx/free", b"[" * 100000 + b"]" * 100000, 413),
                ("/memx/free", b"[" * 64 + b"]" * 64, 400),
                ("/memx/free", b'{"unload_models": "yes"}', 400),
                ("/memx/free", b'{"free_memory": NaN}', 400),
                ("/memx/free", b'{"free_memory": 1e999}', 400),
                ("/memx/free", b"[1]", 400)]:
            status, body = raw_call(session, path, data)
            assert status == expected, (path, data[:40], status, body)
        # Numbers in queries: other scripts' digits, signs, spaces, exponents, overlong: 400, never 500.
        for method, path in [("GET", "/memx/timeline?since=%C2%B2"), ("GET", "/memx/timeline?since=%EF%BC%95"),
                             ("GET", "/memx/timeline?since=+5"), ("GET", "/memx/timeline?since=" + "9" * 30),
                             ("POST", "/memx/free?timeout=1e1"), ("POST", "/memx/free?timeout=%EF%BC%95"),
                             ("POST", "/memx/free?timeout=%205"), ("POST", "/memx/handoff/request?bytes=%C2%B2"),
                             ("POST", "/memx/handoff/request?bytes=-5"), ("POST", "/memx/handoff/request?bytes=1e3")]:
            status, body = raw_call(session, path, None, method=method)
            assert status == 400, (path, status, body)
        # A body split across TCP segments is read whole.
        status, receipt = post_in_parts(session.port, "/memx/free?timeout=120",
                                        [b'{"unload_models": ', b'true, "free_memory": false}'])
        assert status == 200 and receipt["request"] == {"unload_models": True, "free_memory": False}, receipt
        registry = json.loads((runtime / "comfy_memx-instances-default.json").read_text())
        [(token, entry)] = registry.items()

        def peer(data):   # signed with the secret that only this user can read: the group's proof
            from comfy_memx.sharing import peerproof
            who = peerproof.identity(token, entry["data"]["url"])
            return {peerproof.AUTH_HEADER: peerproof.request_auth(entry["data"]["secret"], who, data,
                                                                  peerproof.fresh_nonce())}
        for data in (b'{"timeout": "abc"}', b"[1]", b'{"bytes": -1}', b"{" * 50 + b"}" * 50):
            status, body = raw_call(session, "/memx/handoff", data, peer(data))
            assert status == 400, (data, status, body)
        data = json.dumps({"bytes": 1, "from": 1, "device": "x"}).encode()
        status, body = raw_call(session, "/memx/handoff", data, {"X-Memx-Peer": entry["data"]["secret"]})
        assert status == 403, (status, body)                # the raw secret is no credential
        status, body = raw_call(session, "/memx/handoff", data, peer(data))
        assert status == 409 and body["status"] == "other_device" and entry["data"]["device"] not in json.dumps(body)

        # logrotate: the file is renamed, the next events go to a new file at the same path.
        events = session.events_path
        os.rename(events, events + ".1")
        again = session.prompt("after_rotate", {"1": drive.loader_node("memx-rotated"),
                                                "2": drive.sampler_node("1", 2)})
        assert again["ok"], (again, where(session))
        waits.wait_until(lambda: os.path.exists(events) and '"event":"load"' in open(events).read(), session.alive,
                         waits.log_size(session.log_path), "the load event in the new events file")
        assert any(json.loads(line)["event"] == "load" for line in open(events)), where(session)
    finally:
        session.stop()
    text = session.log_text()
    assert session.failure_tracebacks() == [] and "comfy_memx: internal error" not in text, where(session)


@needs_real_comfyui
@pytest.mark.parametrize("tree", newest_tree_only)
def test_real_launcher_refuses_a_fifo_as_events_file(tree, memx_importable_by_real_python, tmp_path):  # noqa: F811
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps)")
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    done = subprocess.run([configured_python(), "-m", "comfy_memx", "--events", str(fifo),
                           os.path.join(tree, "main.py"), "--cpu", "--quick-test-for-ci"],
                          capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=drive.inherited_env())
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--events" in done.stderr and "FIFO" in done.stderr


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_real_handoff_never_asks_a_squatter_on_the_loopback_port_of_a_peer_listening_elsewhere(
        tree, memx_importable_by_real_python, tmp_path):  # noqa: F811
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps)")
    from peer_helpers import LIAR_ANSWER, fake_peer
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env = {"COMFY_MEMX_HANDOFF": "host", "XDG_RUNTIME_DIR": str(runtime)}
    with remote_namespace() as (_namespace, address, _there):
        giver = drive.Session(tree, configured_python(), str(tmp_path / "giver"), launcher="module", env=env,
                              comfy_args=["--listen", address])
        giver.server.base_url = giver.base_url = f"http://{address}:{giver.port}"
        asker = drive.Session(tree, configured_python(), str(tmp_path / "asker"), launcher="module", env=env)
        squatter = None
        try:
            assert giver.start(), where(giver)
            assert asker.start(), where(asker)
            held = giver.prompt("held", {"1": drive.loader_node("memx-handoff"), "2": drive.sampler_node("1", 1)})
            assert held["ok"], (held, where(giver))
            squatter = fake_peer(port=giver.port)          # another user binds 127.0.0.1:<the giver's port>
            answer = asker.call("handoff", "POST", "/memx/handoff/request?bytes=%d" % 2 ** 40)["body"]
            registry = json.loads((runtime / "comfy_memx-instances-default.json").read_text())
        finally:
            if squatter is not None:
                squatter.shutdown()
            giver.stop()
            asker.stop()
    assert squatter.seen == [], squatter.seen                       # no secret, no nonce, nothing
    assert sorted(entry["data"]["url"] for entry in registry.values()) == sorted([giver.base_url, asker.base_url])
    assert [row["status"] for row in answer["peers_asked"]] == ["done"], answer
    assert 0 < answer["freed_bytes"] < LIAR_ANSWER["freed_bytes"], answer
    for session in (giver, asker):
        text = session.log_text()
        assert session.failure_tracebacks() == [] and "comfy_memx: internal error" not in text, where(session)
