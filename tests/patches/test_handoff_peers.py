"""Hand-off peers must prove they are the registered instance before anything is sent or believed.

A squatter (another local user who bound the port a peer advertises) is played by a small HTTP server of the test
that records every request: it must never receive the peer secret or anything it could replay, its
``done, freed 1e15`` is not credited and the next peer is asked; a silent one is skipped after the hello's short
timeout instead of holding the whole wait.  A proven peer's freed bytes are clipped to what its registry entry says
it holds.  The requester is the stand-in server's real ``POST /memx/handoff/request``; the registry's view of the
peers is the test's (``test_sharing.py`` runs real instances; ``test_real_exposed.py`` real ComfyUI servers).
"""

import json
import logging
import socket

import pytest

from comfy_memx.core.hostshare import Peer
from comfy_memx.sharing import address, asking, peerproof
from peer_helpers import fake_peer
from test_exposed_routes import handoff_on, post
from test_routes import serve

def test_squatters_learn_nothing_reusable_are_not_believed_and_do_not_hold_the_wait(tmp_path, monkeypatch, caplog):
    from comfy_memx.sharing import handoff
    liar, honest = fake_peer(), fake_peer(honest=True)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)            # accepts into its backlog, never answers
    secrets = {"liar": "L" * 32, "silent": "S" * 32}

    async def scenario(comfy):
        handoff.start(1)
        device = handoff.part().device
        peers = {"ab" * 16: Peer(100, 0, {"device": device, "url": liar.url, "secret": secrets["liar"],
                                           "held_bytes": 10 ** 6}, "ab" * 16),
                 "ef" * 16: Peer(101, 0, {"device": device, "url": "http://127.0.0.1:%d" % silent.getsockname()[1],
                                           "secret": secrets["silent"], "held_bytes": 10 ** 6}, "ef" * 16),
                 honest.token: Peer(102, 0, {"device": device, "url": honest.url, "secret": honest.secret,
                                             "held_bytes": 5000}, honest.token)}
        monkeypatch.setattr(handoff.part().registry, "peers", lambda: peers)
        return [await post(comfy, "/memx/handoff/request?bytes=1000000000") for _ in range(2)]

    caplog.set_level(logging.WARNING, logger="comfy_memx")
    try:
        answers = serve("0.27.0", tmp_path, scenario, handoff_wait=60, **handoff_on(tmp_path, monkeypatch))
    finally:
        liar.shutdown()
        honest.shutdown()
        silent.close()
    for status, answer, _ in answers:
        assert status == 200, answer
        assert answer["peers_asked"] == [{"pid": 100, "status": "unproven"}, {"pid": 101, "status": "unreachable"},
                                         {"pid": 102, "status": "done", "clipped_from": 10 ** 15}], answer
        assert answer["givers"] == [{"pid": 102, "freed_bytes": 5000, "freed": ["BaseModel#3"],
                                     "clipped_from": 10 ** 15}]
        assert answer["freed_bytes"] == 5000                      # not 1e15: the liar is not believed
        assert answer["seconds"] < 60                              # the silent one did not hold the whole wait
    # The liar saw two hellos: a nonce each, no secret, no request it could replay anywhere.
    assert [request["path"] for request in liar.seen] == [peerproof.HELLO_PATH] * 2
    seen = json.dumps(liar.seen)
    assert not any(secret in seen for secret in list(secrets.values()) + [honest.secret])
    assert "X-Memx-Peer" not in seen and "X-Memx-Token" not in seen
    assert len(honest.verified) == 2                               # the honest peer got signed requests
    assert len([r for r in caplog.records if "pid 100" in r.getMessage()]) == 1   # logged once


def test_a_proven_peer_that_stalls_on_the_unload_is_cut_off_and_the_next_one_asked(tmp_path, monkeypatch):
    """A peer that proves itself and then never answers its unload request holds the requester for
    ``asking.PEER_UNLOAD_S`` at most, not the whole hand-off wait (60 s here): the next peer is asked in time."""
    from comfy_memx.sharing import handoff
    stalled, honest = fake_peer(stall=True, token="ab" * 16), fake_peer(honest=True)

    async def scenario(comfy):
        handoff.start(1)
        device = handoff.part().device
        peers = {stalled.token: Peer(100, 0, {"device": device, "url": stalled.url, "secret": stalled.secret,
                                              "held_bytes": 10 ** 6}, stalled.token),
                 honest.token: Peer(101, 0, {"device": device, "url": honest.url, "secret": honest.secret,
                                             "held_bytes": 5000}, honest.token)}
        monkeypatch.setattr(handoff.part().registry, "peers", lambda: peers)
        return await post(comfy, "/memx/handoff/request?bytes=1000000000")

    try:
        status, answer, _ = serve("0.27.0", tmp_path, scenario, handoff_wait=60, **handoff_on(tmp_path, monkeypatch))
    finally:
        stalled.release.set()
        stalled.shutdown()
        honest.shutdown()
    assert status == 200, answer
    assert answer["peers_asked"] == [{"pid": 100, "status": "unreachable"},
                                     {"pid": 101, "status": "done", "clipped_from": 10 ** 15}], answer
    assert answer["freed_bytes"] == 5000 and [giver["pid"] for giver in answer["givers"]] == [101]
    [request] = stalled.verified                  # proven, asked, and told how long it has to answer
    assert request["timeout"] == asking.PEER_UNLOAD_S - 0.5 and len(honest.verified) == 1


