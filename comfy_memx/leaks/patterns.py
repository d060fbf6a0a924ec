"""What kind of holder keeps a leaked model, and how such holders are usually fixed.

A holder chain (``leaks.holders``) is an access path from a root, written with comfy_memx's own labels: ``.name``
(attribute), ``[key]`` (dict key or index), ``.__self__`` (a bound method's object), ``-> closure 'v'``,
``-> lru_cache[...]``, ``-> thread-local.v``, ``thread '...' frame ... local 'v'``, with the type of every object
on it (``kinds``, root first).  :func:`classify` reads the root kind, those labels and type names (never the
objects) and names the pattern, most specific first:

======================  ==================================================================================
pattern                 shape
======================  ==================================================================================
reference_cycle         the model was held only by a cycle (ComfyUI's collection freed it)
comfyui_cache           ComfyUI's own cache of node outputs (the executor's ``caches``): kept for reuse, not a leak
thread_frame            a live thread's local variable
thread_local            a ``threading.local`` attribute (it lives as long as the thread)
lru_cache               an entry of a ``functools.lru_cache`` / ``cache`` wrapper
callback_registry       a container (list, dict, set) of callbacks: a bound method, or a function whose closure
                        captured the model (a hook registered and never unregistered)
closure                 a function's closure captured the model
node_instance_cache     a pack's node instance, kept by ComfyUI between prompts, holds it in an attribute
torch_module_attribute  a ``torch.nn.Module`` holds it as a submodule (``_modules``) of another model
appended_list           a module-level list or deque that gets every model appended to it
class_cache             a dict, list or other container that is an attribute of a class (shared by all instances)
singleton               an attribute of a long-lived object of ComfyUI (the prompt server, the executor ...)
module_registry         a dict or set that is a module global (a registry or cache of the package), or a weak
                        dictionary, a ``cachetools`` cache or another mapping class bound to one
module_global           a module global bound to the model (or to an object holding it)
unknown                 anything else (an object held only from C code, say): said so, never guessed
======================  ==================================================================================

Each pattern has a short suggestion of the usual fix.  String work on the path and the type names: a few
microseconds per chain.
"""

import re

SUGGESTIONS = {
    "reference_cycle": "break the cycle (keep back-references as weakref.ref, or clear them when done) so the "
                       "model is freed at once instead of at ComfyUI's next full collection",
    "comfyui_cache": "ComfyUI's own cache of node outputs keeps it, so that the next prompt with the same inputs "
                     "reuses it: not a pack's leak. ComfyUI lets go when those nodes' inputs change, on POST /free "
                     "with free_memory (or POST /memx/free), and keeps less with --cache-lru N or --cache-none",
    "thread_frame": "the thread still holds it in a local variable: drop the reference (del, or return) when its "
                    "work is done, or let the thread finish",
    "thread_local": "a threading.local keeps its values as long as the thread lives (ComfyUI's worker lives "
                    "forever): delete the attribute (del local.name) when the node finishes, or store a weakref.ref",
    "lru_cache": "call cache_clear() on the cached function when the model is unloaded, or key the cache by file "
                 "path and cache small results, never the model itself",
    "callback_registry": "unregister the callback when the node finishes (or on unload), or register a "
                         "weakref.WeakMethod, or a function that captures a weakref.ref instead of the model",
    "closure": "do not capture the model in a closure that outlives the node: pass it as an argument, or capture "
               "a weakref.ref and dereference it when called",
    "node_instance_cache": "ComfyUI keeps node instances between prompts: do not keep the model on self; return it "
                           "as an output, or hold a weakref.ref and drop the attribute when the node finishes",
    "torch_module_attribute": "the model was attached to another torch module (a submodule in its _modules): "
                              "delete the attribute (del parent.name) when done, or keep a weakref.ref instead",
    "appended_list": "every model is appended to a module-level list that never shrinks: remove the entry when the "
                     "model is unloaded, or bound it (collections.deque(maxlen=...)), or keep weakref.ref entries",
    "class_cache": "cache per instance instead of on the class, or hold the values in a weakref.WeakValueDictionary"
                   ", and clear the cache when a model is unloaded",
    "singleton": "do not store models on ComfyUI's long-lived objects (the server, the executor): keep them in "
                 "the node's outputs, or a weakref",
    "module_registry": "remove the entry when the node finishes (or on unload), or hold the values in a "
                       "weakref.WeakValueDictionary",
    "module_global": "set the global back to None after use, or keep a weakref.ref to the model",
    "unknown": "no known pattern: the chain above is all comfy_memx can tell (an object held from C code, or a "
               "shape it does not classify)",
}
_SINGLETON_MODULES = ("server", "execution", "main", "nodes", "comfy_execution", "app")
_CALLABLE_KINDS = ("function", "method", "functools.partial")
_LIST_KINDS = ("list", "collections.deque")
_REGISTRY_KINDS = ("list", "collections.deque", "dict", "set", "collections.OrderedDict",
                   "collections.defaultdict", "weakref.WeakKeyDictionary", "weakref.WeakValueDictionary")
