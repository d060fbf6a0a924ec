"""Which holder of a leaked model may be cut: the decision, made from the chain's pattern, package and steps alone.

A release cuts one entry of a pack's cache: the container must be reached from a module global or a class attribute
of a custom-node package loaded in this process, and the chain must go on through an entry of a container (a dict of
any kind, a list or deque, a ``functools.lru_cache``, a mapping object's storage: see
:mod:`~comfy_memx.leaks.release.entries`, which picks the entry once the chain is walked again).  Everything else is
refused with the reason and the pack's fix, because cutting it would change what ComfyUI or the pack does in a way a
cache does not (a callback no longer called, a closure's variable, a thread's local, a submodule of another model),
because it is not a pack's (ComfyUI's own objects, ``sys.modules``, another library), or because comfy_memx cannot
tell (unknown).  Nothing here touches an object: :mod:`~comfy_memx.leaks.release.walk` checks the objects at the cut.
"""

from comfy_memx.leaks import patterns
from comfy_memx.leaks.holders.labels import attr_text, safe_repr
from comfy_memx.leaks.holders.packages import custom_node_packages, display_module_name

RELEASABLE = ("class_cache", "module_registry", "appended_list", "lru_cache")
CUT_OPS = ("item", "index", "lru_item", "lru_entry")
CUT_AT = 2   # the steps: 0 the root, 1 the container (the root's attribute or global), 2 its entry (the first one)

WHY_NOT = {
    "comfyui_cache": "ComfyUI's own cache of node outputs holds it: use POST /memx/free (or ComfyUI's /free) with "
                     "free_memory, which empties that cache",
    "reference_cycle": "only a reference cycle held it, and ComfyUI's collection freed it",
    "thread_frame": "a live thread's local variable holds it: comfy_memx never changes a running thread",
    "thread_local": "a thread-local holds it: comfy_memx never changes another thread's state",
    "callback_registry": "a registry of callbacks holds it: cutting a callback would change what the pack calls",
    "closure": "a function's closure holds it: cutting the cell would break that function",
    "node_instance_cache": "a pack's node instance holds it on itself: the node would run without it",
    "torch_module_attribute": "it is a submodule of another torch model: cutting it would break that model",
    "singleton": "one of ComfyUI's long-lived objects holds it",
    "module_global": "a module global is bound to it (or to an object holding it), not a cache entry",
    "unknown": "comfy_memx does not know this holder's shape",
}


class Plan:
    """A chain that may be cut: its referrer (the leak record's JSON form), steps, and the index of its first entry
    step (the release walks the chain again and picks the entry it cuts: :mod:`~comfy_memx.leaks.release.entries`)."""
    __slots__ = ("referrer", "steps", "cut_at")

    def __init__(self, referrer, steps, cut_at=CUT_AT):
        self.referrer, self.steps, self.cut_at = referrer, steps, cut_at


class Refusal:
    """A chain that is not cut: ``why`` (a sentence) and ``fix`` (the pack's fix), with the referrer it is about."""
    __slots__ = ("referrer", "why", "fix")

    def __init__(self, referrer, why, fix):
        self.referrer, self.why, self.fix = referrer, why, fix


def decide(referrer, steps, packages=None):
    """A :class:`Plan` to cut ``referrer`` (a holder as ``leaks.watch.referrer_of`` writes it) along ``steps``, or a
    :class:`Refusal` saying why not and what the pack's fix is.  ``packages``: the custom-node packages loaded in
    this process (default: read now); a holder rooted anywhere else (ComfyUI, the standard library's ``sys.modules``,
    another library) is never cut."""
    pattern = referrer.get("pattern") or "unknown"
    fix = patterns.SUGGESTIONS.get(pattern, patterns.SUGGESTIONS["unknown"])
    if pattern not in RELEASABLE:
        return Refusal(referrer, WHY_NOT.get(pattern, WHY_NOT["unknown"]), fix)
    package = referrer.get("package")
    if package in ("core", "?", None):
        return Refusal(referrer, "the container belongs to ComfyUI itself, not to a custom-node package: use POST "
                                 "/memx/free", fix)
    if package not in (custom_node_packages() if packages is None else packages):
        return Refusal(referrer, f"the container belongs to {package}, which is not a custom-node package loaded in "
                                 "this process: comfy_memx cuts only from a custom-node package's own module or class",
                       fix)
    first = next((index for index in range(CUT_AT, len(steps)) if steps[index][0] in CUT_OPS), None)
    if first is None:
        return Refusal(referrer, "the chain does not end in an entry of the package's container that comfy_memx can "
                                 "find again by identity", fix)
    return Plan(referrer, steps, first)


def choose(referrers, steps_by_path, path=None, packages=None):
    """The holder to act on: the one at ``path`` if given, else the first releasable one (the holder a user acts on
    comes first in ``referrers``), else the first.  Returns a :class:`Plan`, a :class:`Refusal`, or None when
    ``path`` is not among them or there is no holder at all."""
    if path is not None:
        referrers = [ref for ref in referrers if ref.get("path") == path]
    packages = custom_node_packages() if packages is None else packages
    decisions = [decide(ref, steps_by_path.get(ref.get("path"), ()), packages) for ref in referrers]
    return next((d for d in decisions if isinstance(d, Plan)), decisions[0] if decisions else None)


def releasable_now(referrers, steps_by_path, packages=None):
    """``{"possible", "why", "path"}`` for a read-model row: whether some holder could be cut (and which), else the
    first reason why not.  String work only: the objects are checked when the release runs."""
    decision = choose(referrers, steps_by_path, packages=packages)
    if decision is None:
        return {"possible": False, "why": "no holder found yet (search it first)", "path": None}
    if isinstance(decision, Plan):
        return {"possible": True, "why": None, "path": decision.referrer.get("path")}
    return {"possible": False, "why": decision.why, "path": decision.referrer.get("path")}


def cut_text(steps, cut_at=CUT_AT):
    """The access path of the entry a plan cuts, as a person reads it (``pack.Loader._cache[(1024, 1024)]``)."""
    root = steps[0]
    parts = [display_module_name(root[1]) + ("." + root[2] if root[0] == "class" else "")]
    for index, (op, arg, _id, _kind) in enumerate(steps[1:cut_at + 1]):
        if op == "attr" or (index == 0 and root[0] == "module" and arg[0] == "="):   # a module global by name
            parts.append(attr_text(arg if op == "attr" else arg[1]))
        elif op in ("item", "lru_item"):
            key = safe_repr(arg[1], 60) if arg[0] == "=" else "<a key that is not a constant>"
            parts.append(f"[{key}]" if op == "item" else f" -> lru_cache[{key}]")
        elif op == "index":
            parts.append(f"[{arg}]")
        else:
            parts.append(" -> lru_cache (every entry)")
    return "".join(parts)
