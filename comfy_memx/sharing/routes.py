"""The GPU hand-off's routes on ComfyUI's own PromptServer, registered by this wing itself.

=========================  ======  ==============================================================================
route                      method  answer
=========================  ======  ==============================================================================
``/memx/handoff/hello``    POST    prove this instance is the registered peer: ``{"nonce"}`` -> ``{"proof"}``
``/memx/handoff``          POST    a peer of the group asks this instance to unload (signed request only)
``/memx/handoff/request``  POST    ask the idle peers to unload ``?bytes=N`` (guarded, one at a time)
=========================  ======  ==============================================================================

The proofs are ``sharing.peerproof``'s: the hello answers an HMAC of the caller's nonce (nothing else, to anyone);
``/memx/handoff`` serves only a request whose ``X-Memx-Peer-Auth`` verifies (once: a replay is refused), and signs
each answer it gives such a request (``X-Memx-Peer-Proof``).

Only with ``COMFY_MEMX_HANDOFF=host``; otherwise they answer 404 saying that hand-off is off and which setting
turns it on (instead of the 405 that ComfyUI answers for an unknown POST path).  With the setting on but the host
registry unusable (``handoff.start_safely`` logged why), ``/memx/handoff/request`` answers 409 ``handoff_off``
and asks nobody, as the hello does.  They are built with the route kit
that the surface's routes use too (``comfy_memx.routekit``): the same error JSON and guard (``replies.guarded``,
``replies.guard``), the same access rules (``access``), bodies read by ``bodies`` and the blocking work on
``executors.work()``.
"""

import asyncio
import json

from comfy_memx.core.state import STATE
from comfy_memx.routekit import bodies, executors, numbers
from comfy_memx.routekit.bodies import Field
from comfy_memx.routekit.replies import HttpError, answer, clip, guard, guarded
from comfy_memx.sharing import handoff, peerproof

GIVE_FIELDS = {"bytes": Field("int", 0, 2 ** 62), "from": Field("int", 0, 2 ** 62), "device": Field("str"),
               "timeout": Field("number", 0, numbers.MAX_TIMEOUT_S)}
HELLO_FIELDS = {"nonce": Field("str", max_chars=64)}
PATHS = ("/memx/handoff", "/memx/handoff/request", peerproof.HELLO_PATH)
_REGISTERED = "_comfy_memx_handoff_routes"


class HandoffHandlers:
    """The hand-off handlers of one PromptServer (they need its ``prompt_queue``)."""

    def __init__(self, server):
        self.server = server
        self.asking = False  # one /memx/handoff/request at a time

    async def hello(self, request):
        """POST /memx/handoff/hello: prove that this instance is the peer its registry entry names (an HMAC of the
        caller's nonce keyed by its secret; the caller learns nothing else)."""
        nonce = (await bodies.read_object(request, HELLO_FIELDS)).get("nonce")
        if not peerproof.valid_nonce(nonce):
            raise HttpError(400, "bad_nonce", '"nonce" must be 32 lowercase hex digits')
        if handoff.part().registry is None:
            raise HttpError(409, "off", "this instance is not in a hand-off registry")
        return answer({"proof": peerproof.hello_proof(handoff.part().secret, nonce, handoff.identity())})

    async def give(self, request):
        """POST /memx/handoff: a peer of this instance's group asks it to unload (answered only when idle)."""
        raw = await bodies.read_bytes(request)
        own = handoff.part()
        nonce = None if own.registry is None else peerproof.check_request(
            request.headers.get(peerproof.AUTH_HEADER), own.secret, handoff.identity(), raw, own.replays)
        if nonce is None:
            raise HttpError(403, "forbidden", "this route answers only peers of the same hand-off group "
                                              "(COMFY_MEMX_HANDOFF_GROUP) of this user on this host")
        body = bodies.parse_object(raw, GIVE_FIELDS)
        loop = asyncio.get_running_loop()
        status, given = await loop.run_in_executor(executors.work(), handoff.give, self.server.prompt_queue, body)
        return signed(given, status, nonce)

    async def ask(self, request):
        """POST /memx/handoff/request?bytes=N: ask the idle peers on this device to unload N bytes now (guarded;
        one at a time)."""
        guard(request)
        try:
            nbytes = numbers.whole(request.query.get("bytes", ""), 1, GIVE_FIELDS["bytes"].maximum)
        except numbers.BadNumber:
            raise HttpError(400, "bad_bytes", "bytes must be a whole number of bytes > 0") from None
        if handoff.part().registry is None:
            raise HttpError(409, "handoff_off", "GPU hand-off is off in this server: its host registry could not be "
                                                "used safely (the server log says why); no peer was asked")
        if self.asking:
            raise HttpError(429, "busy", "a hand-off request is in progress",
                            retry_after=1 + int(STATE.config.handoff_wait))
        self.asking = True
        try:
            loop = asyncio.get_running_loop()
            return answer(await loop.run_in_executor(executors.work(), handoff.ask_peers, nbytes, "request"))
        finally:
            self.asking = False


def signed(payload, status, nonce):
    """The JSON response of ``payload`` with this instance's proof of its exact bytes for the request of ``nonce``."""
    from aiohttp import web
    raw = json.dumps(clip(payload)).encode()
    proof = peerproof.answer_proof(handoff.part().secret, nonce, raw)
    return web.Response(body=raw, status=status, content_type="application/json",
                        headers={peerproof.PROOF_HEADER: proof})


async def _handoff_off(request):
    raise HttpError(404, "handoff_off", "GPU hand-off is off in this server; start it with COMFY_MEMX_HANDOFF=host "
                                        "to serve this route")


def register(server):
    """Add the hand-off routes to ``server.routes`` when ``COMFY_MEMX_HANDOFF=host``; returns the paths served
    (none when off).  A second call on the same server adds nothing."""
    served = getattr(server, _REGISTERED, None)
    if served is not None:
        return served
    served = []
    if STATE.config.handoff == "host":
        handlers = HandoffHandlers(server)
        server.routes.post(PATHS[0])(guarded(PATHS[0], handlers.give))
        server.routes.post(PATHS[1])(guarded(PATHS[1], handlers.ask))
        server.routes.post(PATHS[2])(guarded(PATHS[2], handlers.hello))
        served = list(PATHS)
    else:
        for path in PATHS:
            server.routes.post(path)(guarded(path, _handoff_off))
    setattr(server, _REGISTERED, served)
    return served
