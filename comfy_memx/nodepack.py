"""The node-pack install: comfy_memx activated by the repository's root ``__init__.py`` when ComfyUI loads it from
``custom_nodes/`` (ComfyUI-Manager's git-URL install, ``comfy node install``, a clone or a zip extracted there).

ComfyUI imports custom nodes long after main.py imported ``comfy.model_management``, ``execution`` and ``server``,
so this is a late activation (``comfy_memx.core.late``): the patches apply at once to the imported modules, the
models already loaded are adopted, and the startup line names what could not be reached.  ``PromptServer.add_routes``
runs after every custom node loaded, so the /memx routes are still registered.  When comfy_memx is already active
(the launcher, ``COMFY_MEMX=1``, or a second copy of the pack) nothing is activated again: one line says which copy
is active and from where.
"""

import importlib.machinery
import logging
import os
import sys

from comfy_memx import __version__
from comfy_memx.core.bootstrap import bootstrap_quietly
from comfy_memx.core.state import STATE

log = logging.getLogger("comfy_memx")
SOURCE = "node pack"


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


def activate(pack_dir, imported_before=False):
    """Activate comfy_memx from the pack at ``pack_dir`` unless it is already active; never raises.

    ``imported_before``: comfy_memx was already in ``sys.modules`` when ComfyUI loaded the pack.  Returns the
    activation source in effect (``"node pack"``, the earlier one, or None when activation failed)."""
    folder = os.path.basename(os.path.normpath(pack_dir))
    copy = which_copy(pack_dir, imported_before)
    if STATE.source is not None:
        log.info("comfy_memx node pack (custom_nodes/%s): comfy_memx is already active (%s); not activating it "
                 "again. Active: %s", folder, STATE.source, copy)
        return STATE.source
    log.info("comfy_memx node pack (custom_nodes/%s): activating %s", folder, copy)
    return SOURCE if bootstrap_quietly(SOURCE) is not None else None
