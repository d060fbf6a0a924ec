"""The one source of the ComfyUI-shaped stand-ins: the demo's world and the tests' per-version trees.

``shared/`` holds what every stand-in version has in common, laid out as a ComfyUI tree; ``v0_27_0/`` holds what
the 0.27.0 stand-in adds or does differently (the demo runs that version; the 0.3.64 differences live in
``tests/fake_comfy/v0_3_64``, which the wheel does not need).  A module of a stand-in tree (``nodes.py``,
``comfy/model_management.py``, ...) is a short file that calls :func:`extend` for its part, then defines what is
its own.  The parts are never imported as modules of comfy_memx: :func:`extend` runs one in the namespace of the
stand-in module that asks for it, so every function and class belongs to that module exactly as if its file held
the source.  Written by the comfy_memx authors from ComfyUI's published behaviour; it contains no ComfyUI code.
"""

import linecache
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def extend(namespace, part):
    """Run the part ``part`` (its path under this folder without ``.py``, e.g. ``"shared/comfy/model_management"``)
    in ``namespace``, the globals of the stand-in module that asks for it.

    The code is compiled under a name beside that module's own file (``<file>[<part>].py``, registered with
    ``linecache``), so its frames belong to the stand-in tree (not to comfy_memx, and inside ``custom_nodes`` for a
    pack) and tracebacks show the part's own lines.
    """
    path = os.path.join(HERE, *part.split("/")) + ".py"
    with open(path, encoding="utf-8") as f:
        source = f.read()
    filename = f"{os.path.splitext(namespace['__file__'])[0]}[{part}].py"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec"), namespace)
