"""``COMFY_MEMX_HANDOFF=host``: ComfyUI instances on one host hand the GPU to the one that needs it.

Each instance registers itself (pid, device, the URL of its server, the device bytes it holds) in a host registry
file (``comfy_memx.core.hostshare.HostRegistry``: entries of dead processes are dropped by the next access, so a
crashed peer is never asked).  The URL is on an address the server really listens on (``sharing.address``: never a
loopback address it does not hold).  When an instance is about to load models onto a device that is short of free
memory, it asks each peer on the same device, over ``POST /memx/handoff``, to unload; a peer answers only when its
own queue is empty (a peer with a running or waiting prompt is never interrupted, so nothing its prompt needs is
unloaded), and then unloads through its own prompt worker, exactly as ``/memx/free`` does.  The requester waits at
most ``COMFY_MEMX_HANDOFF_WAIT`` seconds in all, and both sides write a ``handoff`` event: who asked, who gave, the
bytes asked and freed.  ``POST /memx/handoff/request?bytes=N`` asks the peers by hand (the same path, for operators
and tests); on CPU-only machines (``--cpu``) nothing asks automatically, since there is no device memory to share.

Who belongs: the registry of a group (``COMFY_MEMX_HANDOFF_GROUP``, default ``default``) is a file of its own in
this user's private folder (``core.hostshare.private_dir``), so only this user's instances of the same group find
each other.  Each instance publishes a random peer secret there; the secret never travels: a peer proves it is the
registered one, and a request proves it comes from the group, by HMACs keyed by that secret over fresh nonces
(``sharing.peerproof``), asked by ``sharing.asking``.  What is believed of an answer is bounded: a peer that does
not prove itself, or does not answer a hello within ``sharing.asking.PEER_ANSWER_S`` seconds, is skipped (and the
next one asked), and so is a proven peer that does not answer its unload request within
``sharing.asking.PEER_UNLOAD_S`` seconds; the bytes it says it freed are clipped to the bytes its registry entry
says it holds (``held_bytes``, published at the end of each prompt and after each hand-off).  A refusal never says
this instance's device.
"""

import logging
import os
import secrets
import sys
import time

from comfy_memx.core import signals
from comfy_memx.core.comfyui import queue_busy
from comfy_memx.core.errors import internal_error
from comfy_memx.core.state import STATE
from comfy_memx.sharing import address, asking, peerproof, worker

log = logging.getLogger("comfy_memx")
REGISTRY_NAME = "comfy_memx-instances"
RESERVE_BYTES = 256 * 1024 ** 2   # asked on top of the shortfall, so the load is not short again at once


class Handoff:
    """This instance's entry in the host registry (a part of the process state; ``close`` withdraws it)."""

    def __init__(self):
        self.registry = None
        self.device = None
        self.url = None
        self.secret = None   # the key of this instance's proofs (random per process, published in the registry)
        self.replays = peerproof.Replays()
        self.held_bytes = None   # what this instance last published that it holds on its device
        self.unproven = set()    # registry tokens of peers whose failed proof was logged (once each)

    def close(self):
        """Leave the registry (reset of the process state, shutdown)."""
        registry, self.registry = self.registry, None
        if registry is not None:
            signals.load.unsubscribe(before_load)
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


def start(port, listen=None):
    """Register this instance (its device and the URL of ``listen``/``port``: ``sharing.address``) when
    ``COMFY_MEMX_HANDOFF=host``."""
    if STATE.config.handoff != "host" or port is None:
        return None
    url = address.advertised_url(listen, port)
    if url is None:
        log.warning("comfy_memx: GPU hand-off is off: no address of --listen %s can be advertised", listen)
        return None
    from comfy_memx.core.hostshare import HostRegistry
    handoff = part()
    handoff.registry = HostRegistry(registry_path())
    handoff.device = device_identity(sys.modules.get("comfy.model_management"))
    handoff.url = url
    handoff.secret = secrets.token_urlsafe(24)
    handoff.held_bytes = held_bytes()
    handoff.registry.publish(device=handoff.device, url=handoff.url, secret=handoff.secret,
                             held_bytes=handoff.held_bytes)
    signals.load.subscribe(before_load)   # only now: a server without hand-off pays nothing for it per load
    log.info("comfy_memx: GPU hand-off on: this instance (%s, device %s, group %s) is registered in %s", handoff.url,
             handoff.device, STATE.config.handoff_group, handoff.registry.path)
    return handoff


