"""Who may use comfy_memx's routes that change state or cost CPU (README, "Security").

ComfyUI itself serves every route to whoever reaches its port (``--listen 0.0.0.0``).  comfy_memx keeps its read
routes the same (``GET /memx/models``, the metrics) and lets ``POST /memx/free`` unload from anywhere, as ComfyUI's
own ``POST /free`` does; but what costs CPU or reaches other instances is *guarded*:

* ``POST /memx/models/{id}/search``, the holder searches of a ``/memx/free`` receipt, ``POST /memx/handoff/request``:
  allowed from loopback (a request that a proxy relayed, i.e. one with ``Forwarded`` / ``X-Forwarded-For`` /
  ``X-Real-IP``, does not count as loopback), and from elsewhere only with the token of ``COMFY_MEMX_TOKEN`` in
  ``Authorization: Bearer <token>`` or ``X-Memx-Token: <token>`` (compared in constant time);
* ``POST /memx/handoff`` (a peer asks this instance to unload): only with this instance's peer secret in
  ``X-Memx-Peer``.  The secret is random per process and published only in the hand-off registry of its group, a
  file in a folder only this user can read (``core.hostshare``): reading it proves the caller runs as this user,
  on this host, in the same ``COMFY_MEMX_HANDOFF_GROUP``.

:func:`check` answers which of these a request satisfies; the routes turn a refusal into 403 (never telling the
caller anything it could use to be let in).
"""

import hmac
import ipaddress

from comfy_memx.core.state import STATE

FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")
TOKEN_HEADER = "X-Memx-Token"
PEER_HEADER = "X-Memx-Peer"


def is_loopback(remote):
    """True when ``remote`` (aiohttp's ``request.remote``) is a loopback address (127.0.0.0/8, ::1, or ::1 mapped
    IPv4 loopback); a Unix socket (no address) counts as local."""
    if remote is None or remote == "":
        return True
    try:
        address = ipaddress.ip_address(remote.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def presented_token(headers):
    """The token a request sends (``Authorization: Bearer <token>`` or ``X-Memx-Token``), or None."""
    value = headers.get(TOKEN_HEADER)
    if value:
        return value.strip()
    authorization = headers.get("Authorization", "")
    scheme, _, credential = authorization.partition(" ")
    if scheme.lower() == "bearer" and credential.strip():
        return credential.strip()
    return None


def same_secret(presented, expected):
    """Constant-time comparison of two secrets (False when either is missing)."""
    if not presented or not expected:
        return False
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("utf-8", "replace"))


def local(request):
    """True when ``request`` comes straight from this host's loopback (not relayed by a proxy)."""
    if any(request.headers.get(name) for name in FORWARDING_HEADERS):
        return False
    return is_loopback(request.remote)


def check(request):
    """``(allowed, how)`` for a guarded route: how is ``"loopback"``, ``"token"``, or why not (``"remote"``:
    not loopback and no or a wrong token)."""
    if local(request):
        return True, "loopback"
    if same_secret(presented_token(request.headers), STATE.config.token):
        return True, "token"
    return False, "remote"


def refusal():
    """The message of a 403 on a guarded route (says what would be allowed, nothing about the state)."""
    hint = ("send the server's COMFY_MEMX_TOKEN as 'Authorization: Bearer <token>'" if STATE.config.token else
            "the server has no COMFY_MEMX_TOKEN set, so only loopback callers may")
    return f"this route is allowed from loopback, or with a token: {hint}"


def peer_ok(request, own_secret):
    """True when a ``POST /memx/handoff`` carries this instance's peer secret (``X-Memx-Peer``)."""
    return same_secret(request.headers.get(PEER_HEADER), own_secret)
