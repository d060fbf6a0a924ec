"""Exceptions and the guard that keeps comfy_memx's own bugs away from ComfyUI.

comfy_memx runs inside other people's production servers, so an error in our bookkeeping must never fail a
prompt: :func:`internal_error` logs it once per kind, counts it by kind (its *site*: ``GET /memx/status``'s
``internal_errors`` and the ``comfy_memx_internal_errors_total`` metric read :func:`error_counts`) and swallows it.
Tests (and ``COMFY_MEMX_RAISE_INTERNAL=1``) switch :data:`POLICY` to re-raise, so the same errors fail loudly there.
The policy is part of the process state (``comfy_memx.core.state.STATE.errors``) and is reset with it.

:data:`UNCHANGED` are the ``Exception`` subclasses every guard lets through as they are (``MemoryError``,
``RecursionError``: swallowing them would hide a process that is dying or a stack that is exhausted, and ComfyUI's
own code would meet them at its next step anyway); every ``BaseException`` that is not an ``Exception``
(``KeyboardInterrupt``, ``SystemExit``, ``GeneratorExit``) passes a guard too.
"""

import logging
import threading

log = logging.getLogger("comfy_memx")


class MemxError(Exception):
    """Base class of every error comfy_memx raises on purpose."""


class ConfigError(MemxError, ValueError):
    """A setting has a value we cannot accept; the message names the variable and the accepted values.

    ``warnings`` are the typo-guard messages of the same parse (unknown ``COMFY_MEMX_*`` names), so that whoever
    reports the error reports them too; ``setting`` (the variable) and ``accepted`` (its accepted values, in words)
    are what the node pack's inactive ``/memx/status`` shows, when the parse knows them; ``fix`` what to do, when
    setting ``setting`` to an accepted value or unsetting it is not the whole answer.
    """

    def __init__(self, message, warnings=(), setting=None, accepted=None, fix=None):
        super().__init__(message)
        self.warnings = tuple(warnings)
        self.setting = setting
        self.accepted = accepted
        self.fix = fix


class SetupError(MemxError):
    """comfy_memx cannot run as installed (for example no patch module was found); the message names the cause."""


class PatchSkipped(MemxError):
    """A patch target is missing from the running ComfyUI; ``str(exc)`` is the reason shown to the user."""


UNCHANGED = (MemoryError, RecursionError)
"""The ``Exception`` subclasses a guard lets through as they are (every non-``Exception`` passes anyway)."""

MAX_SITES = 64
"""Distinct kinds counted by name; later new kinds are counted under :data:`OTHER_SITE`.  Kinds are written in
comfy_memx's code (a subscriber's label, a facade call's name), so a process meets a few dozen at most: the bound
keeps the metric's label set finite whatever happens."""
OTHER_SITE = "other"

# Held for one dict read and one store of an int under a kind string: nothing that allocates a garbage-collected
# object, so no collection (hence no callback that reports an error) can start while it is held.
_count_lock = threading.Lock()


class ErrorPolicy:
    """Whether internal errors are re-raised, which kinds were already logged (each kind is logged once), and how
    many errors each kind had (``counts``: kind -> number, at most :data:`MAX_SITES` kinds plus
    :data:`OTHER_SITE`)."""
    __slots__ = ("raise_internal", "reported_kinds", "counts")

    def __init__(self):
        self.reset()

    def reset(self):
        """Back to production behaviour: swallow, log each kind again once, count from zero."""
        self.raise_internal = False
        self.reported_kinds = set()
        self.counts = {}


POLICY = ErrorPolicy()


def error_counts():
    """``{kind: number}`` of the internal errors of this process since the last reset (a copy, taken without the
    lock: copying allocates, and a dict's copy is one step under the GIL)."""
    return dict(POLICY.counts)


def _count(kind):
    counts = POLICY.counts
    with _count_lock:
        site = kind if kind in counts or len(counts) < MAX_SITES else OTHER_SITE
        counts[site] = counts.get(site, 0) + 1


def internal_error(kind, exc, answered=False):
    """Report a bug in comfy_memx's own bookkeeping without disturbing ComfyUI.

    Logs the first error of each ``kind`` with its traceback and ignores repeats, so a broken hook cannot flood
    the log on every load.  Re-raises when the policy says so (tests, ``COMFY_MEMX_RAISE_INTERNAL``), unless
    ``answered``: the caller turns the error into its answer (a route's 500 error JSON, a receipt's ``error``
    field), where a test sees it as data, so raising would only replace that answer with a worse one.  Every error
    is counted under ``kind`` first (:func:`error_counts`).
    """
    _count(kind)
    if POLICY.raise_internal and not answered:
        raise exc
    if kind in POLICY.reported_kinds:
        return
    POLICY.reported_kinds.add(kind)
    log.warning("comfy_memx: internal error in %s (ComfyUI continues; further %s errors are not logged)",
                kind, kind, exc_info=exc)
