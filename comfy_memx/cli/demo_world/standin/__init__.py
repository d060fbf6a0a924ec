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


def write_tree(dest, version="v0_27_0"):
    """Write a runnable stand-in ComfyUI tree of ``version`` into the empty or new folder ``dest`` and return the
    path of its ``main.py``.

    Each module of the tree is the short file that calls :func:`extend` for its part (as ``tests/fake_comfy``'s
    trees do), so a tool outside the tests (``bench.exposed``) can start a stand-in server from the installed
    package alone. ``custom_nodes/`` is created empty.
    """
    source = os.path.join(HERE, version)
    for folder, _dirs, files in os.walk(source):
        for name in files:
            if not name.endswith(".py") or (folder == source and name == "__init__.py"):
                continue
            relative = os.path.relpath(os.path.join(folder, name), source)
            part = f"{version}/{os.path.splitext(relative)[0].replace(os.sep, '/')}"
            target = os.path.join(dest, relative)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as handle:
                handle.write(f'"""Stand-in ComfyUI module: its source is {part}.py of {__name__}."""\n'
                             f"from {__name__} import extend\n\nextend(globals(), {part!r})\n")
    with open(os.path.join(dest, "comfyui_version.py"), "w", encoding="utf-8") as handle:
        handle.write(f'__version__ = "{version[1:].replace("_", ".")}"\n')
    os.makedirs(os.path.join(dest, "custom_nodes"), exist_ok=True)
    return os.path.join(dest, "main.py")
