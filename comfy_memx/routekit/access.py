"""Who may use comfy_memx's routes that change state or cost CPU (docs/security.md).

ComfyUI itself serves every route to whoever reaches its port (``--listen 0.0.0.0``).  comfy_memx keeps its read
routes the same (``GET /memx/models``, the metrics) and lets ``POST /memx/free`` unload from anywhere, as ComfyUI's
own ``POST /free`` does; but what costs CPU or reaches other instances is *guarded*:

* ``POST /memx/models/{id}/search``, the holder searches of a ``/memx/free`` receipt, ``POST /memx/handoff/request``:
  allowed with the token of ``COMFY_MEMX_TOKEN`` in ``Authorization: Bearer <token>`` or ``X-Memx-Token: <token>``
  (compared in constant time), whoever sends it; without it only from loopback (a request that a proxy relayed,
  i.e. one with ``Forwarded`` / ``X-Forwarded-For`` / ``X-Real-IP``, does not count as loopback), and then only
  when a browser could not have been made to send it (:func:`browser_safe`): its ``Host`` is a loopback name or
  address, the address the connection came in on, or a name of ``COMFY_MEMX_ALLOWED_HOSTS`` (a page of
  ``evil.example`` whose name was rebound to 127.0.0.1 sends ``Host: evil.example``), and it is not cross-origin
  (``Sec-Fetch-Site: cross-site``, or an ``Origin`` other than the ``Host``: ComfyUI's ``--enable-cors-header``
  turns its own check of that off);
* ``POST /memx/handoff`` (a peer asks this instance to unload): only a request signed with this instance's peer
  secret (``sharing.peerproof``; the secret itself never travels).  The secret is random per process and published
  only in the hand-off registry of its group, a file in a folder only this user can read (``core.hostshare``):
  reading it proves the caller runs as this user, on this host, in the same ``COMFY_MEMX_HANDOFF_GROUP``.

:func:`check` answers which of these a request satisfies; the routes turn a refusal into 403 (never telling the
caller anything it could use to be let in).
"""

import hmac
import ipaddress
import urllib.parse

from comfy_memx.core.state import STATE

FORWARDING_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")
TOKEN_HEADER = "X-Memx-Token"


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


def host_name(netloc):
    """The host of a ``Host`` header or an ``Origin``'s netloc: lowercased, without port, brackets or final dot
    (``[::1]:8188`` -> ``::1``); None when there is none."""
    try:
        name = urllib.parse.urlsplit("//" + netloc).hostname
    except ValueError:
        return None
    return (name or "").rstrip(".") or None


def _port(netloc):
    try:
        return urllib.parse.urlsplit("//" + netloc).port
    except ValueError:
        return -1   # a port that is not a number matches nothing


def _arrived_on(request):
    """The local address the request's connection came in on (the address this server listens on), or None."""
    transport = getattr(request, "transport", None)
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    return sockname[0] if isinstance(sockname, tuple) and sockname else None


def host_allowed(request):
    """True when the request's ``Host`` names this server: a loopback name (``localhost``, ``*.localhost``) or
    address, the address its connection came in on, or a name of ``COMFY_MEMX_ALLOWED_HOSTS``.  A request without
    ``Host`` is not a browser's (every browser sends one)."""
    header = request.headers.get("Host")
    if header is None:
        return True
    name = host_name(header)
    if name is None:
        return False
    if name == "localhost" or name.endswith(".localhost") or name in STATE.config.allowed_hosts:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    arrived = _arrived_on(request)
    return is_loopback(name) or (arrived is not None and _same_address(address, arrived))


def _same_address(address, other):
    try:
        other = ipaddress.ip_address(other.split("%", 1)[0])
    except ValueError:
        return False
    return (getattr(address, "ipv4_mapped", None) or address) == (getattr(other, "ipv4_mapped", None) or other)


def same_origin(request):
    """False when a browser says the request is cross-site (``Sec-Fetch-Site``), or its ``Origin`` names another
    host or port than its ``Host`` (``Origin: null`` included); True without ``Origin`` (not sent by a page of
    another origin)."""
    if request.headers.get("Sec-Fetch-Site", "").strip().lower() == "cross-site":
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    parsed = urllib.parse.urlsplit(origin.strip())
    host = request.headers.get("Host", "")
    if parsed.scheme not in ("http", "https") or host_name(parsed.netloc) is None or \
            host_name(parsed.netloc) != host_name(host):
        return False
    host_port = _port(host)
    origin_port = _port(parsed.netloc) or (443 if parsed.scheme == "https" else 80)
    return host_port is None or host_port == origin_port


def browser_safe(request):
    """True when no web page could have made a browser send ``request`` here: its ``Host`` names this server
    (:func:`host_allowed`: the DNS-rebinding defence) and it is not cross-origin (:func:`same_origin`)."""
    return host_allowed(request) and same_origin(request)


def check(request):
    """``(allowed, how)`` for a guarded route: how is ``"token"``, ``"loopback"``, or why not (``"remote"``: not
    loopback and no or a wrong token; ``"browser"``: loopback, but a web page of another site may have sent it)."""
    if same_secret(presented_token(request.headers), STATE.config.token):
        return True, "token"
    if not local(request):
        return False, "remote"
    if not browser_safe(request):
        return False, "browser"
    return True, "loopback"


def refusal():
    """The message of a 403 on a guarded route (says what would be allowed, nothing about the state)."""
    hint = ("send the server's COMFY_MEMX_TOKEN as 'Authorization: Bearer <token>'" if STATE.config.token else
            "the server has no COMFY_MEMX_TOKEN set, so only loopback callers may")
    return (f"this route is allowed from loopback (with a Host that names this server: a loopback name or address, "
            f"or one of COMFY_MEMX_ALLOWED_HOSTS; not from a page of another origin), or with a token: {hint}")
