"""Which patch modules exist, arming them on their ComfyUI targets, and what was patched or skipped (and why).

Each patch module applies on its own: a missing site is skipped with its reason and the others still apply
(ddtrace's ``_monkey``).  The one startup line is logged when ``server`` finished importing: main.py imports it
right after ``comfy.utils`` and ``execution`` (which pull in ``comfy.model_management``, ``nodes`` and, from 0.27.0,
``comfy.pinned_memory``), so every site is settled by then; a target still not imported is listed as skipped.
Programs that never import ``server`` get the line at their first model load instead.
"""

import functools
import importlib
import logging

from comfy_memx import importhook, wrapping
from comfy_memx.config import PATCH_NAMES
from comfy_memx.errors import PatchSkipped, internal_error

log = logging.getLogger("comfy_memx")
ANNOUNCE_AFTER = "server"

_status = {}       # (patch name, site) -> (state, reason)
_armed = {}        # patch name -> target module name, for patches whose target is not imported yet
announced = False


def patch_module(name):
    """Import and return ``comfy_memx.patches.<name>`` (imports no ComfyUI or torch module)."""
    return importlib.import_module(f"comfy_memx.patches.{name}")


def patch_sites(module, sites):
    """Wrap each ``{dotted: factory(module, original, switch)}`` site of ``module``; returns {site: result}."""
    results = {}
    for dotted, factory in sites.items():
        try:
            results[dotted] = wrapping.wrap(module, dotted, functools.partial(factory, module))
        except PatchSkipped as skipped:
            results[dotted] = skipped
    return results


def unpatch_sites(module, sites):
    """Undo :func:`patch_sites` in reverse order; returns {site: result}."""
    return {dotted: wrapping.unwrap(module, dotted) for dotted in reversed(list(sites))}


def arm(cfg):
    """Register post-import hooks for every enabled patch (applied at once if the target is already imported)."""
    for name in PATCH_NAMES:
        if name in cfg.disable:
            for site in patch_module(name).SITES:
                _status[(name, site)] = ("skipped", "disabled by COMFY_MEMX_DISABLE")
            continue
        _armed[name] = patch_module(name).TARGET
        importhook.when_imported(_armed[name], functools.partial(apply, name))
    importhook.when_imported(ANNOUNCE_AFTER, lambda _module: announce())


def apply(name, module):
    """Patch ``module`` with patch module ``name`` and record each site's result."""
    patches = patch_module(name)
    _armed.pop(name, None)
    for site, result in patches.patch(module).items():
        if isinstance(result, PatchSkipped):
            _status[(name, site)] = ("skipped", str(result))
            log.debug("comfy_memx: skipped %s (%s)", site, result)
        else:
            _status[(name, site)] = ("patched", None)
    adopt = getattr(patches, "adopt", None)
    if adopt is not None:
        try:
            adopt(module)
        except Exception as exc:
            internal_error(f"adopting existing state of {name}", exc)


def remove_all():
    """Unpatch every applied patch whose target is imported, and drop pending hooks."""
    import sys
    importhook.discard()
    _armed.clear()
    for name in PATCH_NAMES:
        patches = patch_module(name)
        module = sys.modules.get(patches.TARGET)
        if module is not None:
            patches.unpatch(module)
    _status.clear()


def _ordered_status():
    order = {name: i for i, name in enumerate(PATCH_NAMES)}
    return sorted(_status.items(), key=lambda item: order.get(item[0][0], len(order)))


def site_status():
    """[{"patch", "site", "state", "reason"}] for every site seen so far, in patch order."""
    return [{"patch": name, "site": site, "state": state, "reason": reason}
            for (name, site), (state, reason) in _ordered_status()]


def _label(name, site):
    """A site as shown to users: model_management's sites bare, the others prefixed with their module."""
    target = patch_module(name).TARGET
    return site if target == "comfy.model_management" else f"{target}.{site}"


def startup_line(version, source, leak_mode):
    """The one INFO line logged when comfy_memx is active; skipped sites are grouped by reason."""
    patched = [_label(name, site) for (name, site), (state, _) in _ordered_status() if state == "patched"]
    skipped = {}
    for (name, site), (state, reason) in _ordered_status():
        if state == "skipped":
            skipped.setdefault(reason, []).append(_label(name, site))
    for name, target in _armed.items():
        skipped.setdefault(f"{target} not imported", []).extend(_label(name, site) for site in patch_module(name).SITES)
    line = f"comfy_memx {version} active ({source}, leak mode {leak_mode}): patched {', '.join(patched) or 'nothing'}"
    if skipped:
        line += "; skipped " + "; ".join(f"{', '.join(sites)} ({reason})" for reason, sites in skipped.items())
    return line


def announce(force=False):
    """Log the startup line once (and the config warnings queued by the bootstrap)."""
    global announced
    if announced and not force:
        return
    announced = True
    from comfy_memx import __version__, runtime
    for warning in runtime.config.warnings:
        log.warning("comfy_memx: %s", warning)
    log.info(startup_line(__version__, runtime.source, runtime.config.leak_mode))


def reset():
    """Forget statuses and the announcement (tests)."""
    global announced
    _status.clear()
    _armed.clear()
    announced = False
