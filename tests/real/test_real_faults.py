"""Fault injection on real ComfyUI (opt-in, as ``test_real_comfyui.py``).

In a tree's own process (``tests/real/fault_world.py``, run with the tree's interpreter and the installed comfy_memx):
a failure planted in every site of ``tests/fault_sites.py`` (every function and method of the wings, every
subscriber, every guarded pin call), a few sites per world of ComfyUI's own code (prompts through ComfyUI's executor,
a warned leak released under ``COMFY_MEMX_RELEASE=auto``, the worker's unload, a leak ComfyUI never warns about,
ComfyUI's garbage passes, and on 0.27.0 and newer ComfyUI's own pin code with the registration stood in as
``tests/real/test_real_pins.py`` does), must leave every ComfyUI call answering as without comfy_memx (prompts
succeed), let every model ComfyUI dropped die, and be counted and logged once.  About 20 s per tree.

On a server (one per tree, under the production error policy): with every subscriber of every signal and pair and
every guarded pin call failing at once (planted by a pack in the test's custom_nodes folder), ComfyUI's default
text-to-image workflow still produces its image, ComfyUI's own ``POST /free`` still unloads (a prompt after it runs),
each fault is logged exactly once and ``GET /memx/status`` counts them by site.
"""

import json
import os
import re
import subprocess
import textwrap

import pytest

from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, real_checkpoint, real_trees, ready, run_session, where)

HERE = os.path.dirname(os.path.abspath(__file__))
PIN_SITES = {"comfy_memx.pins.session.managing", "comfy_memx.pins.context.pin_lock", "comfy_memx.pins.context.current",
             "comfy_memx.pins.eviction.reorders_eviction", "comfy_memx.pins.requests.before_tensor_pin",
             "comfy_memx.pins.requests.before_layer_pin", "comfy_memx.pins.requests.after_layer_pin",
             "comfy_memx.pins.requests.before_reregister", "comfy_memx.pins.eviction.after_comfyui_eviction"}
"""The pin path's decisions and books: each must be reached, and planted, in the worlds of a tree with pins."""


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, memx_importable_by_real_python):  # noqa: F811
    """``sweeps(tree)`` -> the verdict of fault_world.py in ``tree`` (run once per tree)."""
    done = {}

    def get(tree):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if tree not in done:
            out = tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-sweep") / "verdict.json"
            proc = subprocess.run([configured_python(), os.path.join(HERE, "fault_world.py"), "--comfyui", tree,
                                   "--json", str(out)], capture_output=True, text=True, timeout=600,
                                  cwd=str(out.parent), env=drive.inherited_env())
            assert out.exists(), f"fault_world.py wrote no verdict (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
            done[tree] = (proc.returncode, json.loads(out.read_text()), proc.stderr)
        return done[tree]
    return get


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_failure_planted_in_every_site_leaves_comfyuis_answers_and_models_alone(tree, sweeps):
    returncode, verdict, stderr = sweeps(tree)
    assert verdict["error"] is None, verdict["error"]
    baseline = verdict["baseline"]
    assert baseline["same_with_comfy_memx"] and baseline["survivors"] == [] and baseline["counts"] == {}
    assert all(answer == ["returned", True] for answer in baseline["answers"][:1])   # the first prompt succeeded
    assert verdict["sites"] > 600 and len(verdict["reached"]) > 200
    failures = "\n".join(f"{site}: {problems}" for site, problems in sorted(verdict["failures"].items()))
    assert returncode == 0 and verdict["ok"] and not verdict["failures"], (failures, stderr[-3000:])


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_the_real_pin_path_is_planted_and_its_prompts_still_succeed(tree, sweeps):
    _, verdict, _ = sweeps(tree)
    if not verdict.get("pins"):
        pytest.skip(f"{tree} has no pinned memory (before 0.27.0)")
    assert PIN_SITES <= set(verdict["reached"]), sorted(PIN_SITES - set(verdict["reached"]))
    assert verdict["baseline"]["answers"][-3] == ["returned", True]   # the prompt after the pin path succeeded
    assert not set(verdict["failures"]) & PIN_SITES


