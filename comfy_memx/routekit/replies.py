"""How a route answers: JSON with names and numbers only, an error JSON for a refusal, and a guard around every
handler so that a failing one answers and the server keeps serving.

* :func:`answer`: a JSON response of :func:`clip`\\ped builtins (strings cut to :data:`MAX_TEXT` characters, objects
  that are not JSON values shown as ``<TypeName>``, never through their ``repr``);
* :class:`HttpError`: what a handler raises to refuse (``{"error", "message"}`` with its status, and ``Retry-After``
  for a 429); :class:`~comfy_memx.routekit.bodies.BadBody` is answered the same way;
* :func:`guard`: refuses with 403 a request that ``routekit.access`` does not allow on a guarded route;
* :func:`guarded`: wraps a handler; any other exception is comfy_memx's own (``core.errors.internal_error``,
  logged once) and answers 500.

aiohttp is imported when a response is built only.
"""

import math

from comfy_memx.core.errors import MemxError, internal_error
from comfy_memx.routekit import access, bodies

MAX_TEXT = 300


class HttpError(MemxError):
    """A request the route refuses: ``status`` and a message for the error JSON (``retry_after``: seconds, sent as
    the ``Retry-After`` header of a 429)."""

    def __init__(self, status, kind, message, retry_after=None):
        super().__init__(message)
        self.status, self.kind, self.retry_after = status, kind, retry_after


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


def answer(payload, status=200):
    """The JSON response of ``payload``, clipped (:func:`clip`)."""
    from aiohttp import web
    return web.json_response(clip(payload), status=status)


def guard(request):
    """Raise a 403 :class:`HttpError` unless ``routekit.access`` allows ``request`` on a guarded route."""
    allowed, _how = access.check(request)
    if not allowed:
        raise HttpError(403, "forbidden", access.refusal())


def guarded(name, handler):
    """``handler`` (an aiohttp handler) that answers its refusals as error JSON and its own failures as 500, logged
    once under ``route <name>``; named ``memx_<handler name>``."""
    async def guarded_handler(request):
        try:
            return await handler(request)
        except HttpError as exc:
            response = answer({"error": exc.kind, "message": str(exc)}, status=exc.status)
            if exc.retry_after is not None:
                response.headers["Retry-After"] = str(int(exc.retry_after))
            return response
        except bodies.BadBody as exc:
            return answer({"error": exc.kind, "message": str(exc)}, status=exc.status)
        except Exception as exc:
            internal_error(f"route {name}", exc, answered=True)   # a route still answers
            return answer({"error": "internal", "message": f"{type(exc).__name__}: {exc}"}, status=500)
    guarded_handler.__name__ = guarded_handler.__qualname__ = f"memx_{handler.__name__}"
    return guarded_handler
