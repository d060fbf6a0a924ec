"""``COMFY_MEMX_HANDOFF=host``: ComfyUI instances on one host hand the GPU to the one that needs it.

Each instance registers itself (pid, device, the URL of its server on 127.0.0.1) in a host registry file
(``comfy_memx.core.hostshare.HostRegistry``: entries of dead processes are dropped by the next access, so a crashed
peer is never asked).  When an instance is about to load models onto a device that is short of free memory, it
asks each peer on the same device, over ``POST /memx/handoff``, to unload; a peer answers only when its own queue
is empty (a peer with a running or waiting prompt is never interrupted, so nothing its prompt needs is unloaded),
and then unloads through its own prompt worker, exactly as ``/memx/free`` does.  The requester waits at most
``COMFY_MEMX_HANDOFF_WAIT`` seconds in all, and both sides write a ``handoff`` event: who asked, who gave, the bytes
asked and freed.  ``POST /memx/handoff/request?bytes=N`` asks the peers by hand (the same path, for operators and
tests); on CPU-only machines (``--cpu``) nothing asks automatically, since there is no device memory to share.

Who belongs: the registry of a group (``COMFY_MEMX_HANDOFF_GROUP``, default ``default``) is a file of its own in
this user's private folder (``core.hostshare.private_dir``), so only this user's instances of the same group find
each other.  Each instance publishes a random peer secret there, and answers ``POST /memx/handoff`` only when the
caller sends that secret back (``X-Memx-Peer``, checked by ``routekit.access``): being able to read the registry is
the proof of membership.  A refusal never says this instance's device.
"""

import json
import logging
import os
import secrets
import sys
import time
import urllib.error
import urllib.request

from comfy_memx.core.comfyui import queue_busy
from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.routekit.access import PEER_HEADER
from comfy_memx.sharing import worker

log = logging.getLogger("comfy_memx")
REGISTRY_NAME = "comfy_memx-instances"
RESERVE_BYTES = 256 * 1024 ** 2   # asked on top of the shortfall, so the load is not short again at once


class Handoff:
    """This instance's entry in the host registry (a part of the process state; ``close`` withdraws it)."""

    def __init__(self):
        self.registry = None
        self.device = None
        self.url = None
        self.secret = None   # what a peer must send in X-Memx-Peer (random per process, published in the registry)

    def close(self):
        """Leave the registry (reset of the process state, shutdown)."""
        registry, self.registry = self.registry, None
        if registry is not None:
            try:
                registry.withdraw()
            except OSError:
                pass


def part():
    """This process's :class:`Handoff`."""
    return STATE.part(Handoff)


def registry_path():
    """The registry file of this user's instances of the hand-off group ``COMFY_MEMX_HANDOFF_GROUP`` on this host
    (in the private folder of the pin registry)."""
    from comfy_memx.core.hostshare import default_registry_path
    return default_registry_path(f"{REGISTRY_NAME}-{STATE.config.handoff_group}")


def start(port):
    """Register this instance (its device and ``http://127.0.0.1:<port>``) when ``COMFY_MEMX_HANDOFF=host``."""
    if STATE.config.handoff != "host" or port is None:
        return None
    from comfy_memx.core.hostshare import HostRegistry
    handoff = part()
    handoff.registry = HostRegistry(registry_path())
    handoff.device = device_identity(sys.modules.get("comfy.model_management"))
    handoff.url = f"http://127.0.0.1:{int(port)}"
    handoff.secret = secrets.token_urlsafe(24)
    handoff.registry.publish(device=handoff.device, url=handoff.url, secret=handoff.secret)
    log.info("comfy_memx: GPU hand-off on: this instance (%s, device %s, group %s) is registered in %s", handoff.url,
             handoff.device, STATE.config.handoff_group, handoff.registry.path)
    return handoff


def device_identity(model_management):
    """A name of the device ComfyUI computes on that is the same in every process: the CUDA device's UUID when
    torch knows it, else ``<type>:<index>``; ``cpu`` on CPU-only machines."""
    if model_management is None:
        return "unknown"
    device = model_management.get_torch_device()
    kind = getattr(device, "type", str(device))
    index = getattr(device, "index", None) or 0
    if kind == "cuda":
        torch = sys.modules.get("torch")
        try:
            return f"cuda:{torch.cuda.get_device_properties(index).uuid}"
        except Exception:
            return f"cuda:{index}"
    return kind if kind == "cpu" else f"{kind}:{index}"


