"""Exceptions and the guard that keeps comfy_memx's own bugs away from ComfyUI.

comfy_memx runs inside other people's production servers, so an error in our bookkeeping must never fail a
prompt: :func:`internal_error` logs it once per kind and swallows it.  Tests set :data:`RAISE_INTERNAL` so the
same errors fail loudly there; the bootstrap sets it from ``COMFY_MEMX_RAISE_INTERNAL`` (``config`` is the only
module that reads the environment).
"""

import logging

log = logging.getLogger("comfy_memx")

RAISE_INTERNAL = False
_reported_kinds = set()


class MemxError(Exception):
    """Base class of every error comfy_memx raises on purpose."""


class ConfigError(MemxError, ValueError):
    """A setting has a value we cannot accept; the message names the variable and the accepted values."""


class PatchSkipped(MemxError):
    """A patch target is missing from the running ComfyUI; ``str(exc)`` is the reason shown to the user."""


def internal_error(kind, exc):
    """Report a bug in comfy_memx's own bookkeeping without disturbing ComfyUI.

    Logs the first error of each ``kind`` with its traceback and ignores repeats, so a broken hook cannot flood
    the log on every load.  Re-raises when :data:`RAISE_INTERNAL` is set (tests).
    """
    if RAISE_INTERNAL:
        raise exc
    if kind in _reported_kinds:
        return
    _reported_kinds.add(kind)
    log.warning("comfy_memx: internal error in %s (ComfyUI continues; further %s errors are not logged)",
                kind, kind, exc_info=exc)
