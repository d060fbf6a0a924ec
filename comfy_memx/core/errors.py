"""Exceptions and the guard that keeps comfy_memx's own bugs away from ComfyUI.

comfy_memx runs inside other people's production servers, so an error in our bookkeeping must never fail a
prompt: :func:`internal_error` logs it once per kind and swallows it.  Tests (and ``COMFY_MEMX_RAISE_INTERNAL=1``)
switch :data:`POLICY` to re-raise, so the same errors fail loudly there.  The policy is part of the process state
(``comfy_memx.core.state.STATE.errors``) and is reset with it.
"""

import logging

log = logging.getLogger("comfy_memx")


class MemxError(Exception):
    """Base class of every error comfy_memx raises on purpose."""


class ConfigError(MemxError, ValueError):
    """A setting has a value we cannot accept; the message names the variable and the accepted values.

    ``warnings`` are the typo-guard messages of the same parse (unknown ``COMFY_MEMX_*`` names), so that whoever
    reports the error reports them too; ``setting`` (the variable) and ``accepted`` (its accepted values, in words)
    are what the node pack's inactive ``/memx/status`` shows, when the parse knows them.
    """

    def __init__(self, message, warnings=(), setting=None, accepted=None):
        super().__init__(message)
        self.warnings = tuple(warnings)
        self.setting = setting
        self.accepted = accepted


class SetupError(MemxError):
    """comfy_memx cannot run as installed (for example no patch module was found); the message names the cause."""


class PatchSkipped(MemxError):
    """A patch target is missing from the running ComfyUI; ``str(exc)`` is the reason shown to the user."""


class ErrorPolicy:
    """Whether internal errors are re-raised, and which kinds were already logged (each kind is logged once)."""
    __slots__ = ("raise_internal", "reported_kinds")

    def __init__(self):
        self.reset()

    def reset(self):
        """Back to production behaviour: swallow, and log each kind again once."""
        self.raise_internal = False
        self.reported_kinds = set()


POLICY = ErrorPolicy()


def internal_error(kind, exc, answered=False):
    """Report a bug in comfy_memx's own bookkeeping without disturbing ComfyUI.

    Logs the first error of each ``kind`` with its traceback and ignores repeats, so a broken hook cannot flood
    the log on every load.  Re-raises when the policy says so (tests, ``COMFY_MEMX_RAISE_INTERNAL``), unless
    ``answered``: the caller turns the error into its answer (a route's 500 error JSON, a receipt's ``error``
    field), where a test sees it as data, so raising would only replace that answer with a worse one.
    """
    if POLICY.raise_internal and not answered:
        raise exc
    if kind in POLICY.reported_kinds:
        return
    POLICY.reported_kinds.add(kind)
    log.warning("comfy_memx: internal error in %s (ComfyUI continues; further %s errors are not logged)",
                kind, kind, exc_info=exc)
