"""The ownership ledger through the real patch path: owners, unload reasons, refcounts, events, leak lines."""

import gc
import logging
import sys
import weakref

import pytest

from comfy_memx.core.state import STATE
from fake_comfy.loader import make_patcher
from memx_helpers import install_pack, memx_on, read_events, run_prompt

VERSIONS = ["0.3.64", "0.27.0"]


def leaky_prompt(name="a", leak=False, tensor_count=4):
    return {"1": {"class_type": "LeakyLoader",
                  "inputs": {"name": name, "tensor_count": tensor_count, "tensor_numel": 1024, "leak": leak}},
            "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}


def unloads(events, reason=None):
    return [e for e in events if e["event"] == "unload" and (reason is None or e["reason"] == reason)]


@pytest.mark.parametrize("version", VERSIONS)
def test_owner_of_a_load_from_a_custom_node_inside_a_prompt(version, tmp_path):
    events_path = tmp_path / "events.jsonl"
    with memx_on(version, events=events_path) as mm:
        install_pack(tmp_path)
        import execution
        executor = run_prompt(execution.PromptExecutor(None), "prompt-1", leaky_prompt())
        assert executor.success, executor.status_messages
        record = STATE.ledger.records()[0]
        assert record.owner._asdict() == {"prompt_id": "prompt-1", "node_id": "1", "class_type": "LeakyLoader",
                                          "package": "leaky_pack", "via": None}
        load = [e for e in read_events(events_path) if e["event"] == "load"][0]
        assert load["owner"]["package"] == "leaky_pack" and load["model_id"] == record.model_id
        assert load["bytes"] == record.model_bytes == 4 * 1024 * 4
        assert load["device"] == str(mm.get_torch_device())


@pytest.mark.parametrize("version", VERSIONS)
def test_core_node_load_and_load_outside_a_prompt(version, tmp_path):
    with memx_on(version) as mm:
        import execution
        executor = run_prompt(execution.PromptExecutor(None), "p", {
            "1": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 2, "tensor_numel": 64}},
            "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0]}}})
        owner = STATE.ledger.records()[0].owner
        del executor
        assert (owner.node_id, owner.class_type, owner.package) == ("2", "SimSampler", "core")
        outside = make_patcher(2, 64)
        mm.load_models_gpu([outside])
        record = STATE.ledger.find(outside.model)
        assert record.owner._asdict() == {"prompt_id": None, "node_id": None, "class_type": None, "package": "core",
                                          "via": None}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_unload_reason(version, tmp_path):
    events_path = tmp_path / "events.jsonl"
    with memx_on(version, events=events_path) as mm:
        device = mm.get_torch_device()
        first, second = make_patcher(8, 1024), make_patcher(8, 1024)
        mm.load_models_gpu([first])
        mm.SIM_VRAM_TOTAL = mm.minimum_inference_memory()    # less than one load asks to keep free
        mm.load_models_gpu([second])                      # no room for both: first is evicted
        mm.SIM_VRAM_TOTAL = 8 * 1024 ** 3
        mm.unload_all_models()                            # unload_all

        def prompt_worker():                              # what ComfyUI's worker does for POST /free
            mm.unload_all_models()
        mm.load_models_gpu([first])
        prompt_worker()
        mm.load_models_gpu([first])
        try:
            raise mm.OOM_EXCEPTION("CUDA out of memory (simulated)")
        except Exception:
            mm.unload_all_models()                        # oom: inside the OOM handler
        mm.load_models_gpu([first])
        clone = first.clone()
        mm.load_models_gpu([clone])                       # clone_replaced: first's entry is silently popped
        mm.current_loaded_models[0].model_unload()        # other: a direct call
        reasons = [e["reason"] for e in unloads(read_events(events_path))]
    assert reasons == ["memory_pressure", "unload_all", "free_request", "oom", "clone_replaced", "other"]


@pytest.mark.parametrize("version", VERSIONS)
def test_unload_records_bytes_partial_and_refcounts(version, tmp_path):
    events_path = tmp_path / "events.jsonl"
    with memx_on(version, events=events_path) as mm:
        patcher = make_patcher(8, 1024)
        mm.load_models_gpu([patcher])
        entry = mm.current_loaded_models[0]
        assert entry.model_unload(memory_to_free=3 * 4096) is False   # partial: stays resident
        holders = [patcher, patcher.model]                           # one more reference to each
        mm.unload_all_models()
        partial, full = unloads(read_events(events_path))
        assert partial["partial"] is True and 0 < partial["bytes"] < 8 * 4096
        assert full["partial"] is False and full["bytes"] == 8 * 4096 - partial["bytes"]
        del holders
        mm.load_models_gpu([patcher])
        mm.unload_all_models()
        again = unloads(read_events(events_path))[-1]
        assert full["refcounts"]["patcher"] == again["refcounts"]["patcher"] + 1
        assert full["refcounts"]["module"] == again["refcounts"]["module"] + 1
        assert full["extra_referrers"] == again["extra_referrers"] + 1
        assert again["extra_referrers"] == 0
        record = STATE.ledger.find(patcher.model)
        assert [u["reason"] for u in record.unloads] == ["other", "unload_all", "unload_all"]


@pytest.mark.parametrize("version", VERSIONS)
def test_ledger_never_keeps_a_model_alive(version, tmp_path):
    with memx_on(version, events=tmp_path / "e.jsonl", leak_mode="strict") as mm:
        patcher = make_patcher(4, 256)
        probe = weakref.ref(patcher.model)
        mm.load_models_gpu([patcher])
        mm.free_memory(1e30, mm.get_torch_device())
        mm.load_models_gpu([patcher])
        assert len(STATE.ledger) == 1
        del patcher
        gc.collect()
        mm.cleanup_models_gc()
        assert probe() is None
        assert len(STATE.ledger) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_report_mode_names_the_owner_after_comfyuis_warning_once_and_counts_later_sightings(version, tmp_path,
                                                                                            caplog):
    caplog.set_level(logging.INFO)
    events_path = tmp_path / "events.jsonl"
    with memx_on(version, events=events_path) as mm:
        install_pack(tmp_path)
        import execution
        executor = execution.PromptExecutor(None)
        run_prompt(executor, "p1", leaky_prompt("a", leak=True))
        run_prompt(executor, "p2", leaky_prompt("b", leak=False))   # p1's loader output is dropped
        run_prompt(executor, "p3", leaky_prompt("c", leak=False))
        messages = [r.getMessage() for r in caplog.records]
        warning = next(i for i, m in enumerate(messages) if m.startswith("WARNING, memory leak with model BaseModel"))
        ours = [m for m in messages if m.startswith("comfy_memx: leaked model")]
        assert len(ours) == 1  # once, although ComfyUI warns again in p3 (and at every load)
        assert messages[warning + 1] == ours[0]
        assert "node 1 (LeakyLoader), package leaky_pack, prompt p1" in ours[0]
        events = read_events(events_path)
        leaks = [e for e in events if e["event"] == "leak"]
        assert [e["stage"] for e in leaks] == ["rooted"] and leaks[0]["owner"]["package"] == "leaky_pack"
        [seen] = [e for e in events if e["event"] == "leak_seen"]
        assert seen["prompt_id"] == "p3" and seen["sightings"] == 2 and seen["model_id"] == leaks[0]["model_id"]
        sys.modules["leaky_pack"].LeakyLoader._cache.clear() if "leaky_pack" in sys.modules else None


@pytest.mark.parametrize("version", VERSIONS)
def test_leak_mode_off_adds_nothing(version, tmp_path, caplog):
    with memx_on(version, leak_mode="off") as mm:
        install_pack(tmp_path)
        import execution
        executor = execution.PromptExecutor(None)
        run_prompt(executor, "p1", leaky_prompt("a", leak=True))
        run_prompt(executor, "p2", leaky_prompt("b"))
        assert not [r for r in caplog.records if r.getMessage().startswith("comfy_memx: leaked")]