def before_load(model_management, models):
    """Called by the ``load_models_gpu`` wrapper: when the device is short of room for ``models``, ask the idle
    peers on the same device to unload first (bounded by ``COMFY_MEMX_HANDOFF_WAIT``)."""
    handoff = part()
    if handoff.registry is None:
        return None
    device = model_management.get_torch_device()
    if getattr(device, "type", "cpu") == "cpu":
        return None
    need = 0
    for patcher in list(models or ()):
        need += max(0, int(patcher.model_size()) - int(patcher.loaded_size()))
    free = int(model_management.get_free_memory(device))
    shortfall = need + int(model_management.minimum_inference_memory()) - free
    if shortfall <= 0:
        return None
    return ask_peers(shortfall + RESERVE_BYTES, reason="load")


def ask_peers(nbytes, reason="request"):
    """Ask the peers on this instance's device to unload until ``nbytes`` are freed or the wait is over; writes a
    ``handoff`` event (role ``requester``) and returns it."""
    handoff = part()
    started = time.monotonic()
    deadline = started + STATE.config.handoff_wait
    givers, asked = [], []
    freed = 0
    peers = handoff.registry.peers() if handoff.registry is not None else {}
    for _key, peer in sorted(peers.items(), key=lambda item: (item[1].pid, str(item[0]))):
        if peer.data.get("device") != handoff.device or not peer.data.get("url"):
            continue
        left = deadline - time.monotonic()
        if left <= 0 or freed >= nbytes:
            break
        pid = peer.pid
        answer = _ask(peer.data["url"], {"bytes": nbytes - freed, "from": os.getpid(), "device": handoff.device,
                                         "timeout": left}, left, secret=peer.data.get("secret"))
        asked.append({"pid": pid, "status": answer.get("status")})
        if answer.get("status") == "done":
            freed += int(answer.get("freed_bytes") or 0)
            givers.append({"pid": pid, "freed_bytes": int(answer.get("freed_bytes") or 0),
                           "freed": answer.get("freed") or []})
    return STATE.events.emit("handoff", role="requester", reason=reason, device=handoff.device, asked_bytes=nbytes,
                             freed_bytes=freed, peers_asked=asked, givers=givers,
                             seconds=round(time.monotonic() - started, 3)) or {
        "role": "requester", "asked_bytes": nbytes, "freed_bytes": freed, "peers_asked": asked, "givers": givers}


def _ask(url, body, timeout, secret=None):
    if not url.startswith(("http://127.0.0.1:", "http://[::1]:", "http://localhost:")):
        return {"status": "refused", "error": "peers are asked on loopback only"}
    request = urllib.request.Request(url + "/memx/handoff", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", PEER_HEADER: secret or ""})
    try:
        with urllib.request.urlopen(request, timeout=max(0.5, timeout)) as response:
            return json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        try:
            return json.loads(error.read() or b"{}")
        except ValueError:
            return {"status": f"http {error.code}"}
    except (OSError, ValueError) as error:  # a peer that died since it registered, or answers nonsense
        return {"status": "unreachable", "error": str(error)[:200]}


def give(queue, body):
    """A peer asks this instance to unload (``POST /memx/handoff``): refuse when off, on another device or busy;
    else unload through the worker and answer the receipt's figures.  Blocking; run it off the event loop."""
    from comfy_memx.sharing import activity
    handoff = part()
    if handoff.registry is None:
        return 409, {"status": "off", "message": "COMFY_MEMX_HANDOFF is not host on this instance"}
    if body.get("device") != handoff.device:
        return 409, {"status": "other_device", "message": "this instance computes on another device"}
    if queue_busy(queue) or activity.activity().running:
        return 409, {"status": "busy", "message": "a prompt is running or waiting; it is never interrupted"}
    timeout = max(0.5, min(float(body.get("timeout") or STATE.config.handoff_wait), STATE.config.handoff_wait))
    # body: checked by the route (routekit.bodies): bytes/from whole numbers, device a string, timeout finite
    origin = {"kind": "comfy_memx", "via": "handoff", "peer": body.get("from")}
    receipt = worker.unload(queue, origin, timeout=timeout)
    answer = {"status": receipt["status"] if receipt["worker"] != "withdrawn" else "busy",
              "freed_bytes": receipt["freed_bytes"], "freed": [row["model_id"] for row in receipt["freed"]]}
    STATE.events.emit_request("handoff", role="giver", to=body.get("from"), device=handoff.device,
                      asked_bytes=body.get("bytes"), **answer)
    return 200, answer


def start_safely(port):
    """:func:`start`, logging instead of raising (the registry file may be unusable)."""
    from comfy_memx.core.hostshare import RegistryUnavailable
    try:
        return start(port)
    except RegistryUnavailable as exc:  # another user's folder or file, a link: not a bug of ours
        log.warning("comfy_memx: GPU hand-off is off: its registry cannot be used safely (%s)", exc)
        part().registry = part().secret = None
        return None
    except Exception as exc:
        internal_error("GPU hand-off registry", exc)
        return None
