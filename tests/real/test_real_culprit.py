"""The right culprit on real ComfyUI (opt-in, as ``test_real_comfyui.py``): seven packs of ``culprit_packs/`` each
keep a model that the innocent ``memx_utility_belt`` loaded, two other processes keep both cores busy, and
comfy_memx (installed into ComfyUI's environment, run from outside the checkout) must name every holding package in
report mode and every holder chain in strict mode on the first search; concurrent requested searches and frees never
name a frame of comfy_memx; a pack that patches ComfyUI as ComfyUI-MultiGPU does moves no name.

Sessions per tree: ``strict`` (``python -m comfy_memx``) and ``report`` (``COMFY_MEMX=1``), both with the CPU hog,
and ``patcher`` (the launcher, the MultiGPU-shaped pack).
"""

import os
import subprocess
import sys
from urllib.parse import quote

import pytest

from memx_helpers import load_module
from test_real_comfyui import (FailedSession, configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, real_trees, ready, run_session, where)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
culprit = load_module("memx_real_culprit", os.path.join(HERE, "real_comfy", "culprit.py"))
PATCHER_PACK = os.path.join(HERE, "real_comfy", "memx_multigpu_like")
PACKS = [drive.NODE_PACK_NAME, culprit.pack_dir(culprit.LOADER), *map(culprit.pack_dir, culprit.HOLDERS)]
HOG = "import time\nend = time.time() + 900\nwhile time.time() < end: pass"


def keeper_prompt(index, keeper):
    """A new model (the loader's name changes), loaded by the utility belt, kept by ``keeper``."""
    return {"1": drive.loader_node(f"memx-culprit-{index}"),
            "2": {"class_type": culprit.LOADER_NODE, "inputs": {"model": ["1", 0]}},
            "3": {"class_type": keeper, "inputs": {"model": ["2", 0]}}}


def run_culprit_session(session):
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
    try:
        for index, (pack, (keeper, _, _)) in enumerate(culprit.HOLDERS.items()):
            session.prompt(f"keep_{pack}", keeper_prompt(index, keeper))
        for index in range(2):   # new models: the last kept model's patcher goes, and ComfyUI checks again
            session.prompt(f"after_{index}", {"1": drive.loader_node(f"memx-culprit-after-{index}"),
                                              "2": drive.sampler_node("1", index)})
        rows = session.call("models", "GET", "/memx/models")["body"]
        leaked = [row["model_id"] for row in rows if isinstance(row, dict) and row.get("leak")]
        calls = [lambda model_id=model_id: session.request(f"search_{model_id}", "POST",
                                                           f"/memx/models/{quote(model_id, safe='')}/search",
                                                           timeout=120)
                 for model_id in leaked for _ in range(3)]
        calls += [lambda: session.memx_free("free", {"unload_models": True}, timeout=120, record=False)] * 2
        session.parallel("concurrent", *calls)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait(10)


def run_patcher_session(session):
    session.prompt("distorch", {"1": drive.loader_node("memx-patcher-a"),
                                "2": {"class_type": "MemxDisTorchLoader", "inputs": {"model": ["1", 0]}},
                                "3": drive.sampler_node("2", 1)})
    session.prompt("after_replacement", {"1": drive.loader_node("memx-patcher-b"), "2": drive.sampler_node("1", 2)})
    session.prompt("monitor", {"1": drive.loader_node("memx-patcher-b"),
                               "2": {"class_type": "MemxRamMonitor", "inputs": {"model": ["1", 0]}},
                               "3": drive.sampler_node("1", 3)})
    session.prompt("after_monitor", {"1": drive.loader_node("memx-patcher-c"), "2": drive.sampler_node("1", 4)})


SESSIONS = {
    "strict": {"launcher": "module", "env": {"COMFY_MEMX_LEAK_MODE": "strict"}, "packs": PACKS},
    "report": {"launcher": "env", "env": {"COMFY_MEMX_LEAK_MODE": "report"}, "packs": PACKS},
    "patcher": {"launcher": "module", "env": {}, "packs": [drive.NODE_PACK_NAME, PATCHER_PACK],
                "run": run_patcher_session},
}
CULPRIT_SESSIONS = ("report", "strict")


