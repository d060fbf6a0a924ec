"""``standin.write_tree``: the runnable stand-in tree that tools outside the tests (``bench.exposed``) start from the
installed package is the tests' own 0.27.0 stand-in, module for module and part for part."""

import os
import re
import subprocess
import sys

from comfy_memx.cli.demo_world.standin import write_tree
from fake_comfy import shape_root

PART = re.compile(r"^extend\(globals\(\), ['\"]([^'\"]+)['\"]\)$", re.M)


def modules_and_parts(root):
    """``{relative path: the part it extends}`` of every Python module under ``root``."""
    found = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            if name.endswith(".py") and "__pycache__" not in folder:
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as handle:
                    parts = PART.findall(handle.read())
                found[os.path.relpath(path, root)] = parts
    return found


def test_the_written_tree_is_the_tests_0_27_0_stand_in(tmp_path):
    main_py = write_tree(str(tmp_path / "ComfyUI"))

    assert main_py == str(tmp_path / "ComfyUI" / "main.py")
    assert modules_and_parts(tmp_path / "ComfyUI") == modules_and_parts(shape_root("0.27.0"))
    assert (tmp_path / "ComfyUI" / "custom_nodes").is_dir()


def test_the_written_tree_imports_as_comfyui_in_a_fresh_interpreter(tmp_path):
    root = tmp_path / "ComfyUI"
    write_tree(str(root))
    code = ("import comfyui_version, comfy.model_management as mm, execution, nodes, server; "
            "print(comfyui_version.__version__, mm.__file__.startswith(%r))" % str(root))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.27.0", "True"]