FAULT_PACK = textwrap.dedent('''\
    """Test-only pack: from now on, every subscriber of every comfy_memx signal and pair and every guarded pin call
    fails (but the routes' own: they are how the test reads the counts)."""
    import logging
    import sys

    sys.path.insert(0, %(tests)r)
    import fault_sites  # noqa: E402
    from comfy_memx.core import guard, signals  # noqa: E402

    CALLS = [fn for entry in signals.CATALOGUE if entry.name not in ("routes_adding", "worker_unload_offered")
             for fn, _kind in entry.guards()]
    CALLS += [fn for facade in guard.FACADES for fn, _kind in facade.guards()]
    SITES = {fault_sites.site_name(fn): fn for fn in CALLS}
    GARDEN = fault_sites.Garden(SITES)
    GARDEN.plant(sorted(SITES))
    logging.getLogger("comfy_memx").warning("memx_fault_pack: planted %%d faults", len(SITES))
    NODE_CLASS_MAPPINGS = {}
''') % {"tests": os.path.dirname(HERE)}
MUST_FAIL = {"load", "prompt", "node", "free_flag_set", "flags_served", "unload_scope"}
"""Pairs and signals that the workflow and ``POST /free`` run on every tree after custom nodes load."""


def run_fault_session(session):
    session.prompt("t2i", drive.default_workflow(0))
    session.comfy_free("free", {"unload_models": True, "free_memory": True})
    # the worker acts on the flags in its turn after a prompt: this one runs once that turn (the unload) is over
    session.prompt("after_free", {"1": drive.loader_node("memx-faults"), "2": drive.sampler_node("1", 0)})
    session.call("status", "GET", "/memx/status")


@pytest.fixture(scope="module")
def fault_session(tmp_path_factory, memx_importable_by_real_python, real_checkpoint):  # noqa: F811
    """``fault_session(tree)`` -> the stopped session on ``tree`` with the fault pack (run once per tree)."""
    done = {}

    def get(tree):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if tree not in done:
            out = tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-faults")
            pack = out / "memx_fault_pack"
            pack.mkdir()
            (pack / "__init__.py").write_text(FAULT_PACK, encoding="utf-8")
            session = drive.Session(tree, configured_python(), str(out / "run"), launcher="module",
                                    env={"COMFY_MEMX_RAISE_INTERNAL": "0"}, packs=(drive.NODE_PACK_NAME, str(pack)),
                                    checkpoint=real_checkpoint(tree))
            done[tree] = run_session(session, run_fault_session)
        return done[tree]

    return get


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_every_faulty_subscriber_and_pin_call_leaves_the_image_and_is_logged_once_and_counted(tree, fault_session):
    session = ready(fault_session(tree))
    log = "\n".join(drive.strip_ansi(line) for line in session.log_text().splitlines())
    assert "memx_fault_pack: planted" in log, where(session)
    step = session.step("t2i")
    assert step["ok"], (step.get("error_messages"), where(session))
    images = [image for output in step["outputs"].values() for image in output.get("images", [])]
    assert images and images[0]["filename"].startswith("memx_t2i"), (step["outputs"], where(session))
    assert os.path.isfile(os.path.join(session.base, "output", images[0]["filename"])), where(session)
    assert session.step("free")["http_status"] == 200, where(session)
    assert session.step("after_free")["ok"], (session.step("after_free").get("error_messages"), where(session))
    logged = re.findall(r"internal error in (\S+ -> \S+) \(ComfyUI continues", log)
    assert logged and len(logged) == len(set(logged)), (sorted(logged), where(session))
    assert MUST_FAIL <= {kind.split(" -> ")[0].split(".")[0] for kind in logged}, (sorted(logged), where(session))
    status = session.step("status")
    counted = status["body"]["internal_errors"]
    assert status["http_status"] == 200 and set(logged) <= set(counted) and all(counted[kind] >= 1 for kind in logged)
