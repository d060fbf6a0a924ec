"""The node-pack install: comfy_memx activated by the repository's root ``__init__.py`` when ComfyUI loads it from
``custom_nodes/`` (ComfyUI-Manager's git-URL install, ``comfy node install``, a clone or a zip extracted there).

ComfyUI imports custom nodes long after main.py imported ``comfy.model_management``, ``execution`` and ``server``,
so this is a late activation (``comfy_memx.core.late``): the patches apply at once to the imported modules, the
models already loaded are adopted, and the startup line names what could not be reached.  ``PromptServer.add_routes``
runs after every custom node loaded, so the /memx routes are still registered.  When comfy_memx is already active
(the launcher, ``COMFY_MEMX=1``, or a second copy of the pack) nothing is activated again: one line says which copy
is active and from where, and a warning says so when that copy's version is not the pack folder's.

When a bad setting (or an incomplete installation) keeps comfy_memx off, nothing is patched and no other route is
added, but the pack still answers ``GET /memx/status`` (503, :func:`inactive_status`): the error, the setting and
its accepted values, so that the memory panel, which ComfyUI serves from the pack folder anyway, says why comfy_memx
is off instead of showing nothing.
"""

import importlib.machinery
import logging
import os
import re
import sys

from comfy_memx import __version__
from comfy_memx.core.bootstrap import bootstrap_quietly, last_failure
from comfy_memx.core.errors import MemxError
from comfy_memx.core.state import STATE
from comfy_memx.routekit.replies import answer, guarded

log = logging.getLogger("comfy_memx")
SOURCE = "node pack"
_VERSION_LINE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)
_INACTIVE_ROUTE = "_comfy_memx_inactive_status"


def package_dir():
    """The folder of the comfy_memx package this process imported."""
    return os.path.dirname(os.path.abspath(sys.modules["comfy_memx"].__file__))


def other_install(pack_dir):
    """Where another comfy_memx on ``sys.path`` lives (a pip install), or None: found, not imported."""
    pack_dir = os.path.abspath(pack_dir)
    active = package_dir()
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != pack_dir]
    try:
        spec = importlib.machinery.PathFinder.find_spec("comfy_memx", paths)
    except (ImportError, ValueError):
        spec = None
    origin = getattr(spec, "origin", None) if spec is not None else None
    found = os.path.dirname(os.path.abspath(origin)) if origin else None
    if found and found not in (active, pack_dir):  # a pack folder named comfy_memx is no installed copy
        return found
    for finder in sys.meta_path:  # an editable install's finder maps comfy_memx to its checkout
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", "")), "MAPPING", None)
        if isinstance(mapping, dict) and mapping.get("comfy_memx"):
            location = os.path.abspath(mapping["comfy_memx"])
            if location != active:
                return location
    return None


def which_copy(pack_dir, imported_before):
    """One sentence naming the comfy_memx copy that is active in this process, and any copy that is not."""
    active = package_dir()
    own = os.path.join(os.path.abspath(pack_dir), "comfy_memx")
    if active == own:
        text = f"the pack folder's own comfy_memx {__version__} ({active})"
    elif imported_before:
        text = f"comfy_memx {__version__} imported before the pack ({active}), not the pack folder's copy ({own})"
    else:
        text = f"comfy_memx {__version__} from {active}"
    other = other_install(pack_dir)
    if other is not None and other not in (active, own):
        text += f"; the comfy_memx at {other} is not used in this process"
    return text


def pack_version(pack_dir):
    """The version of the comfy_memx that the pack folder holds (read from its ``comfy_memx/_version.py``, not
    imported), or None when it cannot be read."""
    try:
        with open(os.path.join(pack_dir, "comfy_memx", "_version.py"), encoding="utf-8") as handle:
            found = _VERSION_LINE.search(handle.read())
    except OSError:
        return None
    return found.group(1) if found else None


def version_mismatch(pack_dir):
    """A warning (a sentence) when the comfy_memx active in this process is not the pack folder's copy and has
    another version (a pip-installed copy that the launcher or ``COMFY_MEMX=1`` started), else None."""
    own = os.path.join(os.path.abspath(pack_dir), "comfy_memx")
    theirs = pack_version(pack_dir)
    if package_dir() == own or theirs is None or theirs == __version__:
        return None
    return (f"comfy_memx {__version__} from {package_dir()} runs in this process, not this pack folder's "
            f"comfy_memx {theirs}: upgrade that install (pip install --no-deps {os.path.abspath(pack_dir)}) or "
            "uninstall it and start ComfyUI with its plain start command (python main.py)")


def activate(pack_dir, imported_before=False):
    """Activate comfy_memx from the pack at ``pack_dir`` unless it is already active; never raises.

    ``imported_before``: comfy_memx was already in ``sys.modules`` when ComfyUI loaded the pack.  Returns the
    activation source in effect (``"node pack"``, the earlier one, or None when activation failed: then the pack
    serves the inactive ``/memx/status``)."""
    folder = os.path.basename(os.path.normpath(pack_dir))
    copy = which_copy(pack_dir, imported_before)
    mismatch = version_mismatch(pack_dir)
    if mismatch is not None:
        log.warning("comfy_memx node pack (custom_nodes/%s): %s", folder, mismatch)
    if STATE.source is not None:
        log.info("comfy_memx node pack (custom_nodes/%s): comfy_memx is already active (%s); not activating it "
                 "again. Active: %s", folder, STATE.source, copy)
        return STATE.source
    log.info("comfy_memx node pack (custom_nodes/%s): activating %s", folder, copy)
    if bootstrap_quietly(SOURCE) is not None:
        return SOURCE
    serve_inactive_status(last_failure())
    return None


def inactive_status(error):
    """The answer of ``GET /memx/status`` while comfy_memx is off in this process: ``active`` false, the ``error``
    kind, its ``message`` (a setting's error names the variable and the accepted values; an unexpected failure only
    its type, the rest is in ComfyUI's log), the ``setting`` and its ``accepted`` values when the error is a bad
    setting, and what to do."""
    setting = getattr(error, "setting", None)
    accepted = getattr(error, "accepted", None)
    if isinstance(error, MemxError):
        message = str(error)
    else:
        message = f"start-up failed ({type(error).__name__}); the traceback is in ComfyUI's log"
    fix = getattr(error, "fix", None) or (
        f"set {setting} to an accepted value ({accepted}) or unset it, then restart ComfyUI" if setting
        else "see the comfy_memx line in ComfyUI's log, then restart ComfyUI")
    return {"active": False, "error": "inactive", "version": __version__, "source": SOURCE,
            "message": f"comfy_memx is NOT active in this ComfyUI: {message}", "setting": setting,
            "accepted": accepted, "fix": fix}


def serve_inactive_status(error, server_module=None):
    """Add ``GET /memx/status`` answering :func:`inactive_status` (503) to ComfyUI's PromptServer routes (custom
    nodes load before ``add_routes``, so ComfyUI serves it, also under ``/api``); nothing else is added or patched.
    Returns whether it was added (not without a PromptServer, and once per server)."""
    server = server_module if server_module is not None else sys.modules.get("server")
    prompt_server = getattr(getattr(server, "PromptServer", None), "instance", None)
    routes = getattr(prompt_server, "routes", None)
    if routes is None or getattr(prompt_server, _INACTIVE_ROUTE, False):
        return False
    body = inactive_status(error)

    async def inactive(request):
        return answer(body, status=503)

    routes.get("/memx/status")(guarded("/memx/status", inactive))
    setattr(prompt_server, _INACTIVE_ROUTE, True)
    return True
