"""comfy_memx's HTTP routes on ComfyUI's own PromptServer: ``/memx/models``, ``/memx/free`` and the metrics.

=====================  ======  ==================================================================================
route                  method  answer
=====================  ======  ==================================================================================
``/memx/models``       GET     JSON list: one object per model in the ledger (loaded, offloaded or leaked)
``/memx/timeline``     GET     the memory panel's history (``surface.timeline``): entries after ``?since=`` (seq)
``/memx/``             GET     the standalone memory page, its files under ``/memx/web/`` (``surface.panel``)
``/memx/free``         POST    ComfyUI's ``/free`` body; waits for the prompt worker, then the receipt (200), or
                               what is known when ``?timeout=`` seconds (default 60) passed first (202); with
                               ``"release": true`` also releases the survivors (403 before anything is unloaded
                               while COMFY_MEMX_RELEASE=off or for a caller that may not release)
``/memx/models/{id}/   POST    a strict holder search of one live model now (bounded by COMFY_MEMX_LEAK_BUDGET);
search``                       404 for an unknown model_id; guarded; 429 + Retry-After when another search runs or
                               the CPU budget is spent (``leaks.gate``)
``/memx/models/{id}/   POST    cut the pack-cache entry that keeps a leaked model alive (``leaks.release``; body
release``                      ``{"path"}`` optional), on ComfyUI's prompt worker between prompts; guarded; 403
                               while COMFY_MEMX_RELEASE=off; the receipt, 200 when cut, 409 changed, in use, or
                               ``prompt_running`` (a prompt ran past ``?timeout=``, default 60: Retry-After, nothing
                               cut), 422 not a cache that may be cut, 429 busy
``/memx/status``       GET     version, activation, leak mode, release policy, every patch site, the pin figures,
                               this process's RSS and the bytes its leaked models hold
``/memx/releases``     GET     the receipts of the last 64 releases tried (``surface.releases``): the panel's
                               Released list
``/memx/runbooks``     GET     the runbook page of the alert rules (``fleet.api``); every alert's runbook_url
``/metrics``           GET     Prometheus text (``surface.metrics``); only when no other extension serves it
``/memx/metrics``      GET     the same, always
=====================  ======  ==================================================================================

ComfyUI also serves each of them under ``/api``.  They are built with the route kit (``comfy_memx.routekit``): who
may call the POSTs is ``routekit.access``'s decision (guarded: loopback or the token); their bodies are read by
``routekit.bodies`` (bounded, typed: 400/413, never 500); ``/memx/models`` answers from the event loop (its kept
snapshot, ``surface.answers``), the other reads run on ``executors.reads()``, everything that can take long on
``executors.work()``.  Apart from the POSTs they only read state; none accepts a file path; answers
hold names and numbers, never tensors (``routekit.replies.clip``: strings cut to 300 characters, objects that are
not JSON values shown as ``<TypeName>``, never through their ``repr``).  A failing handler answers an error JSON
(``{"error", "message"}``) and the server keeps serving (``routekit.replies.guarded``).  aiohttp is imported by
:func:`register` only.

The hand-off's routes (``/memx/handoff``, ``/memx/handoff/request``) are the sharing wing's own: ``sharing.routes``
registers them with the same kit.
"""

import asyncio
import functools
import json
import logging

from comfy_memx.core import registry
from comfy_memx.core.state import STATE
from comfy_memx.fleet import api as fleet
from comfy_memx.leaks import api as leaks
from comfy_memx.routekit import access, bodies, executors, numbers
from comfy_memx.routekit.bodies import Field
from comfy_memx.routekit.replies import HttpError, answer, clip, guard, guarded
from comfy_memx.surface import answers, freeing, metrics, panel, readmodel, releases, retention, timeline

log = logging.getLogger("comfy_memx")

DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = numbers.MAX_TIMEOUT_S
NUDGE_S = 0.5            # while the worker has not read the flags, it is woken this often
METRICS_PATH = "/metrics"
OWN_METRICS_PATH = "/memx/metrics"
FREE_ALL = {"unload_models": True, "free_memory": True}
_REGISTERED = "_comfy_memx_routes"


def can_observe_worker():
    """True when the ``PromptQueue.get_flags`` wrapper, which hands free requests to the worker run that reads their
    flags (``surface.freeing``), is on."""
    return registry.is_patched("execution", "PromptQueue.get_flags")


# -- the handlers --------------------------------------------------------------------------------------------------

