"""Request bodies of comfy_memx's POST routes: bounded in size and depth, every field type-checked.

A body is read whole, however it was split on the wire, up to :data:`MAX_BODY_BYTES` (one more byte is a 413; not
all there within :data:`READ_TIMEOUT_S`: 408), its nesting is measured before it is parsed (deeper than
:data:`MAX_DEPTH`: 400, so a body nested 100k levels deep never reaches the parser's recursion), it must be a JSON
object with finite numbers only (``NaN``, ``Infinity`` and ``1e999`` are refused; numbers are read by
``routekit.numbers``: ASCII, at most 40 characters), and each known field must have its type (:class:`Field`);
unknown fields are ignored, as ComfyUI's own ``/free`` ignores them.
Every refusal is :class:`BadBody` with the HTTP status and a message naming the field.
"""

import asyncio
import dataclasses
import json
import math

from comfy_memx.core.errors import MemxError
from comfy_memx.routekit import numbers

MAX_BODY_BYTES = 16 * 1024
MAX_DEPTH = 8
READ_TIMEOUT_S = 30.0   # the whole body, from the handler's first read


class BadBody(MemxError):
    """The body cannot be used: ``status`` (400, 408 or 413), ``kind`` and a message for the error JSON."""

    def __init__(self, status, kind, message):
        super().__init__(message)
        self.status, self.kind = status, kind


@dataclasses.dataclass(frozen=True)
class Field:
    """One accepted field: its JSON ``kind`` (``bool``, ``int``, ``number``, ``str``), bounds, and a hint."""
    kind: str
    minimum: float = None
    maximum: float = None
    max_chars: int = 300

    def check(self, name, value):
        """Return ``value`` when it has this field's kind and bounds; raise :class:`BadBody` naming ``name``."""
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise _bad(name, "true or false")
            return value
        if self.kind == "str":
            if not isinstance(value, str) or len(value) > self.max_chars:
                raise _bad(name, f"a string of at most {self.max_chars} characters")
            return value
        whole = self.kind == "int"
        if isinstance(value, bool) or not isinstance(value, int if whole else (int, float)):
            raise _bad(name, "a whole number" if whole else "a number")
        if not math.isfinite(value) or (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum):
            raise _bad(name, f"{'a whole number' if whole else 'a number'} between {self.minimum:g} and "
                             f"{self.maximum:g}")
        return value


def _bad(name, wanted):
    return BadBody(400, "bad_field", f'"{name}" must be {wanted}')


async def read_object(request, fields, empty=None):
    """Read ``request``'s body as a JSON object and check it against ``fields`` ({name: :class:`Field`}); returns
    the known fields present.  An empty body gives ``empty`` (a copy; None: ``{}``)."""
    raw = await _read_bounded(request)
    return parse_object(raw, fields, empty)


async def read_bytes(request):
    """``request``'s whole body as bytes, bounded as :func:`read_object` bounds it (for a route that checks a MAC
    over the exact bytes before it parses them with :func:`parse_object`)."""
    return await _read_bounded(request)


def parse_object(raw, fields, empty=None):
    """:func:`read_object` for bytes already read (tests, other transports)."""
    if not raw.strip():
        return dict(empty or {})
    if depth(raw) > MAX_DEPTH:
        raise BadBody(400, "too_deep", f"the body is nested more than {MAX_DEPTH} levels deep")
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_int=numbers.json_int,
                          parse_float=numbers.json_float)
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise BadBody(400, "bad_json", "the body is not JSON with finite numbers") from None
    if not isinstance(body, dict):
        raise BadBody(400, "bad_body", "the body must be a JSON object")
    if not body:
        return dict(empty or {})
    return {name: field.check(name, body[name]) for name, field in fields.items() if name in body}


async def _read_bounded(request):
    """The whole body, however the client split it into segments or chunks (``content.read(n)`` answers only what
    is buffered): read until the end, refused with 413 as soon as it holds one byte more than the bound, and with
    408 when it has not all arrived within :data:`READ_TIMEOUT_S`."""
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        raise BadBody(413, "body_too_large", f"the body must be at most {MAX_BODY_BYTES} bytes")
    try:
        return await asyncio.wait_for(_read_to_end(request.content), READ_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise BadBody(408, "body_timeout", f"the body did not arrive within {READ_TIMEOUT_S:g} s") from None


async def _read_to_end(content):
    chunks, size = [], 0
    while True:
        chunk = await content.read(MAX_BODY_BYTES + 1 - size)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BadBody(413, "body_too_large", f"the body must be at most {MAX_BODY_BYTES} bytes")


def depth(raw):
    """The deepest nesting of ``[``/``{`` in JSON text ``raw`` (bytes), strings skipped; linear, no recursion."""
    deepest = level = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:      # backslash
                escaped = True
            elif byte == 0x22:      # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            level += 1
            if level > deepest:
                deepest = level
                if deepest > MAX_DEPTH:
                    return deepest
        elif byte in (0x5D, 0x7D):
            level -= 1
    return deepest


def _no_constant(name):
    raise ValueError(name)