_CONTAINER_STEP = re.compile(r"\[[^\]]*\]")
_COMFYUI_CACHE = re.compile(r"\.caches\.(outputs|objects|ui)\b")   # execution.CacheSet of ComfyUI's executor


def classify(chain):
    """``(pattern, suggestion)`` of one referrer ``{"path", "package", "root_kind", "kinds"?, "inner_package"?,
    "mappings"?}`` (see the module docstring; ``mappings``: the types on the chain that are mapping classes)."""
    path, kinds = str(chain.get("path") or ""), tuple(chain.get("kinds") or ())
    root_kind, package, inner_package = chain.get("root_kind"), chain.get("package"), chain.get("inner_package")
    pattern = (_holder_kind_pattern(path, root_kind, package, kinds, inner_package)
               or _shape_pattern(path, package, kinds, inner_package)
               or _root_pattern(path, root_kind, package, kinds, tuple(chain.get("mappings") or ())))
    return pattern, SUGGESTIONS[pattern]


def _holder_kind_pattern(path, root_kind, package, kinds, inner_package):
    """Patterns named by the kind of holder on the path (a cycle, a thread, a cache), or None."""
    if root_kind == "cycle":
        return "reference_cycle"
    if "-> thread-local" in path or "_thread._local" in kinds:
        return "thread_local"
    if package in ("core", None) and not inner_package and _COMFYUI_CACHE.search(path):
        return "comfyui_cache"
    if root_kind == "thread_frame" and not (inner_package and package in ("core", None)):
        return "thread_frame"
    if "-> lru_cache" in path or "functools._lru_cache_wrapper" in kinds:
        return "lru_cache"
    if root_kind == "c_registry":
        return "unknown"
    return None


def _shape_pattern(path, package, kinds, inner_package):
    """Patterns named by the path's shape (a callback in a container, a closure, a torch submodule), or None."""
    if _is_callback_registry(path, kinds):
        return "callback_registry"
    if "-> closure" in path:
        return "closure"
    if inner_package and package in ("core", None):
        return "node_instance_cache"
    if "._modules[" in path:
        return "torch_module_attribute"
    return None


def _root_pattern(path, root_kind, package, kinds, mappings=()):
    """Patterns named by the root: a class attribute or a module global, ``unknown`` for any other root.  A module
    global bound to a weak dictionary, a ``cachetools`` cache or another mapping class is a registry."""
    if root_kind == "class_attribute":
        owner = _class_owner(path)
        return "singleton" if package == "core" or owner.endswith(".instance") else "class_cache"
    if root_kind == "module_global":
        below = kinds[1] if len(kinds) > 2 else None
        if below in _LIST_KINDS:
            return "appended_list"
        if package == "core" and _first_name(path).split(".")[0] in _SINGLETON_MODULES:
            return "singleton"
        if (below in _REGISTRY_KINDS or below in mappings
                or (not kinds and _CONTAINER_STEP.match(_after_global(path)))):
            return "module_registry"
        return "module_global"
    return "unknown"


def _is_callback_registry(path, kinds):
    """A container whose item is a callable (a bound method or a function holding the model), or the old shape:
    a bound method's ``__self__`` reached through a container step."""
    for index, kind in enumerate(kinds[:-1]):
        if kind in _REGISTRY_KINDS and index + 1 < len(kinds) - 1 and kinds[index + 1] in _CALLABLE_KINDS:
            return True
    bound = path.find(".__self__")
    return bound > 0 and not kinds and bool(_CONTAINER_STEP.search(path[:bound]))


def _first_name(path):
    return re.match(r"^[\w.]*", path).group(0)


def _after_global(path):
    return path[len(_first_name(path)):]


def _class_owner(path):
    """``pkg.Class.attr`` of a class-attribute path (up to the first step after the attribute)."""
    dotted = _first_name(path)
    parts = dotted.split(".")
    for index, part in enumerate(parts):
        if part[:1].isupper():
            return ".".join(parts[:index + 2])
    return dotted
