"""Which patch modules exist, arming them on their ComfyUI targets, and what was patched or skipped (and why).

Each patch applies on its own: a missing site is skipped with its reason and the others still apply (ddtrace's
``_monkey``).  The one startup line is logged when ``server`` finished importing: main.py imports it right after
``comfy.utils`` and ``execution`` (which pull in ``comfy.model_management``, ``nodes`` and, from 0.27.0,
``comfy.pinned_memory``), so every site is settled by then; a target still not imported is listed as skipped.
Programs that never import ``server`` get the line at their first model load instead.
"""

import functools
import importlib
import logging
import sys

from comfy_memx._version import __version__
from comfy_memx.core import importhook, late, signals, wrapping
from comfy_memx.core.comfyui import package_of_file
from comfy_memx.core.config import PATCH_NAMES
from comfy_memx.core.discovery import subscription_modules
from comfy_memx.core.errors import PatchSkipped, internal_error
from comfy_memx.core.state import STATE

log = logging.getLogger("comfy_memx")
ANNOUNCE_AFTER = "server"


class PatchTable:
    """What happened to every patch site in this process (a part of the process state)."""

    def __init__(self):
        self.status = {}     # (patch name, site) -> (state, reason)
        self.armed = {}      # patch name -> target module name, for patches whose target is not imported yet
        self.announced = False


def table():
    """This process's :class:`PatchTable`."""
    return STATE.part(PatchTable)


def patch_of(name):
    """The ``PATCH`` object of ``comfy_memx.patches.<name>`` (importing it imports no ComfyUI or torch module)."""
    return importlib.import_module(f"comfy_memx.patches.{name}").PATCH


def load_subscriptions():
    """Import every wing's ``subscriptions`` module (each subscribes its handlers to ``core.signals`` at import, and
    its wing registers its setting checks and state fields); returns their names."""
    names = subscription_modules()
    for name in names:
        importlib.import_module(name)
    return names


def load_patches():
    """Import the wings' subscriptions, then every patch module; returns the PATCHes."""
    load_subscriptions()
    return [patch_of(name) for name in PATCH_NAMES]


def arm(cfg):
    """Register post-import hooks for every enabled patch (applied at once if the target is already imported)."""
    patches = table()
    for name in PATCH_NAMES:
        patch = patch_of(name)
        if name in cfg.disable:
            for site in patch.sites:
                patches.status[(name, site)] = ("skipped", "disabled by COMFY_MEMX_DISABLE")
            continue
        patches.armed[name] = patch.target
        importhook.when_imported(patch.target, functools.partial(apply, name))
    importhook.when_imported(ANNOUNCE_AFTER, lambda _module: announce())


def apply(name, module):
    """Patch ``module`` with patch ``name`` and record each site's result."""
    patch = patch_of(name)
    patches = table()
    patches.armed.pop(name, None)
    for site, result in patch.patch(module).items():
        if isinstance(result, PatchSkipped):
            patches.status[(name, site)] = ("skipped", str(result))
            log.debug("comfy_memx: skipped %s (%s)", site, result)
        else:
            patches.status[(name, site)] = ("patched", None)
    try:
        patch.adopt(module)
    except Exception as exc:
        internal_error(f"adopting existing state of {name}", exc)


def remove_all():
    """Unpatch every applied patch whose target is imported, and drop pending hooks."""
    importhook.discard()
    patches = table()
    patches.armed.clear()
    for name in PATCH_NAMES:
        patch = patch_of(name)
        module = sys.modules.get(patch.target)
        if module is not None:
            patch.unpatch(module)
    patches.status.clear()


def is_patched(name, site):
    """True when site ``site`` of patch ``name`` is applied in this process."""
    return table().status.get((name, site), (None,))[0] in ("patched", "rewrapped")


def _function_name(func):
    """``module.qualname`` of a function, with a custom node's module named from its folder (ComfyUI registers a
    pack's module under its file path)."""
    module = getattr(func, "__module__", None) or "?"
    module = module.replace("\\", "/").rsplit("/", 1)[-1]
    return f"{module}.{getattr(func, '__qualname__', '?')}"


