"""Code health: no dead code (vulture) and no function over 20 in cyclomatic complexity (radon) in the product.

Both tools run over ``comfy_memx/``, ``patches/``, ``bench/`` and the node pack's root ``__init__.py``; a failure
names every offender with its file and line.  Vulture also reads ``tests/``, so that the bench harness's helpers the
real-ComfyUI tests call count as used, and ``tests/vulture_whitelist.py``, for what ComfyUI, torch or Python call by
name; it skips functions under a ``@<signal>.subscribe`` decorator (the event dispatch calls them) and the stand-in
ComfyUI under ``comfy_memx/cli/demo_world``, which mirrors ComfyUI's module surface (names that packs and our patches
look up by name).  Radon checks the stand-in too.

Vulture runs at its default confidence, 60: below it nothing more is reported, and at 80 or more it reports only
unused imports, arguments and unreachable code, missing the unused functions, constants and attributes this test is
for.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKED = ("comfy_memx", "patches", "bench", "__init__.py")
USERS = ("tests",)
VULTURE_SKIPS = "*/cli/demo_world/*"
# Functions under these decorators are called by what the decorator registers them with: a subscriber by the event
# dispatch that fires its signal.
CALLED_BY_DECORATOR = "@*.subscribe"
WHITELIST = os.path.join("tests", "vulture_whitelist.py")
MAX_COMPLEXITY = 20


def _require(module):
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it comes with the test extra: pip install -e '.[test]')")


def _run(*args):
    """Run ``python -m <args>`` from the repository root and return the finished process."""
    done = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    return done


def test_no_dead_code():
    _require("vulture")
    done = _run("vulture", *CHECKED, *USERS, WHITELIST, "--exclude", VULTURE_SKIPS,
                "--ignore-decorators", CALLED_BY_DECORATOR, "--min-confidence", "60")
    assert done.returncode in (0, 3), f"vulture failed to run:\n{done.stdout}\n{done.stderr}"
    offenders = [line for line in done.stdout.splitlines() if line.startswith(CHECKED)]
    assert not offenders, ("dead code (delete it, or whitelist it in %s with the caller that uses it by name):\n%s"
                           % (WHITELIST, "\n".join(offenders)))


def test_no_function_over_max_complexity():
    _require("radon")
    done = _run("radon", "cc", "--json", "--min", "C", *CHECKED)
    assert done.returncode == 0, f"radon failed to run:\n{done.stdout}\n{done.stderr}"
    offenders = []
    for path, blocks in sorted(json.loads(done.stdout).items()):
        assert isinstance(blocks, list), f"radon could not read {path}: {blocks}"
        offenders += [f"{path}:{block['lineno']} {_name(block)} scores {block['complexity']}"
                      for block in blocks if block["complexity"] > MAX_COMPLEXITY]
    assert not offenders, ("functions over %d in radon cyclomatic complexity (split them into named helpers):\n%s"
                           % (MAX_COMPLEXITY, "\n".join(offenders)))


def _name(block):
    """``Class.method`` for methods, the plain name otherwise."""
    return f"{block['classname']}.{block['name']}" if block.get("classname") else block["name"]
