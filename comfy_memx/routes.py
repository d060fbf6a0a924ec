"""comfy_memx's HTTP routes on ComfyUI's own PromptServer: ``/memx/models``, ``/memx/free`` and the metrics.

=====================  ======  ==================================================================================
route                  method  answer
=====================  ======  ==================================================================================
``/memx/models``       GET     JSON list: one object per model in the ledger (loaded, offloaded or leaked)
``/memx/free``         POST    ComfyUI's ``/free`` body; waits for the prompt worker, then the receipt (200), or
                               what is known when ``?timeout=`` seconds (default 60) passed first (202)
``/metrics``           GET     Prometheus text (``comfy_memx.metrics``); only when no other extension serves it
``/memx/metrics``      GET     the same, always
=====================  ======  ==================================================================================

ComfyUI also serves each of them under ``/api``.  Apart from ``/memx/free`` they only read state; none accepts a
file path; answers hold names and numbers, never tensors, and every string is cut to :data:`MAX_TEXT` characters
(objects that are not JSON values appear as ``<TypeName>``, never through their ``repr``).  A failing handler
answers an error JSON (``{"error", "message"}``) and the server keeps serving.  aiohttp is imported by
:func:`register` only; :func:`model_rows` and :func:`pin_facts` are plain functions that the metrics reuse.
"""

import asyncio
import json
import logging
import math
import sys

from comfy_memx import freeing, metrics, runtime
from comfy_memx.errors import internal_error

log = logging.getLogger("comfy_memx")

MAX_TEXT = 300
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0
NUDGE_S = 0.5            # while the worker has not started on the flags, they are set again this often
METRICS_PATH = "/metrics"
OWN_METRICS_PATH = "/memx/metrics"
FREE_ALL = {"unload_models": True, "free_memory": True}
_REGISTERED = "_comfy_memx_routes"


class HttpError(Exception):
    """A request the route refuses: ``status`` and a message for the error JSON."""

    def __init__(self, status, kind, message):
        super().__init__(message)
        self.status, self.kind = status, kind


