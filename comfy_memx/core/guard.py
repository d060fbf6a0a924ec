"""Guarded facades: a wing's functions that a patch calls directly, each behind the guard of every other call a patch
makes into a wing.

A signal's or a pair's subscribers run under their guard (``core.signals``, ``core.pairs``).  Where a patch must
call a wing itself, because the wing decides what ComfyUI does next (the pin budget grants, refuses or evicts a
pin), it calls a :class:`Facade` instead: one attribute per function, each a guarded call that answers, when the
function raises an ``Exception``, what ComfyUI would do without comfy_memx (the entry's *fallback*: "not budgeted",
"no grant", "not reordered", or :data:`FAILED` where the wrapper then runs ComfyUI's own code).  The error goes to
``errors.internal_error`` under the kind ``"<facade>.<name> -> <module>.<function>"`` (logged once, counted,
re-raised under the test policy); ``errors.UNCHANGED`` and every non-``Exception`` pass as they are.

:func:`call` is the same guard for one bookkeeping step inside a wing's walk over ComfyUI's state, and
:func:`callback` for a weakref callback or finalizer of a wing: what the interpreter calls there (a model's death)
reports its errors like the rest.

The guard is here, in core, written from the facade's table at import: a fault planted anywhere in the wing (the
fault suite plants one in every function a wing defines) meets it.  Each guarded call is compiled with the wrapped
function's own parameters (no ``*args`` packing: the per-layer pin path calls it for every layer cast).
"""

import inspect

from comfy_memx.core.errors import UNCHANGED, internal_error
from comfy_memx.core.pairs import label

class _Failed:
    __slots__ = ()

    def __repr__(self):
        return "FAILED"


FAILED = _Failed()
"""A fallback meaning "the wing failed: run ComfyUI's own code" (for calls with no answer of their own)."""

FACADES = []
"""Every facade created in this process, in creation order (the fault suite enumerates their entries)."""

_PLAIN_DEFAULTS = (type(None), bool, int, float, str)


def _parameters(fn):
    """The parameter list of ``fn`` as source (``"mm, size, evict_active=False"``) and the call's arguments
    (``"mm, size, evict_active"``), or ``("*args, **kwargs", "*args, **kwargs")`` for anything less plain."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        parameters = None
    plain = parameters is not None and all(
        p.kind is p.POSITIONAL_OR_KEYWORD and (p.default is p.empty or type(p.default) in _PLAIN_DEFAULTS)
        for p in parameters)
    if not plain:
        return "*args, **kwargs", "*args, **kwargs"
    declared = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in parameters)
    return declared, ", ".join(p.name for p in parameters)


def guarded(kind, fn, fallback):
    """``fn`` behind the guard: same parameters, same answer, ``fallback`` after an ``Exception`` (reported under
    ``kind``)."""
    declared, passed = _parameters(fn)
    names = {"_F": fn, "_K": kind, "_FALLBACK": fallback, "_UNCHANGED": UNCHANGED, "_internal_error": internal_error}
    source = (f"def guarded({declared}):\n"
              f"    try:\n"
              f"        return _F({passed})\n"
              f"    except _UNCHANGED:\n"
              f"        raise\n"
              f"    except Exception as _exc:\n"
              f"        _internal_error(_K, _exc)\n"
              f"        return _FALLBACK\n")
    exec(compile(source, f"<comfy_memx guard {kind}>", "exec"), names)   # noqa: S102 (source written from names)
    call = names["guarded"]
    call.__qualname__ = call.__name__ = getattr(fn, "__name__", "guarded")
    call.__doc__ = f"{label(fn)} behind the guard (answers {fallback!r} when it fails)."
    call.__wrapped__ = fn
    return call


def call(kind, fn, *args):
    """``fn(*args)`` behind the guard, for a wing's bookkeeping step that must not undo what came before it (an
    eviction walk that already changed ComfyUI's pins): its answer, or None after an ``Exception`` (reported under
    ``kind``)."""
    try:
        return fn(*args)
    except UNCHANGED:
        raise
    except Exception as exc:
        internal_error(kind, exc)
        return None


def callback(kind, fn):
    """``fn`` as a weakref callback or finalizer, behind the guard: Python would only print what it raises there
    (``sys.unraisablehook``); this sends an ``Exception`` to ``errors.internal_error`` under ``kind`` (logged once,
    counted) like every other error of comfy_memx's books."""
    def guarded(*args):
        try:
            fn(*args)
        except UNCHANGED:
            raise
        except Exception as exc:
            internal_error(kind, exc)
    return guarded


class Facade:
    """A wing's functions behind the guard: ``Facade("pins", {"budgeted": (api.managing, False), ...})`` has an
    attribute ``budgeted`` that calls ``api.managing`` and answers False when it raises."""

    def __init__(self, name, entries):
        self.name = name
        self._entries = {}
        for attr, (fn, fallback) in entries.items():
            kind = f"{name}.{attr} -> {label(fn)}"
            self._entries[attr] = (fn, fallback, kind)
            setattr(self, attr, guarded(kind, fn, fallback))
        FACADES.append(self)

    def __repr__(self):
        return f"<Facade {self.name}: {', '.join(self._entries)}>"

    def guards(self):
        """Every entry as ``(function, error kind)``: what the fault suite plants a failure in."""
        return [(fn, kind) for fn, _fallback, kind in self._entries.values()]

    def fallback(self, attr):
        """What the entry ``attr`` answers when its function fails."""
        return self._entries[attr][1]
