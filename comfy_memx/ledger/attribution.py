"""Who asked for a model: the prompt and node executing now, and the custom-node package whose work it is.

ComfyUI sets ``comfy_execution.utils.current_executing_context`` (prompt_id, node_id) around every node function;
the class_type comes from the prompt that :func:`begin_prompt` recorded (the execution patch calls it).  The package
is the one that defines the executing node's class (``nodes.NODE_CLASS_MAPPINGS``), by the file it lies in (not by
its module's name: ComfyUI registers a pack under its folder's path, a pack may import its modules under top-level
names), else by the label ComfyUI's custom-node loader gave the class: the node whose work asked for
the load owns it, even when another pack's wrapper around a core function (``comfy.sample.sample``, say) sits on the
stack; that pack is named as ``via``.  Outside a node (a pack's own thread, a route) the package is the folder under
a custom-node folder of the innermost stack frame that lives there, else ``"core"``.  Everything here is
cheap enough for a load: a context-variable read, two dict lookups and a walk of the stack with a per-file cache.
"""

import sys
import threading
from typing import NamedTuple, Optional

from comfy_memx.core.comfyui import package_of_file
from comfy_memx.core.state import STATE

MAX_FRAMES = 128


class Owner(NamedTuple):
    """Where a load came from; the node fields are None outside a prompt.  ``via`` names another package whose code
    was on the stack between the node and the load (a pack wrapping a core function), or is None."""
    prompt_id: Optional[str] = None
    node_id: Optional[str] = None
    class_type: Optional[str] = None
    package: Optional[str] = None
    via: Optional[str] = None

    def describe(self):
        """A short human-readable form for log lines."""
        parts = []
        if self.node_id is not None:
            parts.append(f"node {self.node_id} ({self.class_type or '?'})")
        parts.append(f"package {self.package or '?'}" + (f" (via {self.via})" if self.via else ""))
        if self.prompt_id is not None:
            parts.append(f"prompt {self.prompt_id}")
        return ", ".join(parts)


class Attribution:
    """What attribution remembers (a part of the process state): the prompt executing on each thread (``prompt``:
    ``current`` = (prompt_id, {node_id: class_type}) or None) and the package of each source file and node class
    seen (caches, bounded by the files and classes of the installation)."""

    def __init__(self):
        self.prompt = threading.local()
        self.package_by_file = {}
        self.package_by_class = {}


def _part():
    return STATE.part(Attribution)


def begin_prompt(prompt_id, prompt):
    """Remember the node_id -> class_type map of the prompt that starts executing on this thread."""
    class_types = {}
    try:
        for node_id, node in prompt.items():
            if isinstance(node, dict) and "class_type" in node:
                class_types[str(node_id)] = node["class_type"]
    except AttributeError:
        pass
    _part().prompt.current = (prompt_id, class_types)


def end_prompt():
    """Forget the prompt of this thread."""
    _part().prompt.current = None


def current_prompt_id():
    """The prompt executing on this thread (None outside a prompt)."""
    current = getattr(_part().prompt, "current", None)
    return current[0] if current else None


def _executing_context():
    utils = sys.modules.get("comfy_execution.utils")
    getter = getattr(utils, "get_executing_context", None)
    return getter() if getter is not None else None


def current_owner(frame=None):
    """The :class:`Owner` of a load requested now; ``frame`` is where to start the package search (the caller)."""
    prompt_id, node_id, class_type = node_context()
    on_stack = package_on_stack(frame or sys._getframe(1))
    node_package = package_of_node(class_type) if class_type is not None else None
    if node_package is None:
        return Owner(prompt_id, node_id, class_type, on_stack)
    return Owner(prompt_id, node_id, class_type, node_package, on_stack if on_stack != node_package else None)


def package_of_node(class_type):
    """The package that defines the node class ``class_type`` (``"core"`` for ComfyUI's own), or None when
    ComfyUI's node table is not loaded or does not have it."""
    nodes = sys.modules.get("nodes")
    mappings = getattr(nodes, "NODE_CLASS_MAPPINGS", None) if nodes is not None else None
    cls = mappings.get(class_type) if isinstance(mappings, dict) else None
    if cls is None:
        return None
    by_class = _part().package_by_class
    cached = by_class.get(class_type)
    if cached is not None and cached[0] is cls:
        return cached[1]
    package = package_of_file(_class_file(cls)) or _custom_node_label(cls) or "core"
    if len(by_class) < 10_000:
        by_class[class_type] = (cls, package)
    return package


def _class_file(cls):
    """The source file of a node class: its module's ``__file__`` (whatever name ComfyUI or the pack registered the
    module under), else the file of its ``FUNCTION`` method's code; None when neither is known."""
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    path = getattr(module, "__file__", None)
    if isinstance(path, str) and path:
        return path
    code = getattr(getattr(cls, getattr(cls, "FUNCTION", None) or "", None), "__code__", None)
    return getattr(code, "co_filename", None)


CUSTOM_NODES_LABEL = "custom_nodes."   # COMFY: nodes.load_custom_node sets RELATIVE_PYTHON_MODULE (0.3.64-0.33.0)


def _custom_node_label(cls):
    """The pack ComfyUI's custom-node loader labelled a node class with (``RELATIVE_PYTHON_MODULE`` =
    ``custom_nodes.<pack>``), or None: for a class whose file lies in no custom-node folder ComfyUI knows."""
    label = getattr(cls, "RELATIVE_PYTHON_MODULE", None)
    if isinstance(label, str) and label.startswith(CUSTOM_NODES_LABEL):
        return label[len(CUSTOM_NODES_LABEL):] or None
    return None


def node_context():
    """``(prompt_id, node_id, class_type)`` of the node executing now on this thread (Nones outside a prompt)."""
    prompt_id = node_id = class_type = None
    context = _executing_context()
    current = getattr(_part().prompt, "current", None)
    if context is not None:
        prompt_id, node_id = context.prompt_id, str(context.node_id)
    elif current is not None:
        prompt_id = current[0]
    if current is not None and node_id is not None and current[0] == prompt_id:
        class_type = current[1].get(node_id) or current[1].get(node_id.split(".")[-1])
    return prompt_id, node_id, class_type


WORKER_FUNCTION = "prompt_worker"  # COMFY: main.prompt_worker (0.3.64, 0.27.0, 0.33.0) runs /free and the OOM path


def caller_on_stack(frame):
    """Who is calling, from ``frame`` outwards: ``("package", name)`` for the innermost frame under custom_nodes,
    ``("worker", None)`` when ComfyUI's prompt worker is reached first, else ``("core", None)``."""
    by_file = _part().package_by_file
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        code = frame.f_code
        if code.co_name == WORKER_FUNCTION:
            return "worker", None
        filename = code.co_filename
        package = by_file.get(filename, False)
        if package is False:
            package = by_file[filename] = package_of_file(filename)
        if package is not None:
            return "package", package
        frame = frame.f_back
        depth += 1
    return "core", None


def package_on_stack(frame):
    """The custom-node package of the innermost frame from ``frame`` outwards that lives under custom_nodes."""
    by_file = _part().package_by_file
    depth = 0
    while frame is not None and depth < MAX_FRAMES:
        filename = frame.f_code.co_filename
        package = by_file.get(filename, False)
        if package is False:
            package = by_file[filename] = package_of_file(filename)
        if package is not None:
            return package
        frame = frame.f_back
        depth += 1
    return "core"