def test_a_captured_request_cannot_be_replayed_altered_or_sent_elsewhere():
    replays, body = peerproof.Replays(), b'{"bytes": 1}'
    who, other = peerproof.identity("ab" * 16, "http://127.0.0.1:1"), peerproof.identity("cd" * 16, "http://127.0.0.1:2")
    auth = peerproof.request_auth("secret-1", who, body, peerproof.fresh_nonce())
    assert peerproof.check_request(auth, "secret-1", other, body, replays) is None        # another peer
    assert peerproof.check_request(auth, "secret-1", who, body + b" ", replays) is None   # another body
    assert peerproof.check_request(auth, "secret-2", who, body, replays) is None          # another secret
    assert peerproof.check_request(auth, "secret-1", who, body, replays) is not None
    assert peerproof.check_request(auth, "secret-1", who, body, replays) is None          # played again
    old = peerproof.request_auth("secret-1", who, body, peerproof.fresh_nonce(), now=1000)
    assert peerproof.check_request(old, "secret-1", who, body, replays) is None           # out of the window
    for junk in (None, "", "1:2:3", auth + "0", auth.upper(), "\u0661" + auth):
        assert peerproof.check_request(junk, "secret-1", who, body, replays) is None
    hello = peerproof.hello_proof("secret-1", "0" * 32, who)
    assert hello != auth.rsplit(":", 1)[1] and hello != peerproof.answer_proof("secret-1", "0" * 32, b"")


@pytest.mark.parametrize("listen,url", [
    (None, "http://127.0.0.1:8188"), ("127.0.0.1", "http://127.0.0.1:8188"), ("0.0.0.0", "http://127.0.0.1:8188"),
    ("0.0.0.0,::", "http://127.0.0.1:8188"), ("::", "http://[::1]:8188"), ("::1", "http://[::1]:8188"),
    ("[::1]", "http://[::1]:8188"), ("10.213.7.1", "http://10.213.7.1:8188"), ("127.0.0.2", "http://127.0.0.2:8188"),
    ("10.213.7.1,127.0.0.2", "http://127.0.0.2:8188"), ("10.213.7.1, 192.0.2.4", "http://10.213.7.1:8188"),
    ("fe80::1:2", "http://[fe80::1:2]:8188"), ("", "http://127.0.0.1:8188"),
])
def test_the_advertised_url_is_on_an_address_the_server_listens_on(listen, url):
    assert address.advertised_url(listen, 8188) == url


def test_a_name_is_advertised_as_the_addresses_it_resolves_to_and_no_address_turns_handoff_off():
    assert address.advertised_url("localhost", 9) in ("http://127.0.0.1:9", "http://[::1]:9")
    assert address.advertised_url("no-such-host.invalid", 9) is None


def test_only_urls_on_this_hosts_addresses_are_asked():
    assert address.held_here("http://127.0.0.1:9") and address.held_here("http://[::1]:9")
    for url in ("http://203.0.113.7:9", "http://localhost:9", "https://127.0.0.1:9", "http://127.0.0.1",
                "http://0.0.0.0:9", "http://[::]:9", "not a url", ""):
        assert not address.held_here(url), url


def test_start_advertises_the_listen_address(tmp_path, monkeypatch):
    from memx_helpers import memx_on
    from comfy_memx.sharing import handoff
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with memx_on("0.27.0", handoff="host"):
        handoff.start(4321, "10.213.7.1")
        [entry] = handoff.part().registry.peers(include_self=True).values()
    assert entry.data["url"] == "http://10.213.7.1:4321" and entry.data["held_bytes"] == 0
    assert oct((tmp_path / "comfy_memx-instances-default.json").stat().st_mode & 0o777) == "0o600"


def test_an_answer_without_the_peers_proof_is_unproven(monkeypatch):
    liar = fake_peer()
    try:
        peer = Peer(1, 0, {"url": liar.url, "secret": "x" * 32}, "ab" * 16)
        import time
        assert asking.ask(peer, {"bytes": 1}, time.monotonic() + 10)["status"] == "unproven"
    finally:
        liar.shutdown()


def test_loads_ask_the_hand_off_only_while_this_instance_is_registered(tmp_path, monkeypatch):
    from comfy_memx.core import signals
    from comfy_memx.sharing import handoff
    seen = []

    async def scenario(comfy):
        seen.append(handoff.before_load in signals.load.subscribers())   # the server's start registered it
        handoff.part().close()
        seen.append(handoff.before_load in signals.load.subscribers())
        handoff.start(1)
        seen.append(handoff.before_load in signals.load.subscribers())

    serve("0.27.0", tmp_path, scenario, **handoff_on(tmp_path, monkeypatch))
    assert seen == [True, False, True]
    seen.clear()
    serve("0.27.0", tmp_path / "off", scenario)
    assert seen == [False, False, False]
