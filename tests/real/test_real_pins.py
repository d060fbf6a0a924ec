"""comfy_memx's pin budget against ComfyUI's OWN pin code, in real ComfyUI trees (0.27.0, 0.33.0, newer).

``bench/pin_invariant.py`` runs in a subprocess of the tree's interpreter, with ``cudaHostRegister`` /
``cudaHostUnregister`` recorded instead of called (no CUDA here) and comfy-aimdo's CUDA allocator stood in (see its
docstring for every stand-in and why).  It loads and unloads three legacy and three DynamicVRAM models under a
2.75 MiB ``COMFY_MEMX_PIN_LIMIT`` and, after every step, checks that comfy_memx's accounted bytes (total and per
model) equal ComfyUI's ``TOTAL_PINNED_MEMORY`` and the recorder's registered addresses, that the cap is never
exceeded, that the victims are the most recently used other model, and that nothing is unregistered and registered
again within one ``load_models_gpu``.

Skipped unless ``COMFY_MEMX_REAL_COMFYUI`` (trees, os.pathsep-separated) and ``COMFY_MEMX_REAL_PYTHON`` (their
interpreter) are set, as in tests/real/test_real_comfyui.py.  About 10-15 s per tree (mostly ComfyUI's import).
"""

import json
import os
import subprocess
import sys

import pytest

from memx_helpers import bench_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = ["-m", "bench.pin_invariant"]     # run with the checkout on PYTHONPATH
TREES_ENV = "COMFY_MEMX_REAL_COMFYUI"
PYTHON_ENV = "COMFY_MEMX_REAL_PYTHON"
MiB = 1024 ** 2


def configured_trees():
    """The ComfyUI trees named by COMFY_MEMX_REAL_COMFYUI (empty list when unset)."""
    return [path for path in os.environ.get(TREES_ENV, "").split(os.pathsep) if path]


def tree_params():
    trees = configured_trees()
    if not trees or not os.environ.get(PYTHON_ENV):
        return [pytest.param(None, marks=pytest.mark.skip(
            reason="set %s (ComfyUI trees) and %s (their interpreter) to run ComfyUI's own pin code" %
                   (TREES_ENV, PYTHON_ENV)))]
    params = []
    for tree in trees:
        name = os.path.basename(os.path.normpath(tree))
        if not os.path.exists(os.path.join(tree, "comfy", "pinned_memory.py")):
            params.append(pytest.param(tree, id=name, marks=pytest.mark.skip(
                reason="%s has no comfy/pinned_memory.py: no pinning before 0.27.0" % name)))
        else:
            params.append(pytest.param(tree, id=name))
    return params


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    """Verdicts of the driver, one run per tree, shared by the tests of this module."""
    cache = {}

    def verdict(tree):
        if tree not in cache:
            out = tmp_path_factory.mktemp("pins") / "verdict.json"
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            env.pop("COMFY_MEMX", None)
            proc = subprocess.run([os.environ[PYTHON_ENV], *DRIVER, "--comfyui", tree, "--register", "fake",
                                   "--json", str(out)], capture_output=True, text=True, timeout=240, env=env,
                                  cwd=str(out.parent))
            assert out.exists(), "driver wrote no verdict (rc %d):\n%s" % (proc.returncode, proc.stderr[-4000:])
            cache[tree] = (proc.returncode, json.loads(out.read_text()), proc.stderr)
        return cache[tree]
    return verdict


@pytest.mark.parametrize("tree", tree_params())
def test_every_invariant_holds_after_every_step(tree, verdicts):
    returncode, verdict, stderr = verdicts(tree)
    failed = {name: check["failures"] for name, check in verdict["checks"].items() if not check["ok"]}
    assert returncode == 0 and verdict["ok"] and not failed, (verdict.get("error"), failed, stderr[-3000:])
    assert verdict["cap_bytes"] == int(2.75 * MiB)


@pytest.mark.parametrize("tree", tree_params())
def test_the_books_follow_comfyui_through_each_path(tree, verdicts):
    _, verdict, _ = verdicts(tree)
    steps = {step["step"]: step for step in verdict["steps"]}
    # Figures independent of comfy_memx: 1 MiB models of four 256 KiB weights; the cap is 2.75 MiB.
    assert steps["load A (legacy)"]["total_pinned_memory"] == MiB
    assert steps["load C (legacy): evicts B"]["total_pinned_memory"] == int(2.75 * MiB)
    assert steps["load C (legacy): evicts B"]["per_model"]["B"] == {"registered": int(0.75 * MiB),
                                                                    "memx": int(0.75 * MiB)}
    assert steps["load C (legacy): evicts B"]["per_model"]["A"]["memx"] == MiB
    for label in ("unload all (legacy)", "free_registrations (ComfyUI)", "dynamic models collected"):
        assert steps[label]["total_pinned_memory"] == 0 == steps[label]["memx"], label
    loaded = "weights-loaded" in (verdict["subsets"] or [])
    own = int(1.25 * MiB) if loaded else MiB   # 0.33+ also pins one layer in "weights-loaded"
    assert steps["run P (dynamic)"]["per_model"]["P"] == {"registered": own, "memx": own}
    assert steps["run R (dynamic): evicts Q"]["per_model"]["P"]["memx"] == own
    assert steps["run R (dynamic): evicts Q"]["per_model"]["Q"]["memx"] < own


@pytest.mark.parametrize("tree", tree_params())
def test_subsets_of_the_version_are_counted(tree, verdicts):
    _, verdict, _ = verdicts(tree)
    version = tuple(int(part) for part in (verdict["comfyui_version"] or "0.0.0").split(".")[:2])
    expected = {"weights", "patches"} | ({"weights-loaded", "patches-loaded"} if version >= (0, 33) else set())
    assert expected <= set(verdict["subsets"])


def test_driver_refuses_a_tree_without_comfyui(tmp_path):
    proc = subprocess.run([sys.executable, *DRIVER, "--comfyui", str(tmp_path), "--json", str(tmp_path / "v.json")],
                          capture_output=True, text=True, timeout=120, env=bench_env())
    verdict = json.loads((tmp_path / "v.json").read_text())
    assert proc.returncode == 2 and verdict["ok"] is False and "comfy" in verdict["error"]