@pytest.fixture(scope="module")
def culprit_session(tmp_path_factory, memx_importable_by_real_python):  # noqa: F811
    """``culprit_session(tree, name)`` -> the stopped session of SESSIONS[name] on ``tree`` (run once each)."""
    done = {}

    def get(tree, name):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        key = (tree, name)
        if key not in done:
            spec = SESSIONS[name]
            out = str(tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-culprit-{name}"))
            session = drive.Session(tree, configured_python(), out, launcher=spec["launcher"], env=spec["env"],
                                    packs=spec["packs"])
            done[key] = run_session(session, spec.get("run", run_culprit_session))
        return done[key]

    return get


def first_leaks(session):
    """The first leak event of each leaked model, keyed by the holder pack whose prompt loaded it."""
    events = session.events()
    prompt_of = {}
    for step in session.steps:
        if step.get("name", "").startswith("keep_") and step.get("prompt_id"):
            prompt_of[step["prompt_id"]] = step["name"][len("keep_"):]
    pack_of = {e["model_id"]: prompt_of.get((e.get("owner") or {}).get("prompt_id"))
               for e in events if e["event"] == "load"}
    found = {}
    for event in events:
        if event["event"] == "leak" and event.get("stage") == "rooted":
            found.setdefault(pack_of.get(event["model_id"]), event)
    return found


@needs_real_comfyui
@pytest.mark.parametrize("name", CULPRIT_SESSIONS)
@pytest.mark.parametrize("tree", real_trees)
def test_every_holding_package_is_named_on_the_first_search_under_load(tree, name, culprit_session):
    session = ready(culprit_session(tree, name))
    found = first_leaks(session)
    assert set(found) >= set(culprit.HOLDERS), (sorted(map(str, found)), where(session))
    for pack, (_, path, pattern) in culprit.HOLDERS.items():
        event = found[pack]
        assert event["owner"]["package"] == culprit.LOADER and event["owner"]["class_type"] == culprit.LOADER_NODE
        assert event["holder_package"] == pack, (pack, event["search"], where(session))
        assert event["holder"]["pattern"] == pattern and event["holder"]["path"].startswith(path), event["holder"]
        assert event["search"]["result"] == "found" and event["reason"] == "new", (pack, event["search"])
        if name == "strict":
            assert event["referrers"][0]["path"].startswith(path)
    text = session.log_text()
    assert "C code" not in text and session.failure_tracebacks() == [], where(session)
    for pack in culprit.HOLDERS:
        assert f"held by package {pack}" in text, (pack, where(session))


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_concurrent_searches_and_frees_never_name_a_frame_of_comfy_memx(tree, culprit_session):
    session = ready(culprit_session(tree, "strict"))
    answers = session.step("concurrent")["results"]
    searched = [a["body"] for a in answers if a.get("http_status") == 200 and "holders" in (a.get("body") or {})]
    # one search at a time and a CPU budget per minute (exposed surface): the others are refused with 429, never queued
    refused = [a for a in answers if a.get("http_status") == 429]
    assert searched and len(searched) + len(refused) >= 3 * len(culprit.HOLDERS) - 2, (answers[:3], where(session))
    paths = [h["path"] for a in searched for h in a["holders"]]
    receipts = [a["body"] for a in answers if a.get("http_status") == 200 and "survivors" in (a.get("body") or {})]
    paths += [h["path"] for receipt in receipts for s in receipt["survivors"] for h in s.get("holders") or []]
    assert paths and not [path for path in paths if "comfy_memx" in path], where(session)
    packages = {a["holder"]["package"] for a in searched if a.get("holder")}
    assert packages <= set(culprit.HOLDERS) and packages, packages


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_replaced_load_models_gpu_is_wrapped_again_and_a_packs_free_flag_is_charged_to_it(tree, culprit_session):
    session = ready(culprit_session(tree, "patcher"))
    for name in ("distorch", "after_replacement", "monitor", "after_monitor"):
        assert session.step(name)["ok"], (name, where(session))
    said = [line for line in session.log_text().splitlines() if "without calling comfy_memx's wrapper" in line]
    assert len(said) == 1 and "load_models_gpu was replaced by memx_multigpu_like.distorch_load_models_gpu" in said[0]
    # the loads after the replacement are still in the ledger, owned by the node that asked
    loads = session.step_events("after_replacement", "load")
    assert [e["owner"]["class_type"] for e in loads] == ["MemxTinySampler"], loads
    assert loads[0]["owner"]["package"] == drive.NODE_PACK_NAME
    unloads = session.step_events("monitor", "unload") + session.events_after("monitor", "unload")
    flagged = [e for e in unloads if e["reason"] == "free_request"]
    assert flagged, (unloads, where(session))
    assert flagged[0]["requested_by"]["package"] == "memx_multigpu_like"
    assert flagged[0]["requested_by"]["via"] == "PromptQueue.set_flag"
    assert not [e for e in session.events() if e["event"] == "unload" and e["reason"] == "dropped"], where(session)
