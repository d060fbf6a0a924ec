"""What kind of holder keeps a leaked model, and how such holders are usually fixed.

A holder chain (``leaks.holders``) is an access path from a root, written with comfy_memx's own labels: ``.name``
(attribute), ``[key]`` (dict key or index), ``.__self__`` (a bound method's object), ``-> closure 'v'``,
``-> lru_cache[...]``, ``thread '...' frame ... local 'v'``.  :func:`classify` reads the root kind and those labels
(never the objects) and names the pattern, most specific first:

=================  =========================================================================================
pattern            shape
=================  =========================================================================================
reference_cycle    the model was held only by a cycle (ComfyUI's collection freed it)
thread_frame       a live thread's local variable
lru_cache          an entry of a ``functools.lru_cache`` / ``cache`` wrapper
callback_registry  a module-level registry (dict, list, set) of callbacks holding bound methods
closure            a function's closure captured the model
class_cache        a dict, list or other container that is an attribute of a class (shared by all instances)
singleton          an attribute of a long-lived object of ComfyUI (the prompt server, the executor ...)
module_registry    a dict/list/set that is a module global (a registry or cache of the package)
module_global      a module global bound to the model (or to an object holding it)
unknown            anything else (an object held only from C code, say): said so, never guessed
=================  =========================================================================================

Each pattern has a short suggestion of the usual fix.  String work on the path (and a look at ``sys.modules`` for where a module's name ends): a few
microseconds per chain.
"""

import re
import sys

SUGGESTIONS = {
    "reference_cycle": "break the cycle (keep back-references as weakref.ref, or clear them when done) so the "
                       "model is freed at once instead of at ComfyUI's next full collection",
    "thread_frame": "the thread still holds it in a local variable: drop the reference (del, or return) when its "
                    "work is done, or let the thread finish",
    "lru_cache": "call cache_clear() after the model is unloaded, or do not cache models (cache file names or "
                 "small results instead)",
    "callback_registry": "register a weakref.WeakMethod instead of the bound method, or unregister the callback "
                         "when the node finishes",
    "closure": "do not capture the model in a closure that outlives the node: pass it as an argument, or capture "
               "a weakref.ref and dereference it when called",
    "class_cache": "cache per instance instead of on the class, or hold the values in a weakref.WeakValueDictionary",
    "singleton": "do not store models on ComfyUI's long-lived objects (the server, the executor): keep them in "
                 "the node's outputs, or a weakref",
    "module_registry": "remove the entry when the node finishes (or on unload), or hold the values in a "
                       "weakref.WeakValueDictionary",
    "module_global": "set the global back to None after use, or keep a weakref.ref to the model",
    "unknown": "no known pattern: the chain above is all comfy_memx can tell (an object held from C code, or a "
               "shape it does not classify)",
}
_SINGLETON_MODULES = ("server", "execution", "main", "nodes", "comfy_execution", "app")
_CONTAINER_STEP = re.compile(r"\[[^\]]*\]")


def classify(chain):
    """``(pattern, suggestion)`` of one referrer ``{"path", "package", "root_kind"}`` (see the module docstring)."""
    pattern = _pattern(str(chain.get("path") or ""), chain.get("root_kind"), chain.get("package"))
    return pattern, SUGGESTIONS[pattern]


def _pattern(path, root_kind, package):
    if root_kind == "cycle":
        return "reference_cycle"
    if root_kind == "thread_frame":
        return "thread_frame"
    if "-> lru_cache" in path:
        return "lru_cache"
    if root_kind == "c_registry":
        return "unknown"
    bound = path.find(".__self__")
    if bound > 0 and root_kind == "module_global" and _CONTAINER_STEP.search(path[:bound]):
        return "callback_registry"
    if "-> closure" in path:
        return "closure"
    if root_kind == "class_attribute":
        owner = _class_owner(path)
        return "singleton" if package == "core" or owner.endswith(".instance") else "class_cache"
    if root_kind == "module_global":
        module, steps = _module_and_steps(path)
        if package == "core" and module.split(".")[0] in _SINGLETON_MODULES and steps.startswith("."):
            return "singleton"
        if steps.startswith("["):
            return "module_registry"
        return "module_global"
    return "unknown"


def _class_owner(path):
    """``pkg.Class.attr`` of a class-attribute path (up to the first step after the attribute)."""
    dotted = re.match(r"^[\w.]*", path).group(0)
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        if part[:1].isupper():
            return ".".join(parts[:index + 2])
    return dotted


def _module_and_steps(path):
    """The module of a module-global path (the longest imported prefix) and the steps after its global."""
    dotted = re.match(r"^[\w.]*", path).group(0)
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:cut]) in sys.modules:
            module = ".".join(parts[:cut])
            return module, path[len(module) + 1 + len(parts[cut]):]
    return parts[0], path[len(parts[0]):]