def clip(value, limit=MAX_TEXT):
    """``value`` as JSON-safe builtins with every string cut to ``limit`` characters; no ``repr`` of objects."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit - 1] + "\u2026"
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {clip(key if isinstance(key, str) else str(key), limit): clip(item, limit)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clip(item, limit) for item in value]
    return f"<{type(value).__name__}>"


# -- what the routes read ------------------------------------------------------------------------------------------

def model_rows(model_management=None):
    """One dict per live model in the ledger: identity, bytes by device, pinned bytes, owner, times, leak state.

    ``state`` is ``loaded`` (weights on the load device), ``offloaded`` (a ModelPatcher still refers to it) or
    ``leaked`` (ComfyUI warned about it, or no ModelPatcher refers to it any more).  Attribute reads only.
    """
    mm = model_management if model_management is not None else sys.modules.get("comfy.model_management")
    listed = _listed_modules(mm)
    rows = []
    for record in runtime.ledger.records():
        module = record.module_ref()
        if module is None:
            continue
        row = _row(record, module, mm, listed)
        del module
        rows.append(row)
    return rows


def _listed_modules(mm):
    listed = set()
    for entry in list(getattr(mm, "current_loaded_models", ()) if mm is not None else ()):
        module = entry.real_model() if entry.real_model is not None else None
        if module is not None and entry.model is not None:
            listed.add(id(module))
        del module
    return listed


def _row(record, module, mm, listed):
    patcher = _live_patcher(record, module)
    if patcher is not None:
        loaded = int(patcher.loaded_size() or 0)
        size = int(record.model_bytes or patcher.model_size() or 0)
        load_device, offload_device = str(patcher.load_device), str(patcher.offload_device)
    else:
        loaded = int(getattr(module, "model_loaded_weight_memory", 0) or 0)
        size = int(record.model_bytes or 0)
        load_device, offload_device = str(record.device), _parameter_device(module)
    by_device = {}
    for device, nbytes in ((load_device, loaded), (offload_device, size - loaded)):
        if nbytes > 0:
            by_device[device] = by_device.get(device, 0) + nbytes
    if record.leak is not None or patcher is None:
        state = "leaked"
    else:
        state = "loaded" if loaded > 0 else "offloaded"
    last = record.unloads[-1] if record.unloads else None
    return {"model": record.model, "model_id": record.model_id, "state": state, "bytes": size,
            "loaded_bytes": loaded, "load_device": load_device, "bytes_by_device": by_device,
            "pinned_bytes": _pinned_bytes(record, patcher, mm), "owner": record.owner._asdict(),
            "loaded_at": record.loaded_at, "last_used": record.last_used, "loads": record.loads,
            "unloads": len(record.unloads),
            "last_unload": {k: last[k] for k in ("reason", "bytes", "time")} if last else None,
            "in_comfyui_loaded_list": id(module) in listed, "leak": record.leak}


def _live_patcher(record, module):
    for ref in list(record.patchers.values()):
        patcher = ref()
        if patcher is not None and getattr(patcher, "model", None) is module:
            return patcher
    return None


def _parameter_device(module):
    parameters = getattr(module, "parameters", None)
    try:
        first = next(iter(parameters()), None) if parameters is not None else None
    except Exception:
        first = None
    return str(first.device) if first is not None else "unknown"


def _pinned_bytes(record, patcher, mm):
    pinning = sys.modules.get("comfy_memx.pinning")
    budget = pinning.budget() if pinning is not None else None
    if budget is not None:
        return int(budget.pinned(record.model_id))
    if patcher is None:
        return 0
    total = 0
    try:
        total += int(patcher.pinned_memory_size() or 0) if hasattr(patcher, "pinned_memory_size") else 0
    except Exception:  # a dynamic patcher without pins for its device raises inside ComfyUI's accessor
        pass
    table = getattr(mm, "PINNED_MEMORY", None)
    if table:
        for key in list(getattr(patcher, "pinned", ()) or ()):
            weight = _attribute_path(patcher.model, key)
            pointer = getattr(weight, "data_ptr", None)
            if pointer is not None:
                total += int(table.get(pointer(), 0))
    return total


def _attribute_path(obj, dotted):
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def pin_facts(model_management=None):
    """``{"pinned_bytes", "cap_bytes", "comfyui_cap_bytes"}``: pinned host memory now, comfy_memx's cap in force
    (None when comfy_memx does not budget pins) and ComfyUI's own ``MAX_PINNED_MEMORY`` (None before 0.27.0)."""
    mm = model_management if model_management is not None else sys.modules.get("comfy.model_management")
    pinning = sys.modules.get("comfy_memx.pinning")
    cap = pinning.cap() if pinning is not None else None
    comfyui_cap = pinning.comfyui_max() if pinning is not None else None
    if comfyui_cap is None and mm is not None:
        comfyui_cap = getattr(mm, "MAX_PINNED_MEMORY", None)
    pinned = getattr(mm, "TOTAL_PINNED_MEMORY", 0) if mm is not None else 0
    return {"pinned_bytes": int(pinned or 0), "cap_bytes": cap.bytes if cap is not None else None,
            "comfyui_cap_bytes": int(comfyui_cap) if comfyui_cap is not None else None}


def can_observe_worker():
    """True when the ``unload_all_models`` wrapper that announces /free work to :mod:`comfy_memx.freeing` is on."""
    from comfy_memx import registry
    return any(row["patch"] == "model_management" and row["site"] == "unload_all_models"
               and row["state"] == "patched" for row in registry.site_status())


# -- the handlers --------------------------------------------------------------------------------------------------

