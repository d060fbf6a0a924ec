"""Leaks ComfyUI never warns about, on real ComfyUI (opt-in, as ``test_real_comfyui.py``): ``memx_list_keeper`` (of
``tests/real_comfy/culprit_packs/``) appends a model's torch module to its module-level list, then ``POST
/memx/free`` unloads it and resets ComfyUI's caches.  ComfyUI no longer lists the model, so it never warns; comfy_memx
must still record it as a leak held by ``memx_list_keeper`` (``found_by: after_free``) in the receipt, ``/memx/models``
and the events, and count it once in ``leaks_total`` and ``leaked_bytes`` with the holder's package, through later
prompts and frees.
"""

import os

import pytest

from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, real_trees, ready, run_session, where)
from test_real_culprit import PACKS, keeper_prompt

HOLDER = "memx_list_keeper"


def run_unwarned_session(session):
    session.prompt("keep", keeper_prompt(0, "KeepListKeeper"))     # loaded by the utility belt, kept by the list
    session.memx_free("free", timeout=120)
    session.call("models", "GET", "/memx/models")
    for index in range(2):   # later prompts (ComfyUI's collection points) and a second free: counted once
        session.prompt(f"after_{index}", {"1": drive.loader_node(f"memx-unwarned-after-{index}"),
                                          "2": drive.sampler_node("1", index)})
    session.memx_free("free_again", timeout=120)
    session.call("metrics", "GET", "/memx/metrics")


@pytest.fixture(scope="module")
def unwarned_session(tmp_path_factory, memx_importable_by_real_python):  # noqa: F811
    """``unwarned_session(tree)`` -> the stopped session on ``tree`` (run once per tree)."""
    done = {}

    def get(tree):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if tree not in done:
            out = str(tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-unwarned"))
            session = drive.Session(tree, configured_python(), out, launcher="module", packs=PACKS)
            done[tree] = run_session(session, run_unwarned_session)
        return done[tree]

    return get


def kept_row(session):
    rows = session.step("models")["body"]
    return next((row for row in rows if isinstance(row, dict) and row["owner"].get("class_type") == "UBApplyModel"),
                None)


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_model_a_pack_keeps_after_memx_free_is_a_leak_with_its_holder(tree, unwarned_session):
    session = ready(unwarned_session(tree))
    receipt = session.step("free")["body"]
    assert session.step("free")["http_status"] == 200, (receipt, where(session))
    [survivor] = receipt["survivors"]
    assert survivor["leak"] is not None, (survivor, where(session))
    assert survivor["leak"]["found_by"] == "after_free" and survivor["leak"]["holder_package"] == HOLDER, survivor
    row = kept_row(session)
    assert row is not None and row["model_id"] == survivor["model_id"], where(session)
    assert row["state"] == "leaked" and row["in_comfyui_loaded_list"] is False
    assert row["leak"]["holder"]["path"] == "memx_list_keeper.MODELS[0]" and row["leak"]["stage"] == "rooted", row
    leaks = [event for event in session.events() if event["event"] == "leak"]
    assert [(e["model_id"], e["found_by"], e["holder_package"]) for e in leaks] == [
        (row["model_id"], "after_free", HOLDER)], where(session)
    text = session.log_text()
    assert session.failure_tracebacks() == [] and f"is held by package {HOLDER} (memx_list_keeper.MODELS[0]) after a free" in text


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_metrics_count_a_free_found_leak_once_with_the_holders_package(tree, unwarned_session):
    parser = pytest.importorskip("prometheus_client.parser")
    session = ready(unwarned_session(tree))
    step = session.step("metrics")
    if step["http_status"] == 501:
        pytest.skip(f"prometheus_client is not installed for {configured_python()}")
    assert step["http_status"] == 200, (step, where(session))
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in parser.text_string_to_metric_families(step["body"]) for s in family.samples}
    leaks = {dict(labels)["package"]: value for (name, labels), value in values.items()
             if name == "comfy_memx_leaks_total" and value and dict(labels)["stage"] == "rooted"}
    assert leaks == {HOLDER: 1.0}, (leaks, where(session))
    leaked = {dict(labels)["package"]: value for (name, labels), value in values.items()
              if name == "comfy_memx_leaked_bytes"}
    assert set(leaked) == {HOLDER} and leaked[HOLDER] > 0, leaked
