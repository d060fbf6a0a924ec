"""Which address a hand-off peer advertises, and which addresses a requester agrees to ask.

An instance advertises a URL on an address its server really listens on (ComfyUI's ``--listen``, a comma list):
never a loopback address it does not hold, since another user of the host could bind that one and be asked in its
place.  A wildcard holds loopback (``0.0.0.0`` -> ``127.0.0.1``, ``::`` -> ``[::1]``); a specific address is
advertised as it is (``10.0.0.5``, ``[::1]``, ``127.0.0.2``); a name is resolved to the addresses the server binds
for it.  Of several, a loopback one is preferred (its traffic never leaves the host), else the first.

A requester asks only URLs on an address of this host (:func:`held_here`: a socket can be bound to it): peers are
this user's instances on this host, whatever the registry says.
"""

import ipaddress
import socket
import urllib.parse


def _addresses(entry):
    """The IP addresses a server listening on ``entry`` (one item of ``--listen``) can be reached at from here."""
    entry = entry.strip().strip("[]")
    if entry in ("0.0.0.0", ""):
        return ["127.0.0.1"]
    if entry == "::":
        return ["::1"]
    try:
        return [str(ipaddress.ip_address(entry))]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(entry, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [info[4][0] for info in found]


def _is_loopback(address):
    try:
        return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def advertised_url(listen, port):
    """The URL to advertise for a server on ``listen`` (ComfyUI's ``--listen``: an address, a name or a comma list;
    None: ComfyUI's default 127.0.0.1) and ``port``; None when no entry gives a usable address."""
    found = []
    for entry in str(listen if listen is not None else "127.0.0.1").split(","):
        found.extend(address for address in _addresses(entry) if address not in found)
    if not found:
        return None
    address = next((a for a in found if _is_loopback(a)), found[0])
    return f"http://[{address}]:{int(port)}" if ":" in address else f"http://{address}:{int(port)}"


def held_here(url):
    """True when ``url`` is ``http://<an IP address of this host>:<port>`` (a name or another host's address is not
    asked)."""
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
        address = ipaddress.ip_address(host.split("%", 1)[0]) if host else None
    except ValueError:
        return False
    if parts.scheme != "http" or address is None or port is None:
        return False
    if address.is_loopback:
        return True
    if address.is_unspecified or address.is_multicast:
        return False
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))   # succeeds only for an address of this host
        return True
    except OSError:
        return False
