"""Every unload names who asked for it, and reloads are charged to that cause (real patch path, both stand-ins)."""

import logging

import pytest

from comfy_memx.core.state import STATE
from comfy_memx.ledger import causes
from memx_helpers import install_pack, memx_on, read_events, run_prompt

VERSIONS = ["0.3.64", "0.27.0"]


def workflow(step, unloader=None):
    """Loader -> sampler (re-run each prompt: its ``memory_required`` input changes) -> an optional unloader."""
    prompt = {"1": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 4, "tensor_numel": 4096}},
              "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0], "memory_required": step}}}
    if unloader is not None:
        prompt["3"] = {"class_type": unloader, "inputs": {"value": ["2", 0]}}
    return prompt


@pytest.fixture
def comfy(request, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    events = tmp_path / "events.jsonl"
    with memx_on(request.param, events=events, thrash_prompts=3):
        install_pack(tmp_path, "unloader_pack")
        import execution
        yield execution.PromptExecutor(None), events, caplog


def unloads(events):
    return [e for e in read_events(events) if e["event"] == "unload"]


@pytest.mark.parametrize("comfy", VERSIONS, indirect=True)
def test_a_pack_that_unloads_everything_after_each_prompt_is_named_and_charged_with_the_reloads(comfy):
    executor, events, caplog = comfy
    for step in range(4):
        run_prompt(executor, f"p{step}", workflow(step, "UnloadAllModels"))
    [first, *_] = found = unloads(events)
    assert len(found) == 4 and {e["reason"] for e in found} == {"unload_all"}
    assert first["requested_by"] == {"kind": "node", "prompt_id": "p0", "node_id": "3",
                                     "class_type": "UnloadAllModels", "package": "unloader_pack"}
    loads = [e for e in read_events(events) if e["event"] == "load"]
    assert len(loads) == 4 and loads[0]["reload"] is None
    for load, unload in zip(loads[1:], found):
        reload = load["reload"]
        assert reload["cause"] == "unloader_pack/UnloadAllModels" and reload["reason"] == "unload_all"
        assert reload["bytes"] == load["bytes"] > 0 and reload["seconds"] == load["seconds"]
        assert reload["unloaded_at"] == unload["time"]
    [record] = STATE.ledger.records()
    view = causes.reload_view(record)
    assert view["reloads"] == 3 and view["reload_bytes"] == sum(load["bytes"] for load in loads[1:])
    [tally] = view["reload_causes"]
    assert tally["cause"] == "unloader_pack/UnloadAllModels" and tally["reloads"] == 3
    assert tally["package"] == "unloader_pack"
    thrash = [r.getMessage() for r in caplog.records if "thrash" in r.getMessage()]
    # reloads in p1, p2, p3: the last three prompts from p3 on (p0 only loaded)
    assert len(thrash) == 1 and "each of the last 3 prompts" in thrash[0]
    assert "unloader_pack/UnloadAllModels" in thrash[0]
    assert [e["prompts"] for e in read_events(events) if e["event"] == "thrash"] == [["p1", "p2", "p3"]]


@pytest.mark.parametrize("comfy", VERSIONS, indirect=True)
def test_free_memory_called_by_a_pack_is_named(comfy):
    executor, events, _ = comfy
    run_prompt(executor, "p0", workflow(0, "FreeEverything"))
    [unload] = unloads(events)
    assert unload["reason"] == "memory_pressure"
    assert unload["requested_by"]["kind"] == "node" and unload["requested_by"]["class_type"] == "FreeEverything"
    assert unload["requested_by"]["package"] == "unloader_pack"


@pytest.mark.parametrize("comfy", VERSIONS, indirect=True)
def test_an_entry_removed_from_current_loaded_models_is_an_unload_asked_for_by_that_node(comfy):
    executor, events, _ = comfy
    import comfy.model_management as mm
    run_prompt(executor, "p0", workflow(0, "ForgetModels"))
    assert mm.current_loaded_models == []
    [unload] = unloads(events)
    assert unload["reason"] == "dropped" and unload["bytes"] == 0 and unload["partial"] is False
    assert unload["requested_by"] == {"kind": "node", "prompt_id": "p0", "node_id": "3",
                                      "class_type": "ForgetModels", "package": "unloader_pack"}


@pytest.mark.parametrize("comfy", VERSIONS, indirect=True)
def test_nothing_is_reported_dropped_when_comfyui_unloads_on_its_own(comfy):
    executor, events, _ = comfy
    for step in range(3):
        run_prompt(executor, f"p{step}", workflow(step))
    assert unloads(events) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_memory_pressure_names_the_load_that_needed_the_room(version, tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on(version, events=events) as mm:
        import execution
        executor = execution.PromptExecutor(None)
        run_prompt(executor, "p0", workflow(0))
        model_bytes = 4 * 4096 * 4
        # room for one model next to the reserve that load_models_gpu keeps free: the second load must evict
        mm.SIM_VRAM_TOTAL = int(mm.minimum_inference_memory() + 1.5 * model_bytes)
        second = {"4": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 4, "tensor_numel": 4097}},
                  "5": {"class_type": "SimSampler", "inputs": {"model": ["4", 0], "memory_required": 7}}}
        run_prompt(executor, "p1", {**workflow(0), **second})
        pressure = [e for e in unloads(events) if e["reason"] == "memory_pressure"]
        assert pressure
        requested = pressure[0]["requested_by"]
        assert requested["kind"] == "load" and requested["node"]["node_id"] == "5"
        assert requested["node"]["class_type"] == "SimSampler" and requested["node"]["package"] == "core"
        [loading] = requested["models"]
        assert loading["model"] == "BaseModel" and loading["model_id"] != pressure[0]["model_id"]
        assert loading["bytes"] == 4 * 4097 * 4
        assert causes.cause_label(requested, "memory_pressure") == "core/SimSampler loading BaseModel"


