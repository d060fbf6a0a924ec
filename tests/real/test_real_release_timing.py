"""When releases run, on real ComfyUI (opt-in, as ``test_real_comfyui.py``): on ComfyUI's prompt worker between
prompts, never while a node runs.

One session per tree, ``COMFY_MEMX_RELEASE=auto`` with only ``memx_list_keeper`` opted in:

* the race users hit: ``memx_release_nodes``' resolution loader (a class-level cache, the Qwen-image shape) hands a
  fresh ModelPatcher of its cached, leaked model to ``memx_slow_preview`` (a slow node that holds it before anything
  loads it); a release asked then waits for the prompt, which loads the model again: 409 ``in_use``, nothing cut,
  and the pack's cache still holds its entry (the pack's census says so);
* ``auto`` after a free: ``memx_list_keeper`` appends a model to its module list, ``POST /memx/free`` takes it out
  of ComfyUI's loaded list and finds it held (a leak ComfyUI never warns about), and the worker releases it right
  after, between prompts.
"""

import os
import re
import threading
import time
from urllib.parse import quote

import pytest

from bench.harness import waits
from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, real_trees, ready, run_session, where)
from test_real_culprit import culprit, keeper_prompt

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tests/
BENCH_NODES = os.path.join(os.path.dirname(HERE), "bench", "harness", "memx_release_nodes")
SLOW = os.path.join(HERE, "real_comfy", "memx_slow_preview")
PACKS = [drive.NODE_PACK_NAME, BENCH_NODES, SLOW, culprit.pack_dir(culprit.LOADER),
         culprit.pack_dir("memx_list_keeper")]
ENV = {"COMFY_MEMX_RELEASE": "auto", "COMFY_MEMX_RELEASE_PACKAGES": "memx_list_keeper"}
SLOW_S = 6.0
SIZE = {"features": 256, "depth": 2}


def resolution(width, node="1", model_to=None):
    """The resolution loader at ``width`` x ``width``, its MODEL sampled (through ``model_to`` when given)."""
    prompt = {node: {"class_type": "MemxReleaseResolutionLoader", "inputs": {"width": width, "height": width, **SIZE}},
              "9": drive.sampler_node(model_to or node, width)}
    return prompt


def census(nonce):
    return {"1": {"class_type": "MemxReleaseCensus", "inputs": {"nonce": nonce}}}


def run_timing_session(session):
    session.prompt("cached", resolution(64))
    session.prompt("other", resolution(72))
    for index in range(2):   # ComfyUI drops the 64 x 64 patcher and warns at its next loads
        session.prompt(f"after_{index}", {"1": drive.loader_node(f"memx-timing-after-{index}"),
                                          "2": drive.sampler_node("1", index)})
    rows = session.call("models", "GET", "/memx/models")["body"]
    leaked = [row for row in rows if isinstance(row, dict) and row.get("leak")
              and (row["leak"].get("holder") or {}).get("path", "").endswith("_cache[(64, 64)]")]
    if not leaked:
        session.note("race", error="no leak of the 64 x 64 model in /memx/models")
        return
    path = f"/memx/models/{quote(leaked[0]['model_id'], safe='')}/release"
    race = resolution(64, model_to="2")
    race["2"] = {"class_type": "MemxSlowPreview", "inputs": {"model": ["1", 0], "seconds": SLOW_S}}
    start = session.mark()[0]
    record = session.submit("race", race)
    waits.wait_until(lambda: "memx_slow_preview: previewing" in session.log_text(start), session.alive,
                     waits.log_size(session.log_path), "the slow node to start")
    answer = {}
    asked = threading.Thread(target=lambda: answer.update(session.request("release", "POST", path, timeout=120)))
    sent = time.time()
    asked.start()
    session.finish(record)
    asked.join(180)
    session.note("release", sent=sent, answer=answer)
    session.prompt("census_after_race", census(1))
    # auto after a free: a leak ComfyUI never warns about
    session.prompt("keep", keeper_prompt(0, "KeepListKeeper"))
    session.memx_free("free", timeout=120)
    waits.wait_until(lambda: any(e.get("event") == "release" and e.get("package") == "memx_list_keeper"
                                 for e in session.events()), session.alive, waits.log_size(session.log_path),
                     "the auto release of the model memx_list_keeper keeps")
    session.note("released")


@pytest.fixture(scope="module")
def timing_session(tmp_path_factory, memx_importable_by_real_python):  # noqa: F811
    """``timing_session(tree)`` -> the stopped session on ``tree`` (run once per tree)."""
    done = {}

    def get(tree):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if tree not in done:
            out = str(tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-timing"))
            session = drive.Session(tree, configured_python(), out, launcher="module", env=ENV, packs=PACKS)
            done[tree] = run_session(session, run_timing_session)
        return done[tree]

    return get


def census_of(session, name):
    outputs = session.step(name).get("outputs") or {}
    for node in outputs.values():
        for key, value in (node or {}).items():
            if "census" in key and value:
                return value[0]
    return None


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_release_asked_while_a_slow_node_holds_the_packs_model_waits_and_cuts_nothing(tree, timing_session):
    session = ready(timing_session(tree))
    step = session.step("release")
    answer, sent = step["answer"], step["sent"]
    ended = [float(t) for t in re.findall(r"memx_slow_preview: done at ([0-9.]+)", session.log_text())]
    assert ended and sent < ended[0], (sent, ended, where(session))   # asked while the node held the model
    assert session.step("race")["ok"] and session.step("census_after_race")["ok"], where(session)
    census = census_of(session, "census_after_race")
    body = answer.get("body") or {}
    if answer.get("http_status") == 409:   # the prompt loaded the model again: in use, nothing cut, ever
        assert body["error"] == "in_use" and body["release"]["cut"] is None, (body, where(session))
        assert census["held"]["resolution"] == 2 and "resolution:64x64" in census["alive"], (census, where(session))
        assert not [e for e in session.events() if e["event"] == "release" and e.get("outcome") == "released"
                    and e.get("package") == "memx_release_nodes"], where(session)
    else:   # ComfyUI's cache let go of the prompt's outputs under RAM pressure: a cut between prompts is right
        assert answer.get("http_status") == 200 and body["release"]["outcome"] == "released", (body, where(session))
    for event in session.events():   # whatever was cut, was cut after the slow node let go of the model
        if event["event"] == "release" and event.get("cut"):
            assert event["time"] >= ended[0], (event, ended, where(session))
    assert session.failure_tracebacks() == [], where(session)


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_auto_releases_a_leak_comfyui_never_warns_about_after_a_free(tree, timing_session):
    session = ready(timing_session(tree))
    receipt = session.step("free")["body"]
    [survivor] = [s for s in receipt["survivors"] if (s.get("leak") or {}).get("holder_package") == "memx_list_keeper"]
    assert survivor["leak"]["found_by"] == "after_free", (survivor, where(session))
    [event] = [e for e in session.events() if e["event"] == "release" and e.get("package") == "memx_list_keeper"]
    assert event["trigger"] == "auto" and event["outcome"] == "released" and event["died"] is True, event
    assert event["model_id"] == survivor["model_id"] and event["cut"] == "memx_list_keeper.MODELS[0]", event
    assert "released leaked model" in session.log_text(), where(session)