class Handlers:
    """The route handlers of one PromptServer (they need its ``prompt_queue``)."""

    def __init__(self, server):
        self.server = server

    async def models(self, request):
        """GET /memx/models."""
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(None, model_rows)
        return _json(rows)

    async def free(self, request):
        """POST /memx/free: set ComfyUI's free flags, wait for the worker, answer the receipt."""
        body = await _free_body(request)
        timeout = _timeout(request)
        unload_models, free_memory = bool(body.get("unload_models", False)), bool(body.get("free_memory", False))
        if not (unload_models or free_memory):
            raise HttpError(400, "nothing_to_free", 'set "unload_models" and/or "free_memory" to true')
        queue = self.server.prompt_queue
        observable = can_observe_worker()
        watch = freeing.begin(unload_models=unload_models, free_memory=free_memory)
        try:
            running = freeing.prompt_running(queue)
            freeing.set_flags(watch, queue)
            done = await _wait_done(watch, queue, timeout) if observable else False
            loop = asyncio.get_running_loop()
            receipt = await loop.run_in_executor(None, freeing.receipt, watch, None, done)
        finally:
            freeing.end(watch)
        receipt["prompt_running_at_request"] = running
        if not observable:
            receipt["note"] = ("comfy_memx's unload_all_models wrapper is off (COMFY_MEMX_DISABLE?), so the worker "
                               "cannot be followed; the flags were set")
        elif not done:
            receipt["note"] = (f"the prompt worker had not finished freeing after {timeout:g} s "
                               "(a running prompt delays it); survivors so far are the leaked models only")
        return _json(receipt, status=200 if done else 202)

    async def metrics(self, request):
        """GET /metrics and /memx/metrics: Prometheus text, or 501 without prometheus_client."""
        from aiohttp import web
        installed = metrics.installed() or metrics.install()
        if installed is None:
            return _json({"error": "metrics_unavailable", "message": metrics.INSTALL_HINT}, status=501)
        loop = asyncio.get_running_loop()
        body, content_type = await loop.run_in_executor(None, installed.exposition)
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response


async def _free_body(request):
    raw = await request.read()
    if not raw.strip():
        return dict(FREE_ALL)
    try:
        body = json.loads(raw)
    except ValueError:
        raise HttpError(400, "bad_json", "the body is not JSON; send ComfyUI's /free body, e.g. "
                        '{"unload_models": true, "free_memory": true}') from None
    if not isinstance(body, dict):
        raise HttpError(400, "bad_body", "the body must be a JSON object")
    return body


def _timeout(request):
    text = request.query.get("timeout")
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 <= value <= MAX_TIMEOUT_S):
        raise HttpError(400, "bad_timeout", f"timeout must be seconds between 0 and {MAX_TIMEOUT_S:g}")
    return value


async def _wait_done(watch, queue, timeout):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    woken = loop.create_future()

    def settle():
        if not woken.done():
            woken.set_result(True)

    def wake():
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop closed while the worker was freeing
            pass

    watch.add_done_callback(wake)
    while not watch.done:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            await asyncio.wait_for(asyncio.shield(woken), min(NUDGE_S, remaining))
        except asyncio.TimeoutError:
            freeing.nudge(watch, queue)
    return watch.done


def _json(payload, status=200):
    from aiohttp import web
    return web.json_response(clip(payload), status=status)


def _guarded(name, handler):
    async def guarded(request):
        try:
            return await handler(request)
        except HttpError as exc:
            return _json({"error": exc.kind, "message": str(exc)}, status=exc.status)
        except Exception as exc:
            try:
                internal_error(f"route {name}", exc)
            except Exception:  # tests re-raise internal errors; a route still answers
                pass
            return _json({"error": "internal", "message": f"{type(exc).__name__}: {exc}"}, status=500)
    guarded.__name__ = guarded.__qualname__ = f"memx_{handler.__name__}"
    return guarded


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
    routes = server.routes
    routes.get("/memx/models")(_guarded("/memx/models", handlers.models))
    routes.post("/memx/free")(_guarded("/memx/free", handlers.free))
    metrics_handler = _guarded("metrics", handlers.metrics)
    routes.get(OWN_METRICS_PATH)(metrics_handler)
    served = ["/memx/models", "/memx/free", OWN_METRICS_PATH]
    if metrics_path_taken(server):
        log.info("comfy_memx: another extension already serves %s; comfy_memx's metrics are at %s",
                 METRICS_PATH, OWN_METRICS_PATH)
    else:
        routes.get(METRICS_PATH)(metrics_handler)
        served.append(METRICS_PATH)
    setattr(server, _REGISTERED, served)
    return served