FREE_FIELDS = {"unload_models": Field("bool"), "free_memory": Field("bool"), "release": Field("bool")}
RELEASE_FIELDS = {"path": Field("str", max_chars=2000)}
# a release's outcome -> (HTTP status, error kind); 200 answers carry no error
RELEASE_ANSWERS = {"released": (200, None), "survivor": (200, None), "changed": (409, "changed"),
                   "in_use": (409, "in_use"), "refused": (422, "not_releasable"), "failed": (409, "cut_failed"),
                   "gone": (404, "unknown_model"), "busy": (429, "busy")}
NOT_SEARCHED = "not searched: holder searches are allowed from loopback or with COMFY_MEMX_TOKEN (docs/security.md)"
RELEASE_OFF = ("release is off in this server: start it with COMFY_MEMX_RELEASE=ask (or auto) to let comfy_memx cut a "
               "pack's cache entry")
RELEASE_GRACE_S = 2.0    # a free's releases wait at least this long for the worker, even past the free's timeout
RETRY_AFTER_S = 5        # Retry-After of a release refused because a prompt ran until the timeout


class Handlers:
    """The route handlers of one PromptServer (they need its ``prompt_queue``)."""

    def __init__(self, server):
        self.server = server

    async def models(self, request):
        """GET /memx/models, answered on the event loop as ComfyUI answers ``/queue``: the kept body while no row
        changed, else only the changed rows rebuilt (``surface.answers``); it never waits for an executor thread."""
        from aiohttp import web
        return web.Response(body=answers.models_snapshot().body(), content_type="application/json")

    async def status(self, request):
        """GET /memx/status: comfy_memx's version, how it was activated, its leak mode and every patch site's state
        (``patched``, ``skipped`` with its reason, or ``rewrapped``: another pack replaced it, comfy_memx wraps the
        replacement), the pinned bytes against the caps (``readmodel.pin_facts``, as in the metrics), and this
        process's resident memory (``process``: ``rss_bytes``, what the panel shows beside the machine's RAM).
        Nothing of the settings' values beyond the leak mode, the release policy and its packages, and the pin cap
        in force."""
        from comfy_memx._version import __version__
        return answer({"version": __version__, "source": STATE.source, "leak_mode": STATE.config.leak_mode,
                      "release": STATE.config.release, "release_packages": list(STATE.config.release_packages),
                      "sites": registry.site_status(),
                      "pins": readmodel.pin_facts(), "process": {"rss_bytes": retention.rss_bytes()}})

    async def releases(self, request):
        """GET /memx/releases: the receipts of the last releases tried (``surface.releases``), whatever started
        them (the Release button, ``free --release``, ``COMFY_MEMX_RELEASE=auto``); read on the reads executor."""
        from aiohttp import web
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(executors.reads(), _releases_body)
        return web.Response(body=body, content_type="application/json")

    async def runbooks(self, request):
        """GET /memx/runbooks: the runbook page every alert's ``runbook_url`` points at (``fleet.api``), one heading
        per alert; an open read, like the panel's files."""
        from aiohttp import web
        return web.Response(body=fleet.runbooks_page(), content_type="text/html",
                            headers={"Cache-Control": "no-cache"})

    async def timeline(self, request):
        """GET /memx/timeline?since=N: the timeline entries numbered above N (``surface.timeline``; clipped and
        serialized on the reads executor, up to 4096 entries)."""
        try:
            since = numbers.whole(request.query.get("since", "0"))
        except numbers.BadNumber:
            raise HttpError(400, "bad_since", "since must be a whole number >= 0 (the 'next' of the last answer)") \
                from None
        from aiohttp import web
        loop = asyncio.get_running_loop()
        body = await loop.run_in_executor(executors.reads(), _timeline_body, since)
        return web.Response(body=body, content_type="application/json")

    async def free(self, request):
        """POST /memx/free: set ComfyUI's free flags, wait for the worker run that reads them, answer the receipt.
        Open to every caller, as ComfyUI's own ``/free`` is; the survivors' holder searches only for the guarded
        callers (``routekit.access``).  With ``release``: refused (403) before anything is unloaded when release is
        off or the caller may not release; else the survivors whose holder is known are released on ComfyUI's
        prompt worker between prompts (waiting for a running prompt until ``timeout``) before the receipt is
        written."""
        body = await bodies.read_object(request, FREE_FIELDS, empty=FREE_ALL)
        timeout = _timeout(request)
        unload_models, free_memory = body.get("unload_models", False), body.get("free_memory", False)
        if not (unload_models or free_memory):
            raise HttpError(400, "nothing_to_free", 'set "unload_models" and/or "free_memory" to true')
        release = body.get("release", False)
        if release:
            _may_release(request)
        allowed, _how = access.check(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        queue = self.server.prompt_queue
        observable = can_observe_worker()
        running = freeing.prompt_running(queue)
        ticket = freeing.submit(queue, unload_models=unload_models, free_memory=free_memory, follow=observable,
                                origin={"kind": "http", "route": "/memx/free", "client": request.remote})
        try:
            done = await _wait_done(ticket, timeout) if observable else False
        finally:
            freeing.end(ticket)
        survey = await loop.run_in_executor(executors.work(), freeing.take_survey, ticket, None,
                                            done and (True if allowed else NOT_SEARCHED), done and release)
        releases, note, state = [], None, None
        if release and not done:
            note, state = "not released: the prompt worker did not finish freeing in time; nothing was cut", \
                freeing.NOT_RUN
        elif release:
            releases, note, state = await _release_survivors(survey, max(RELEASE_GRACE_S, deadline - loop.time()))
        receipt = await loop.run_in_executor(executors.work(), _finish_free, survey, releases, done, (note, state))
        receipt["prompt_running_at_request"] = running
        if not observable:
            receipt["note"] = ("comfy_memx's PromptQueue.get_flags wrapper is off (COMFY_MEMX_DISABLE=execution?), "
                               "so the worker cannot be followed; the flags were set")
        elif not done and ticket.withdrawn:
            receipt["note"] = (f"the prompt worker did not read the flags within {timeout:g} s (a running prompt "
                               "delays it); they were withdrawn, nothing was unloaded for this request")
        elif not done:
            receipt["note"] = (f"the prompt worker had not finished freeing after {timeout:g} s; survivors so far "
                               "are the leaked models only")
        return answer(receipt, status=200 if done else 202)

    async def search(self, request):
        """POST /memx/models/{model_id}/search: search the holders of one live model now (guarded, one at a time,
        within the CPU budget: 429 with Retry-After otherwise)."""
        guard(request)
        record = _record(request)
        model_id = record.model_id
        loop = asyncio.get_running_loop()
        try:
            leaks.search_gate().refuse_early()
            found = await loop.run_in_executor(executors.work(), leaks.gated_search, record)
        except leaks.Busy as busy:
            raise HttpError(429, busy.why, _busy_message(busy), retry_after=busy.retry_after) from None
        return answer({"model": record.model, "model_id": model_id, **found})

    async def release(self, request):
        """POST /memx/models/{model_id}/release: cut the pack-cache entry that keeps one leaked model alive and answer
        the receipt (guarded, as the search; off unless COMFY_MEMX_RELEASE is ask or auto).  The cut runs on
        ComfyUI's prompt worker between prompts: while a prompt runs it waits for it up to ``?timeout=`` seconds
        (default 60), then answers 409 ``prompt_running`` with ``Retry-After`` and nothing is cut later."""
        guard(request)
        if STATE.config.release == "off":
            raise HttpError(403, "release_off", RELEASE_OFF)
        record = _record(request)
        body = await bodies.read_object(request, RELEASE_FIELDS, empty={})
        timeout = _timeout(request)
        loop = asyncio.get_running_loop()
        try:
            if needs_search(record):
                leaks.search_gate().refuse_early()
            referrers = await loop.run_in_executor(executors.work(), holders_for_release, record)
        except leaks.Busy as busy:
            raise HttpError(429, busy.why, _busy_message(busy), retry_after=busy.retry_after) from None
        work = functools.partial(leaks.release, record, "http", path=body.get("path"), referrers=referrers)
        job = await loop.run_in_executor(executors.work(), leaks.submit_release, work, "http")
        if not await _wait_release(job, timeout):
            raise HttpError(409, "prompt_running", f"a prompt is running and did not end within {timeout:g} s; "
                            "releases run on ComfyUI's prompt worker between prompts: nothing was cut, ask again",
                            retry_after=RETRY_AFTER_S)
        receipt = job.result
        if receipt is None:
            raise HttpError(500, "internal", "the release failed inside comfy_memx; nothing is known to be cut "
                                             "(the server log has the traceback)")
        status, kind = RELEASE_ANSWERS.get(receipt["outcome"], (500, "internal"))
        if status == 429:
            raise HttpError(429, "busy", receipt["reason"], retry_after=1)
        payload = {"model": record.model, "model_id": record.model_id, "release": receipt}
        if status != 200:
            payload = {"error": kind, "message": receipt["reason"], **payload}
        return answer(payload, status=status)

    async def metrics(self, request):
        """GET /metrics and /memx/metrics: Prometheus text, or 501 without prometheus_client."""
        from aiohttp import web
        installed = metrics.installed() or metrics.install()
        if installed is None:
            return answer({"error": "metrics_unavailable", "message": metrics.INSTALL_HINT}, status=501)
        loop = asyncio.get_running_loop()
        body, content_type = await loop.run_in_executor(executors.reads(), installed.exposition)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response


def _record(request):
    """The ledger record of the route's ``{model_id}`` (400 for an overlong id, 404 for no live model)."""
    model_id = request.match_info["model_id"]
    if len(model_id) > 300:
        raise HttpError(400, "bad_model_id", "a model_id is at most 300 characters")
    record = next((r for r in STATE.ledger.records() if r.model_id == model_id), None)
    if record is None:
        raise HttpError(404, "unknown_model", f"no live model {model_id!r} (see GET /memx/models)")
    return record


def needs_search(record):
    """True when no search of ``record``'s model has named its holders with the steps to walk them again (a model
    ComfyUI never warned about, say a survivor of a free): a release searches it first."""
    leak = record.leak or {}
    return not (leak.get("stage") == "rooted" and leak.get("referrers") and record.holder_steps)


def holders_for_release(record):
    """The holders a release of ``record`` acts on: its leak report's, else those of a search run now through the
    search gate.  Blocking: call it on ``executors.work()``; raises ``leaks.Busy`` when that search cannot run."""
    if not needs_search(record):
        return list(record.leak["referrers"])
    return leaks.gated_search(record).get("holders") or []


def _releases_body():
    return json.dumps(clip(releases.view())).encode("utf-8")


def _timeline_body(since):
    return json.dumps(clip(timeline.install().view(since))).encode("utf-8")


def _busy_message(busy):
    if busy.why == "cpu_budget":
        return (f"holder searches used their CPU budget (COMFY_MEMX_SEARCH_CPU={STATE.config.search_cpu:g} s per "
                f"minute); retry in {busy.retry_after} s")
    return f"another holder search is running; retry in {busy.retry_after} s"


def _finish_free(survey, releases, done, release):
    """The receipt and the ``free`` event of a finished wait and its releases (``release``: the receipt's
    ``release_note`` and ``release_state``; blocking: runs on the work executor, never on the event loop)."""
    note, state = release
    receipt = freeing.write_receipt(survey, releases, done, release_note=note, release_state=state)
    freeing.record_free(survey.request, receipt)
    return receipt


def _may_release(request):
    """Refuse a ``/memx/free`` with ``release`` before anything is unloaded: 403 when release is off, or when the
    caller may not release (neither loopback nor the token, as the release route)."""
    if STATE.config.release == "off":
        raise HttpError(403, "release_off", RELEASE_OFF + "; nothing was unloaded (send the free without "
                                                          "\"release\" to free only)")
    allowed, _how = access.check(request)
    if not allowed:
        raise HttpError(403, "forbidden", access.refusal() + "; nothing was unloaded")


async def _release_survivors(survey, timeout):
    """Release the survivors of ``survey`` whose holder is known, on the release desk (ComfyUI's prompt worker,
    between prompts), waiting at most ``timeout`` seconds for it; returns ``(receipts, note or None, the receipt's
    release_state)``."""
    loop = asyncio.get_running_loop()
    job = await loop.run_in_executor(executors.work(), freeing.queue_releases, survey)
    if job is None:
        return [], None, freeing.RELEASE_DONE
    if not await _wait_release(job, timeout):
        return [], freeing.RELEASE_WITHDRAWN, freeing.WITHDRAWN
    if job.result is None:
        return [], "not released: the release failed inside comfy_memx (the server log has the traceback)", \
            freeing.RELEASE_DONE
    return job.result, None, freeing.RELEASE_DONE


def _timeout(request):
    text = request.query.get("timeout")
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        return numbers.decimal(text, 0, MAX_TIMEOUT_S)
    except numbers.BadNumber:
        raise HttpError(400, "bad_timeout", f"timeout must be seconds between 0 and {MAX_TIMEOUT_S:g} (digits, "
                                            "an optional fraction: 0.5)") from None


async def _wait_done(ticket, timeout):
    """Wait until the worker run that read ``ticket``'s flags is done, nudging the worker while it has not read
    them; returns whether it is done."""
    async def poke():
        freeing.nudge(ticket)
    return await _wait_for(ticket, timeout, poke)


async def _wait_release(job, timeout):
    """Wait until the release desk ran ``job`` (``leaks.release.desk``), nudging the prompt worker (with no worker
    seen in this process, running it on the work executor once no prompt runs); when ``timeout`` passes first, the
    job is withdrawn (nothing is cut later) and False returned, unless the worker has started it (then its end is
    awaited)."""
    loop = asyncio.get_running_loop()

    async def poke():
        if leaks.worker_seen():
            leaks.nudge_worker()
        else:
            await loop.run_in_executor(executors.work(), leaks.run_release_if_idle, job)
    if await _wait_for(job, timeout, poke) or not leaks.withdraw_release(job):
        await _wait_for(job, MAX_TIMEOUT_S, poke)   # started between prompts: it ends soon
        return job.done
    return False


async def _wait_for(pending, timeout, poke):
    """Wait until ``pending`` (a free ticket or a release job: ``done``, ``add_done_callback``) is done or ``timeout``
    seconds passed, calling ``poke()`` every :data:`NUDGE_S` meanwhile; returns ``pending.done``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    woken = loop.create_future()

    def settle():
        if not woken.done():
            woken.set_result(True)

    def wake():
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed while the worker was busy
            pass

    pending.add_done_callback(wake)
    while not pending.done:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            await asyncio.wait_for(asyncio.shield(woken), min(NUDGE_S, remaining))
        except asyncio.TimeoutError:
            await poke()
    return pending.done


# -- registration ----------------------------------------------------------------------------------------------------

def metrics_path_taken(server):
    """True when another extension already serves GET /metrics (in ``server.routes`` or on its app's router)."""
    taken = {METRICS_PATH, "/api" + METRICS_PATH}
    for route in list(getattr(server, "routes", ())):
        path = getattr(route, "path", None) or getattr(route, "prefix", None)
        if path in taken and getattr(route, "method", "GET") in ("GET", "*", "HEAD"):
            return True
    app = getattr(server, "app", None)
    router = getattr(app, "router", None)
    for resource in list(router.resources()) if router is not None else ():
        if getattr(resource, "canonical", None) in taken:
            return True
    return False


def register(server):
    """Add comfy_memx's routes to ``server.routes`` (ComfyUI's PromptServer, before its ``add_routes``).

    Returns the list of paths served.  A second call on the same server adds nothing.
    """
    served = getattr(server, _REGISTERED, None)
    if served is not None:
        return served
    handlers = Handlers(server)
    STATE.events.avoid_loop(getattr(server, "loop", None))   # no events-file I/O on ComfyUI's server loop
    routes = server.routes
    routes.get("/memx/models")(guarded("/memx/models", handlers.models))
    routes.get("/memx/status")(guarded("/memx/status", handlers.status))
    routes.get("/memx/timeline")(guarded("/memx/timeline", handlers.timeline))
    routes.get("/memx/releases")(guarded("/memx/releases", handlers.releases))
    routes.get("/memx/runbooks")(guarded("/memx/runbooks", handlers.runbooks))
    routes.post("/memx/free")(guarded("/memx/free", handlers.free))
    routes.post("/memx/models/{model_id}/search")(guarded("/memx/models/{model_id}/search", handlers.search))
    routes.post("/memx/models/{model_id}/release")(guarded("/memx/models/{model_id}/release", handlers.release))
    metrics_handler = guarded("metrics", handlers.metrics)
    routes.get(OWN_METRICS_PATH)(metrics_handler)
    served = ["/memx/models", "/memx/status", "/memx/timeline", "/memx/releases", "/memx/runbooks", "/memx/free",
              "/memx/models/{model_id}/search", "/memx/models/{model_id}/release", OWN_METRICS_PATH,
              *panel.register(routes)]
    timeline.install()
    if metrics_path_taken(server):
        log.info("comfy_memx: another extension already serves %s; comfy_memx's metrics are at %s",
                 METRICS_PATH, OWN_METRICS_PATH)
    else:
        routes.get(METRICS_PATH)(metrics_handler)
        served.append(METRICS_PATH)
    setattr(server, _REGISTERED, served)
    return served
