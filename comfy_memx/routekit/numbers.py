"""The one parser of the numbers that requests carry: query parameters (``?since=``, ``?timeout=``, ``?bytes=``)
and the numbers of JSON bodies (``routekit.bodies``).

Python's own ``int()``/``float()``/``str.isdigit()`` accept far more than a request should send (``²``, ``５``,
``١``, ``+5``, `` 5 ``, ``1_000``, ``1e3``, ``inf``), and do not even agree with each other (``"²".isdigit()`` is
True, ``int("²")`` raises).  Here a number is ASCII digits only (``[0-9]``, never ``\\d``, which matches every
script's digits), of bounded length, and checked against its bounds; anything else is :class:`BadNumber`, which the
routes answer with 400.

* :func:`whole`: a whole number in a query (``[0-9]+``);
* :func:`decimal`: seconds in a query (``[0-9]+`` with an optional ``.[0-9]+``; no sign, no exponent);
* :func:`json_int`, :func:`json_float`: the ``parse_int``/``parse_float`` hooks of ``json.loads`` for bodies
  (JSON's own number grammar, which allows a sign and an exponent, in ASCII, bounded, finite).
"""

import math
import re

from comfy_memx.core.errors import MemxError

MAX_TIMEOUT_S = 3600.0   # the longest wait a request may ask for (``?timeout=``, a body's ``timeout``), seconds
MAX_DIGITS = 19          # a query's whole part; beyond it no bound of ours is reached anyway
MAX_JSON_CHARS = 40      # a JSON number's text: every float repr and 64-bit integer fits
WHOLE = re.compile(r"[0-9]{1,%d}" % MAX_DIGITS)
DECIMAL = re.compile(r"[0-9]{1,%d}(?:\.[0-9]{1,%d})?" % (MAX_DIGITS, MAX_DIGITS))
JSON_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
JSON_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")


class BadNumber(MemxError, ValueError):
    """The text is not a number of the accepted form, or is outside its bounds."""


def whole(text, minimum=0, maximum=2 ** 63 - 1):
    """The whole number ``text`` (ASCII digits only, at most :data:`MAX_DIGITS`) when ``minimum <= n <= maximum``;
    :class:`BadNumber` otherwise."""
    return _bounded(_matched(WHOLE, text, int), minimum, maximum)


def decimal(text, minimum=0.0, maximum=math.inf):
    """The non-negative decimal ``text`` (``12``, ``0.5``: ASCII digits, an optional fraction, nothing else) as a
    float when ``minimum <= x <= maximum``; :class:`BadNumber` otherwise."""
    return _bounded(_matched(DECIMAL, text, float), minimum, maximum)


def json_int(text):
    """``json.loads``'s ``parse_int``: a JSON integer in ASCII, at most :data:`MAX_JSON_CHARS` characters."""
    return _matched(JSON_INT, text, int, MAX_JSON_CHARS)


def json_float(text):
    """``json.loads``'s ``parse_float``: a finite JSON number in ASCII, at most :data:`MAX_JSON_CHARS` characters
    (``1e999`` is refused: it would be infinity)."""
    value = _matched(JSON_FLOAT, text, float, MAX_JSON_CHARS)
    if not math.isfinite(value):
        raise BadNumber(f"{text[:MAX_JSON_CHARS]!r} is not a finite number")
    return value


def _matched(pattern, text, convert, max_chars=None):
    if not isinstance(text, str) or (max_chars is not None and len(text) > max_chars) or \
            pattern.fullmatch(text) is None:
        raise BadNumber(f"{str(text)[:MAX_JSON_CHARS]!r} is not a number of the accepted form")
    return convert(text)


def _bounded(value, minimum, maximum):
    if not minimum <= value <= maximum:
        raise BadNumber(f"{value} is not between {minimum} and {maximum}")
    return value
