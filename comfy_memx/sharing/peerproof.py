"""How hand-off peers prove who they are, without their secret ever leaving the registry.

Each instance publishes a random peer secret in its entry of the group's registry (a 0600 file in a folder only this
user can read, ``core.hostshare``); reading it is what makes a caller a member of the group.  The secret itself is
never sent anywhere: every message carries an HMAC-SHA256 keyed by the *asked* peer's secret instead, over a fresh
nonce and the asked peer's identity (its registry token and the URL it advertises), so that whoever answers at that
URL without being that peer learns nothing it can reuse:

1. **hello**: the requester sends a fresh random nonce (``POST /memx/handoff/hello``, nothing secret in it); the peer
   answers :func:`hello_proof` of that nonce.  Only a peer that can read the registry can compute it; the requester
   goes on only when it matches (a squatter on the advertised port gets a nonce, and is skipped).
2. **request**: the unload request carries :func:`request_auth` (``X-Memx-Peer-Auth: <time>:<nonce>:<mac>``), a MAC
   over a second fresh nonce, the time, the peer's identity and the exact body.  The peer accepts it once
   (:class:`Replays`: a nonce is remembered for :data:`WINDOW_S`, a time further off than that is refused), so a
   captured request cannot be played again, altered, or sent to another peer.
3. **answer**: the peer signs the exact bytes of its answer with that nonce (``X-Memx-Peer-Proof``,
   :func:`answer_proof`); the requester believes only an answer whose proof verifies.

Every comparison is constant-time (``hmac.compare_digest``).  Each proof has a purpose label of its own, so a proof
a peer hands out for a hello is never a valid request or answer.
"""

import hashlib
import hmac
import re
import secrets
import time

HELLO_PATH = "/memx/handoff/hello"
AUTH_HEADER = "X-Memx-Peer-Auth"
PROOF_HEADER = "X-Memx-Peer-Proof"
WINDOW_S = 30.0     # a request's time may be this far from the peer's clock; its nonce is remembered that long
MAX_REMEMBERED = 4096
_NONCE = re.compile(r"[0-9a-f]{32}\Z")
_AUTH = re.compile(r"([0-9]{1,12}):([0-9a-f]{32}):([0-9a-f]{64})\Z")


def fresh_nonce():
    """A new random nonce (32 hex digits)."""
    return secrets.token_hex(16)


def valid_nonce(value):
    """True when ``value`` has the form of :func:`fresh_nonce` (anything else is refused before any MAC)."""
    return isinstance(value, str) and _NONCE.match(value) is not None


def identity(token, url):
    """What names one registered peer in its proofs: its registry token and the URL it advertises."""
    return f"{token} {url}"


def _mac(secret, label, *parts):
    message = b"\n".join([label] + [part if isinstance(part, bytes) else str(part).encode() for part in parts])
    return hmac.new(str(secret).encode(), message, hashlib.sha256).hexdigest()


def same(presented, expected):
    """Constant-time equality of two proofs (False when ``presented`` is not a string)."""
    if not isinstance(presented, str) or not isinstance(expected, str):
        return False
    return hmac.compare_digest(presented.encode("ascii", "replace"), expected.encode("ascii", "replace"))


def hello_proof(secret, nonce, who):
    """The peer ``who`` (:func:`identity`) proves it can read its own ``secret``: its MAC of the requester's
    ``nonce``."""
    return _mac(secret, b"memx-handoff-hello", nonce, who)


def request_auth(secret, who, body, nonce, now=None):
    """The ``X-Memx-Peer-Auth`` value of an unload request with ``body`` (bytes) to peer ``who`` keyed by that peer's
    ``secret``: ``<unix time>:<nonce>:<mac>``."""
    stamp = int(time.time() if now is None else now)
    return f"{stamp}:{nonce}:{_mac(secret, b'memx-handoff-request', stamp, nonce, who, body)}"


def answer_proof(secret, nonce, raw):
    """The ``X-Memx-Peer-Proof`` of answer bytes ``raw`` to the request of ``nonce``."""
    return _mac(secret, b"memx-handoff-answer", nonce, raw)


class Replays:
    """The request nonces a peer accepted in the last :data:`WINDOW_S` seconds (only those whose MAC verified: a
    caller without the secret cannot fill it)."""

    def __init__(self):
        self.seen = {}   # nonce -> when it may be forgotten (monotonic)

    def first_time(self, nonce, now=None):
        """True, and remembered, when ``nonce`` was not accepted in the window; False for a replay."""
        now = time.monotonic() if now is None else now
        for old in [key for key, until in self.seen.items() if until < now]:
            del self.seen[old]
        if nonce in self.seen:
            return False
        while len(self.seen) >= MAX_REMEMBERED:   # only by a member flooding itself: forget the oldest
            del self.seen[next(iter(self.seen))]
        self.seen[nonce] = now + 2 * WINDOW_S
        return True


def check_request(header, secret, who, body, replays, now=None):
    """The nonce of a verified unload request (``header``: its ``X-Memx-Peer-Auth``; ``body``: its exact bytes) to
    peer ``who``, or None when it is missing, malformed, out of the time window, forged, or a replay."""
    if not secret or not isinstance(header, str):
        return None
    match = _AUTH.match(header.strip())
    if match is None:
        return None
    stamp, nonce, mac = int(match.group(1)), match.group(2), match.group(3)
    if abs((time.time() if now is None else now) - stamp) > WINDOW_S:
        return None
    if not same(mac, _mac(secret, b"memx-handoff-request", stamp, nonce, who, body)):
        return None
    return nonce if replays.first_time(nonce) else None