def audit():
    """Notice the sites whose wrapper another pack replaced (it no longer calls ours), wrap the replacement on top,
    and say so once per site: a log line and the site's status ``rewrapped`` (``site_status``).

    Run at the start of every prompt and after every node: a pack such as ComfyUI-MultiGPU replaces
    ``load_models_gpu`` from inside a node.  Costs one attribute read per site when nothing changed."""
    handled = wrapping.audit()
    if not handled:
        return []
    patches = table()
    noticed = []
    for key, owner_name, attr, replacement in handled:
        code = getattr(replacement, "__code__", None)
        package = package_of_file(getattr(code, "co_filename", "")) or "?"
        who = _function_name(replacement)
        reason = f"replaced by {who} (package {package}); comfy_memx wraps the replacement"
        if key is not None:
            patches.status[tuple(key)] = ("rewrapped", reason)
        log.warning("comfy_memx: %s.%s was replaced by %s (package %s) without calling comfy_memx's wrapper; "
                    "comfy_memx now wraps the replacement, so its loads and unloads stay in the ledger",
                    owner_name, attr, who, package)
        noticed.append({"site": f"{owner_name}.{attr}", "replaced_by": who, "package": package})
    return noticed


def _ordered_status():
    order = {name: i for i, name in enumerate(PATCH_NAMES)}
    return sorted(table().status.items(), key=lambda item: order.get(item[0][0], len(order)))


def site_status():
    """[{"patch", "site", "state", "reason"}] for every site seen so far, in patch order."""
    return [{"patch": name, "site": site, "state": state, "reason": reason}
            for (name, site), (state, reason) in _ordered_status()]


def _label(name, site):
    """A site as shown to users: model_management's sites bare, the others prefixed with their module."""
    target = patch_of(name).target
    return site if target == "comfy.model_management" else f"{target}.{site}"


def release_words(release, packages=()):
    """The release setting as the startup line and the panel say it: ``release off``, ``release ask``, ``release
    auto for pack_a, pack_b`` or ``release auto for every pack`` (``COMFY_MEMX_RELEASE_PACKAGES=*``)."""
    if release != "auto":
        return f"release {release}"
    packages = list(packages or ())
    return "release auto for " + ("every pack" if packages == ["*"] else ", ".join(packages) or "no pack")


def startup_line(version, source, leak_mode, release="off", release_packages=()):
    """The one INFO line logged when comfy_memx is active: how it was activated, the leak mode and the release
    setting (:func:`release_words`), then the patched sites and the skipped ones grouped by reason."""
    patched = [_label(name, site) for (name, site), (state, _) in _ordered_status() if state == "patched"]
    skipped = {}
    for (name, site), (state, reason) in _ordered_status():
        if state == "skipped":
            skipped.setdefault(reason, []).append(_label(name, site))
    for name, target in table().armed.items():
        skipped.setdefault(f"{target} not imported", []).extend(_label(name, site) for site in patch_of(name).sites)
    line = (f"comfy_memx {version} active ({source}, leak mode {leak_mode}, {release_words(release, release_packages)})"
            f": patched {', '.join(patched) or 'nothing'}")
    if skipped:
        line += "; skipped " + "; ".join(f"{', '.join(sites)} ({reason})" for reason, sites in skipped.items())
    return line + late.summary(_module_level_originals())


def _module_level_originals():
    """``[(label, target, original)]`` for every patched module-level function (the ones a ``from X import f``
    done before the patch can bypass; class methods are patched on the class and reach every caller)."""
    found = []
    for (name, site), (state, _) in _ordered_status():
        target = patch_of(name).target
        module = sys.modules.get(target)
        if state != "patched" or "." in site or module is None:
            continue
        try:
            found.append((_label(name, site), target, wrapping.original_of(module, site)))
        except PatchSkipped:
            continue
    return found


def announce(force=False):
    """Log the startup line once."""
    patches = table()
    if patches.announced and not force:
        return
    patches.announced = True
    config = STATE.config
    log.info(startup_line(__version__, STATE.source, config.leak_mode, config.release, config.release_packages))


@signals.load_starting.subscribe
def _announce_at_first_load(mm, models, caller_frame):
    """Programs that never import ``server`` get the startup line at their first model load."""
    announce()


@signals.prompt_started.subscribe
def _audit_at_prompt_start(prompt_id, prompt):
    """Notice replaced wrappers before a prompt runs (see :func:`audit`)."""
    audit()


@signals.node_ended.subscribe
def _audit_after_node(prompt_id, node_id, node):
    """Notice replaced wrappers after each node: a node may have replaced a site (ComfyUI-MultiGPU does, from its
    loaders)."""
    audit()
