"""Asking one registered hand-off peer to unload: it proves itself first, and only its proven answer is believed.

:func:`ask` takes a peer's registry entry (``core.hostshare.Peer``: its token, URL, secret) and follows
``sharing.peerproof``: a hello with a fresh nonce, answered within :data:`PEER_ANSWER_S` seconds with the peer's
proof; then the unload request signed for that peer, whose answer must carry its proof too, within
:data:`PEER_UNLOAD_S` seconds (the peer is told so, and answers by then): a proven peer that stalls is cut off there,
so the requester asks the next one instead of waiting out the whole ``COMFY_MEMX_HANDOFF_WAIT``.  What it answers is the
peer's answer (``status``, ``freed_bytes``, ``freed``) or one of ``unreachable`` (no answer in time, refused
connection, not HTTP), ``unproven`` (an answer without a valid proof: not the registered peer), ``refused`` (the
URL is not on an address of this host).  Every exchange is bounded as a whole (a peer that sends one byte at a time
is cut off at the same time as one that sends nothing).
"""

import http.client
import json
import socket
import threading
import time
import urllib.parse

from comfy_memx.sharing import address, peerproof

PEER_ANSWER_S = 3.0            # a peer's hello must be answered within this; a silent one is skipped
PEER_UNLOAD_S = 8.0            # a proven peer must answer its unload request within this; a stalled one is skipped
MAX_ANSWER_BYTES = 64 * 1024
GIVE_PATH = "/memx/handoff"


class NoAnswer(Exception):
    """The exchange gave no HTTP answer within its time (or the connection failed)."""


def _cut(connection):
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)   # wakes a read blocked on a peer that does not answer
        except OSError:
            pass


def exchange(url, path, raw, headers, timeout):
    """POST ``raw`` to ``url`` + ``path``; ``(status, headers, body bytes)``, all of it within ``timeout`` seconds,
    else :class:`NoAnswer`."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    timer = threading.Timer(timeout, _cut, (connection,))
    timer.daemon = True
    timer.start()
    try:
        connection.request("POST", path, body=raw, headers={"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        body = response.read(MAX_ANSWER_BYTES + 1)
        if len(body) > MAX_ANSWER_BYTES:
            raise NoAnswer("the answer is too long")
        return response.status, response.headers, body
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise NoAnswer(f"{type(error).__name__}: {error}"[:200]) from None
    finally:
        timer.cancel()
        connection.close()


def proven(peer, nonce, timeout):
    """True when ``peer`` answers a hello with ``nonce`` within ``timeout`` seconds with its proof; raises
    :class:`NoAnswer` when it does not answer."""
    status, _headers, raw = exchange(peer.data["url"], peerproof.HELLO_PATH, json.dumps({"nonce": nonce}).encode(),
                                     {}, timeout)
    try:
        proof = json.loads(raw).get("proof") if status == 200 else None
    except (ValueError, AttributeError):
        proof = None
    expected = peerproof.hello_proof(peer.data.get("secret") or "", nonce, _who(peer))
    return bool(peer.data.get("secret")) and peerproof.same(proof, expected)


def _who(peer):
    return peerproof.identity(peer.token, peer.data.get("url"))


def ask(peer, body, deadline):
    """Ask ``peer`` to unload (``body``: the ``POST /memx/handoff`` fields) before the monotonic ``deadline`` and
    within :data:`PEER_ANSWER_S` + :data:`PEER_UNLOAD_S` seconds; the peer's proven answer as a dict, or ``{"status": "unreachable" | "unproven" | "refused", "error": ...}``."""
    url = peer.data.get("url") or ""
    if not address.held_here(url):
        return {"status": "refused", "error": "peers are asked on this host's addresses only"}
    try:
        if not proven(peer, peerproof.fresh_nonce(), max(0.1, min(PEER_ANSWER_S, deadline - time.monotonic()))):
            return {"status": "unproven", "error": "its hello answer does not carry the registered peer's proof"}
        timeout = max(1.0, min(PEER_UNLOAD_S, deadline - time.monotonic()))
        raw = json.dumps(dict(body, timeout=round(timeout - 0.5, 3))).encode()   # the peer answers before we stop
        nonce = peerproof.fresh_nonce()
        auth = peerproof.request_auth(peer.data["secret"], _who(peer), raw, nonce)
        status, headers, answer = exchange(url, GIVE_PATH, raw, {peerproof.AUTH_HEADER: auth}, timeout)
    except NoAnswer as error:
        return {"status": "unreachable", "error": str(error)}
    if not peerproof.same(headers.get(peerproof.PROOF_HEADER),
                          peerproof.answer_proof(peer.data["secret"], nonce, answer)):
        return {"status": "unproven", "error": f"its answer (HTTP {status}) does not carry the peer's proof"}
    try:
        parsed = json.loads(answer)
    except ValueError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {"status": "bad_answer", "error": "not a JSON object"}
