"""``bench.common.write_stand_in_tree``: the runnable stand-in tree that the benches start a server from is the
tests' own 0.27.0 shape, module for module and byte for byte, and it imports as a ComfyUI root on its own."""

import os
import subprocess
import sys

from bench.common import write_stand_in_tree
from fake_comfy import shape_root


def modules(root):
    """``{relative path: source}`` of every Python module under ``root`` except the demo's packs."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [name for name in dirs if name not in ("__pycache__", "packs")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    found[os.path.relpath(path, root)] = handle.read()
    return found


def test_the_written_tree_is_the_tests_0_27_0_stand_in(tmp_path):
    main_py = write_stand_in_tree(str(tmp_path / "ComfyUI"))

    assert main_py == str(tmp_path / "ComfyUI" / "main.py")
    expected = modules(shape_root("0.27.0"))
    del expected["__init__.py"]   # the folder's marker as a package of comfy_memx, not a module of the tree
    assert modules(tmp_path / "ComfyUI") == expected
    assert (tmp_path / "ComfyUI" / "custom_nodes").is_dir()


def test_the_written_tree_imports_as_comfyui_in_a_fresh_interpreter(tmp_path):
    root = tmp_path / "ComfyUI"
    write_stand_in_tree(str(root))
    code = ("import comfyui_version, comfy.model_management as mm, execution, nodes, server; "
            "print(comfyui_version.__version__, mm.__file__.startswith(%r))" % str(root))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.27.0", "True"]