def held_bytes():
    """The bytes ComfyUI's loaded models hold on their devices now (what a hand-off could free at most)."""
    mm = sys.modules.get("comfy.model_management")
    total = 0
    for entry in list(getattr(mm, "current_loaded_models", ())):
        patcher = entry.model
        total += int(patcher.loaded_size()) if patcher is not None else 0
    return total


def publish_held():
    """Publish what this instance holds now, when it changed (the end of a prompt, after a hand-off): the bound of
    what a peer believes it freed."""
    handoff = part()
    if handoff.registry is None:
        return
    now = held_bytes()
    if now != handoff.held_bytes:
        handoff.registry.publish(held_bytes=now)
        handoff.held_bytes = now


def identity():
    """This instance's identity in its proofs (``sharing.peerproof.identity``)."""
    handoff = part()
    return peerproof.identity(handoff.registry.me, handoff.url)


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


def before_load(model_management, models, caller_frame=None):
    """The ``load`` pair's "before" half while this instance is registered (:func:`start` subscribes it,
    :meth:`Handoff.close` drops it): when the device is short of room for ``models``, ask the idle peers on the same
    device to unload first (bounded by ``COMFY_MEMX_HANDOFF_WAIT``)."""
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
        if deadline - time.monotonic() <= 0 or freed >= nbytes:
            break
        answer = asking.ask(peer, {"bytes": nbytes - freed, "from": os.getpid(), "device": handoff.device},
                            deadline)
        row, gave = _credit(peer, answer)
        asked.append(row)
        if gave is not None:
            freed += gave["freed_bytes"]
            givers.append(gave)
    return STATE.events.emit("handoff", role="requester", reason=reason, device=handoff.device, asked_bytes=nbytes,
                             freed_bytes=freed, peers_asked=asked, givers=givers,
                             seconds=round(time.monotonic() - started, 3)) or {
        "role": "requester", "asked_bytes": nbytes, "freed_bytes": freed, "peers_asked": asked, "givers": givers}


def _whole(value):
    """``value`` when it is a whole number >= 0 (not a bool), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _credit(peer, answer):
    """The ``peers_asked`` row of ``peer``'s ``answer`` and its ``givers`` row (None when it gave nothing): the
    bytes it says it freed, clipped to what its registry entry says it holds (``clipped_from`` then says what it
    claimed).  A peer that did not prove itself is logged once."""
    status = answer.get("status") if isinstance(answer.get("status"), str) else "bad_answer"
    row = {"pid": peer.pid, "status": status}
    if status == "unproven" and peer.token not in part().unproven:
        part().unproven.add(peer.token)
        log.warning("comfy_memx: hand-off peer pid %s at %s did not prove it is the registered instance (%s); it is "
                    "skipped", peer.pid, peer.data.get("url"), answer.get("error"))
    if status != "done":
        return row, None
    claimed = answer.get("freed_bytes")
    claimed = int(claimed) if isinstance(claimed, (int, float)) and not isinstance(claimed, bool) and \
        0 <= claimed < 2 ** 63 else 0
    credited = min(claimed, _whole(peer.data.get("held_bytes")))
    freed = answer.get("freed") if isinstance(answer.get("freed"), list) else []
    gave = {"pid": peer.pid, "freed_bytes": credited, "freed": [str(model)[:200] for model in freed[:64]]}
    if credited < claimed:
        row["clipped_from"] = gave["clipped_from"] = claimed
    return row, gave


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
    publish_held()
    return 200, answer


def start_safely(port, listen=None):
    """:func:`start`, logging instead of raising (the registry file may be unusable)."""
    from comfy_memx.core.hostshare import RegistryUnavailable
    try:
        return start(port, listen)
    except RegistryUnavailable as exc:  # another user's folder or file, a link: not a bug of ours
        log.warning("comfy_memx: GPU hand-off is off: its registry cannot be used safely (%s)", exc)
        part().close()
        part().secret = None
        return None
    except Exception as exc:
        internal_error("GPU hand-off registry", exc)
        return None