@pytest.mark.parametrize("version", VERSIONS)
def test_comfyuis_own_unloads_are_named_comfyui(version, tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on(version, events=events) as mm:
        import execution
        executor = execution.PromptExecutor(None)
        run_prompt(executor, "p0", workflow(0))
        mm.unload_all_models()                    # e.g. an embedding program, or ComfyUI's own code
        [unload] = unloads(events)
        assert unload["requested_by"]["kind"] == "comfyui" and unload["requested_by"]["via"] == __name__


@pytest.mark.parametrize("version", VERSIONS)
def test_with_one_device_for_load_and_offload_nothing_is_copied_and_no_rate_is_claimed(version, tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on(version, events=events) as mm:
        mm.set_sim_device("cpu")                      # as with --cpu: load device == offload device
        import execution
        executor = execution.PromptExecutor(None)
        run_prompt(executor, "p0", workflow(0))
        mm.unload_all_models()
        load, unload = [e for e in read_events(events) if e["event"] in ("load", "unload")]
        assert load["bytes"] > 0 and load["copied"] is False and load["gb_per_s"] is None
        assert unload["bytes"] > 0 and unload["copied"] is False and unload["gb_per_s"] is None



@pytest.mark.parametrize("version", VERSIONS)
def test_a_dropped_entry_whose_patcher_is_gone_still_says_nothing_was_copied(version, tmp_path):
    """A node removes ComfyUI's entries and its LoadedModel (with the patcher weakref) dies with them: the unload
    is reported without a patcher, and --cpu still means nothing was copied (the real trees do exactly this)."""
    events = tmp_path / "events.jsonl"
    with memx_on(version, events=events) as mm:
        mm.set_sim_device("cpu")
        install_pack(tmp_path, "unloader_pack")
        import execution
        run_prompt(execution.PromptExecutor(None), "p0", workflow(0, unloader="ForgetModels"))
        load, unload = [e for e in read_events(events) if e["event"] in ("load", "unload")]
        assert unload["reason"] == "dropped" and unload["refcounts"]["patcher"] == 0
        assert load["copied"] is False and unload["copied"] is False and unload["gb_per_s"] is None
