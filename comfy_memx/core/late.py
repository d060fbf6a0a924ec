"""Late activation: comfy_memx switched on after ComfyUI imported the modules it patches (the node-pack install,
``import comfy_memx.auto`` after ComfyUI), and what that cannot reach.

Patching a module attribute reaches every caller that looks it up through the module (``mm.load_models_gpu(...)``),
and patching a class method reaches every instance.  A module that ran ``from comfy.model_management import
load_models_gpu`` *before* the patch keeps the original function in its own globals: its calls bypass comfy_memx.
Under the launcher or ``COMFY_MEMX=1`` the patch lands right after the target's import, before anyone can bind the
name, so this only happens late.  :func:`note_if_late` remembers, at bootstrap, which targets were already imported;
:func:`summary` (read by the startup line once the patches are applied) names the modules that hold an unwrapped
original and what else late activation loses.  One pass over ``sys.modules`` at start-up, nothing later.
"""

import sys

from comfy_memx.core.comfyui import package_of_file
from comfy_memx.core.state import STATE

MIB = 1024 * 1024


class LateActivation:
    """The patch targets already imported when comfy_memx was activated (a part of the process state)."""

    def __init__(self):
        self.imported_before = []


def note_if_late(targets):
    """Record which of ``targets`` (module names) are already imported; returns them ([]: not late)."""
    before = sorted({target for target in targets if target in sys.modules})
    if before:
        STATE.part(LateActivation).imported_before = before
    return before


def _holder_name(module_name, module):
    """``custom node <pack>`` (with the module when it is a submodule) or ComfyUI's own module name."""
    package = package_of_file(getattr(module, "__file__", None) or "")
    if not package:
        return module_name
    # ComfyUI registers a pack's top module under its folder's path: that name says nothing more than the pack
    return f"custom node {package}" if "/" in module_name or "\\" in module_name else \
        f"custom node {package} ({module_name})"


def unreachable_sites(sites):
    """``[(label, holder)]``: each module that holds the unwrapped original of a patched module-level function.

    ``sites`` is ``[(label, target module name, original function)]``.  comfy_memx's own modules and the target
    itself are not holders.  Holders are sorted by label, then holder, so the line reads the same every start."""
    wanted = {id(original): (label, target, original) for label, target, original in sites}
    found = set()
    for module_name, module in list(sys.modules.items()):
        if module is None or module_name.startswith("comfy_memx"):
            continue
        namespace = getattr(module, "__dict__", None)
        if type(namespace) is not dict:
            continue
        for value in list(dict.values(namespace)):
            entry = wanted.get(id(value))
            if entry is not None and entry[2] is value and module_name != entry[1]:
                found.add((entry[0], _holder_name(module_name, module)))
    return sorted(found)


def losses(model_management):
    """What late activation lost in this process, as short phrases (empty when nothing was lost)."""
    lost = []
    loaded = len(getattr(model_management, "current_loaded_models", ()) or ())
    if loaded:
        lost.append(f"{loaded} model(s) loaded before it are adopted without an owner")
    pinned = getattr(model_management, "TOTAL_PINNED_MEMORY", 0) or 0
    if isinstance(pinned, (int, float)) and pinned > 0:
        lost.append(f"{pinned / MIB:.0f} MiB pinned before it were counted by ComfyUI alone")
    return lost


def summary(sites):
    """The startup line's late-activation part ('' when the activation was not late)."""
    part = STATE.existing_part(LateActivation)
    if not part or not part.imported_before:
        return ""
    text = f"; late activation ({', '.join(part.imported_before)} imported before comfy_memx)"
    model_management = sys.modules.get("comfy.model_management")
    lost = losses(model_management) if model_management is not None else []
    if lost:
        text += ": " + "; ".join(lost)
    holders = {}
    for label, holder in unreachable_sites(sites):
        holders.setdefault(label, []).append(holder)
    if holders:
        text += "; unreachable (imported by name before comfy_memx, those calls bypass it): " + "; ".join(
            f"{label} held by {', '.join(names)}" for label, names in holders.items())
    else:
        text += "; no module holds an unwrapped function"
    return text
