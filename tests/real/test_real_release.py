"""Release on real ComfyUI (opt-in, as ``test_real_comfyui.py``): the seven packs of ``culprit_packs/`` each keep a
model in the way pack authors write such code; with ``COMFY_MEMX_RELEASE=auto`` and every pack opted in, comfy_memx
(installed into ComfyUI's environment, run from outside the checkout) must cut the caches the moment ComfyUI warns
(the class cache keyed by resolution, the lru_cache loader, the module list) and refuse the rest with the pack's fix
(a callback registry, a thread-local, a thread's frame, a torch submodule), the pack keeps working, and the route
answers for a refused one.
"""

import os
from urllib.parse import quote

import pytest

from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, real_trees, ready, run_session, where)
from test_real_culprit import PACKS, culprit, keeper_prompt

RELEASED = {"memx_list_keeper": "list_entry", "memx_style_mixer": "dict_entry", "memx_lora_cache": "lru_cache_clear"}
REFUSED = ("memx_hook_hub", "memx_thread_stash", "memx_background_worker", "memx_torch_glue")
ENV = {"COMFY_MEMX_RELEASE": "auto", "COMFY_MEMX_RELEASE_PACKAGES": "*"}


def run_release_session(session):
    for index, (pack, (keeper, _, _)) in enumerate(culprit.HOLDERS.items()):
        session.prompt(f"keep_{pack}", keeper_prompt(index, keeper))
    for index in range(2):   # new models: the last kept model's patcher goes, and ComfyUI checks again
        session.prompt(f"after_{index}", {"1": drive.loader_node(f"memx-release-after-{index}"),
                                          "2": drive.sampler_node("1", index)})
    # the class cache again, same resolution: the pack rebuilds the released entry
    session.prompt("keep_again", keeper_prompt(0, culprit.HOLDERS["memx_style_mixer"][0]))
    rows = session.call("models", "GET", "/memx/models")["body"]
    hook = next((row for row in rows if isinstance(row, dict) and row.get("leak") and
                 (row["leak"].get("holder") or {}).get("package") == "memx_hook_hub"), None)
    if hook is None:
        session.note("release_hook", http_status=None, body="no leak held by memx_hook_hub in /memx/models")
    else:
        session.call("release_hook", "POST", f"/memx/models/{quote(hook['model_id'], safe='')}/release")


@pytest.fixture(scope="module")
def release_session(tmp_path_factory, memx_importable_by_real_python):  # noqa: F811
    """``release_session(tree)`` -> the stopped auto-release session on ``tree`` (run once per tree)."""
    done = {}

    def get(tree):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if tree not in done:
            out = str(tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-release"))
            session = drive.Session(tree, configured_python(), out, launcher="module", env=ENV, packs=PACKS)
            done[tree] = run_session(session, run_release_session)
        return done[tree]

    return get


def releases_by_pack(session):
    return {event.get("package"): event for event in session.events() if event["event"] == "release"}


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_auto_cuts_each_cache_when_comfyui_warns_and_the_model_dies(tree, release_session):
    session = ready(release_session(tree))
    found = releases_by_pack(session)
    for pack, method in RELEASED.items():
        event = found.get(pack)
        assert event is not None, (pack, sorted(map(str, found)), where(session))
        assert event["trigger"] == "auto" and event["outcome"] == "released", (pack, event, where(session))
        assert event["method"] == method and event["died"] is True and event["bytes"] > 0, event
        assert event["memory"]["before"]["rss"] and event["memory"]["after"]["rss"], event
    assert found["memx_style_mixer"]["cut"] == "memx_style_mixer.StyleMixer._cache[(1328, 1328)]"
    text = session.log_text()
    assert session.failure_tracebacks() == [], where(session)
    for pack in RELEASED:
        assert "released leaked model" in text and f"(package {pack}," in text, (pack, where(session))


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_the_other_holders_are_refused_with_the_packs_fix_and_kept(tree, release_session):
    session = ready(release_session(tree))
    found = releases_by_pack(session)
    for pack in REFUSED:
        event = found.get(pack)
        if event is None:
            continue   # a holder the report-mode probe did not name is not released either (nothing to cut)
        assert event["outcome"] == "refused" and event["cut"] is None and event["fix"], (pack, event)
        assert event["pattern"] == culprit.HOLDERS[pack][2], (pack, event)
    assert "memx_hook_hub" in found and "memx_torch_glue" in found, (sorted(map(str, found)), where(session))
    step = session.step("release_hook")
    assert step["http_status"] == 422 and step["body"]["error"] == "not_releasable", step
    assert "callbacks" in step["body"]["message"] and step["body"]["release"]["fix"], step
    rows = session.step("models")["body"]
    kept = {(row["leak"].get("holder") or {}).get("package") for row in rows if isinstance(row, dict) and row.get("leak")}
    assert "memx_hook_hub" in kept and not kept & set(RELEASED), (kept, where(session))


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_the_pack_rebuilds_a_released_entry(tree, release_session):
    session = ready(release_session(tree))
    assert session.step("keep_again")["ok"], where(session)
    loads = session.step_events("keep_again", "load")
    assert loads, where(session)   # the released class-cache entry was built and loaded again
