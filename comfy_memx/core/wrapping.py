"""The patch/unpatch primitive every patch module uses: wrap one attribute, remember the original, undo exactly.

The house contract (see ``comfy_memx.core.patching``):

* patching twice does not double-wrap; originals are saved first-wins, before the ``setattr``;
* unpatching restores the identical object (``is``), and a second unpatch does nothing;
* patch -> unpatch -> patch works;
* if another extension wrapped over ours, unpatching does not clobber it: our wrapper is switched to pass-through
  (and switched back on by the next patch);
* if another extension *replaced* ours (its function does not reach our wrapper: no ``__wrapped__``, closure or
  module global leads to it), :func:`audit` wraps the replacement on top and switches the old wrapper to
  pass-through, so every call is counted once whichever way the replacement calls on; unpatching then leaves the
  replacement in place;
* class attributes are read from the class ``__dict__`` (never through the descriptor protocol), so the saved
  original is the raw function; an inherited attribute is shadowed on patch and deleted again on unpatch.

Wrappers are plain closures (a closure costs about 0.5 us per call here; wrapt's wrappers cost 1-2 us).
"""

import functools
import logging
import types

from comfy_memx.core.errors import PatchSkipped
from comfy_memx.core.state import STATE

log = logging.getLogger("comfy_memx")

_MISSING = object()


class Switch:
    """The on/off state a wrapper reads on every call; off means pure pass-through to the original."""
    __slots__ = ("on",)

    def __init__(self):
        self.on = True


class _Installed:
    __slots__ = ("owner", "attr", "original", "owned", "wrapper", "switch", "make_wrapper", "site", "over_us")

    def __init__(self, owner, attr, original, owned, wrapper, switch, make_wrapper=None, site=None):
        self.owner, self.attr, self.original, self.owned = owner, attr, original, owned
        self.wrapper, self.switch, self.make_wrapper, self.site = wrapper, switch, make_wrapper, site
        self.over_us = None   # the foreign wrapper last seen to reach ours (not checked again)


def resolve(module, dotted):
    """Return ``(owner, attr)`` for ``"func"`` or ``"Class.method"`` inside ``module``; raise PatchSkipped if absent."""
    *owner_path, attr = dotted.split(".")
    owner = module
    for part in owner_path:
        owner = getattr(owner, part, _MISSING)
        if owner is _MISSING:
            raise PatchSkipped(f"{'.'.join(owner_path)} absent in this ComfyUI")
    if _raw_attr(owner, attr) is _MISSING:
        raise PatchSkipped("absent in this ComfyUI")
    return owner, attr


def _raw_attr(owner, attr):
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr]
        return _MISSING
    return vars(owner).get(attr, _MISSING)


def wrap(module, dotted, make_wrapper, site=None):
    """Install ``make_wrapper(original, switch)`` over ``module.<dotted>``; return "patched" or "already patched".

    ``make_wrapper`` must return a callable that calls ``original`` unchanged when ``switch.on`` is False; ``site``
    is what :func:`audit` reports the site as (the patch's ``(name, dotted)``).
    """
    owner, attr = resolve(module, dotted)
    key = (id(owner), attr)
    current = _raw_attr(owner, attr)
    installed = STATE.wrapped.get(key)
    if installed is not None:
        if current is installed.wrapper and installed.switch.on:
            return "already patched"
        if not installed.switch.on:
            installed.switch.on = True
            if current is not installed.wrapper:
                log.info("comfy_memx: %s.%s is wrapped by another extension; re-enabled comfy_memx's wrapper beneath it",
                         _name(owner), attr)
            return "patched"
    switch = Switch()
    wrapper = make_wrapper(current, switch)
    functools.update_wrapper(wrapper, current)
    owned = attr in vars(owner)  # False for an inherited method: unpatch deletes our shadowing attribute
    STATE.wrapped[key] = _Installed(owner, attr, current, owned, wrapper, switch, make_wrapper, site)
    setattr(owner, attr, wrapper)
    return "patched"


_REACH_DEPTH = 6


def reaches(func, wrapper, depth=_REACH_DEPTH):
    """True when calling ``func`` can be seen to reach ``wrapper``: it is ``wrapper``, or leads to it through
    ``__wrapped__`` (``functools.wraps``), a closure cell, a module global of its own module, a partial's
    function or a bound method's function, within ``depth`` steps.  Reads plain fields only (no user code)."""
    if func is wrapper:
        return True
    if depth <= 0:
        return False
    if isinstance(func, functools.partial):
        return reaches(func.func, wrapper, depth - 1)
    if isinstance(func, types.MethodType):
        return reaches(func.__func__, wrapper, depth - 1)
    if not isinstance(func, types.FunctionType):
        return False
    wrapped = func.__dict__.get("__wrapped__")
    if wrapped is not None and reaches(wrapped, wrapper, depth - 1):
        return True
    for cell in func.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if value is wrapper or (callable(value) and reaches(value, wrapper, depth - 1)):
            return True
    namespace = func.__globals__
    return type(namespace) is dict and any(value is wrapper for value in dict.values(namespace))


def audit():
    """Find the sites whose wrapper another extension replaced, wrap each replacement on top, and return
    ``[(site, owner name, attr, replacement)]`` for the ones newly handled (each is reported once).

    A replacement that only wraps ours (:func:`reaches`) is left alone, as wrapping over us is."""
    handled = []
    for key, installed in list(STATE.wrapped.items()):
        if not installed.switch.on or installed.make_wrapper is None:
            continue
        current = _raw_attr(installed.owner, installed.attr)
        if current is installed.wrapper or current is _MISSING or current is installed.over_us:
            continue
        if reaches(current, installed.wrapper):
            installed.over_us = current
            continue
        switch = Switch()
        wrapper = installed.make_wrapper(current, switch)
        functools.update_wrapper(wrapper, current)
        replacement = _Installed(installed.owner, installed.attr, current, True, wrapper, switch,
                                 installed.make_wrapper, installed.site)
        installed.switch.on = False   # whatever still calls the old wrapper passes through: counted once, above
        STATE.wrapped[key] = replacement
        setattr(installed.owner, installed.attr, wrapper)
        handled.append((installed.site, _name(installed.owner), installed.attr, current))
    return handled


def unwrap(module, dotted):
    """Undo :func:`wrap`; return "restored", "disabled under a foreign wrapper" or "not patched"."""
    try:
        owner, attr = resolve(module, dotted)
    except PatchSkipped:
        return "not patched"
    key = (id(owner), attr)
    installed = STATE.wrapped.get(key)
    if installed is None:
        return "not patched"
    current = _raw_attr(owner, attr)
    if current is not installed.wrapper:
        if installed.switch.on:
            installed.switch.on = False
            log.info("comfy_memx: %s.%s was wrapped over by another extension; leaving it in place and switching "
                     "comfy_memx's wrapper to pass-through", _name(owner), attr)
        return "disabled under a foreign wrapper"
    if installed.owned:
        setattr(owner, attr, installed.original)
    else:
        delattr(owner, attr)
    installed.switch.on = False  # a stale alias (``from comfy.utils import f``) to the wrapper now passes through
    del STATE.wrapped[key]
    return "restored"


def original_of(module, dotted):
    """The saved original of a patched attribute, or the current attribute when comfy_memx did not patch it."""
    owner, attr = resolve(module, dotted)
    installed = STATE.wrapped.get((id(owner), attr))
    return installed.original if installed is not None else getattr(owner, attr)


def _name(owner):
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
