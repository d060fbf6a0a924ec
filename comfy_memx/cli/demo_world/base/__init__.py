"""The shared source of the ComfyUI-shaped stand-ins: the demo's world and the tests' per-version trees.

Each module of a stand-in tree (``tests/fake_comfy/v0_3_64``, ``tests/fake_comfy/v0_27_0``, the demo's world) is a
short file that calls :func:`extend` for what every version shares, then defines what its version does differently.
The shared parts are files under this folder, laid out as a ComfyUI tree; they are never imported as modules of
comfy_memx: :func:`extend` runs one in the namespace of the stand-in module that asks for it, so every function and
class belongs to that module (``nodes``, ``comfy.model_management``, ...) exactly as if its file held the source.
Written by the comfy_memx authors from ComfyUI's published behaviour; it contains no ComfyUI code.
"""

import linecache
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def extend(namespace, part):
    """Run the shared source ``part`` (a module path under this folder, e.g. ``"comfy/model_management"``) in
    ``namespace``, the globals of the stand-in module that asks for it.

    The code is compiled under a name beside that module's own file (``<file>.base.py``, registered with
    ``linecache``), so its frames count as the stand-in tree's (not as comfy_memx's) and tracebacks show the shared
    source's lines.
    """
    path = os.path.join(HERE, *part.split("/")) + ".py"
    with open(path, encoding="utf-8") as f:
        source = f.read()
    filename = os.path.splitext(namespace["__file__"])[0] + ".base.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)
