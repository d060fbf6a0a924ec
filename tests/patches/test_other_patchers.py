"""Right names beside other patchers: a pack that wraps a core function, replaces load_models_gpu and sets
ComfyUI's free flag (``fake_comfy/packs/multigpu_like``, the shapes ComfyUI-MultiGPU uses), through the real patch
path on both stand-ins."""

import logging
import threading

import pytest

from comfy_memx.core import registry
from comfy_memx.core.state import STATE
from memx_helpers import install_pack, memx_on, read_events, run_prompt

VERSIONS = ["0.3.64", "0.27.0"]


def sampler_prompt(step, distorch=False):
    prompt = {"1": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 4, "tensor_numel": 1024}},
              "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0], "memory_required": step}}}
    if distorch:
        prompt["2"]["inputs"]["model"] = ["3", 0]
        prompt["3"] = {"class_type": "DisTorchLoader", "inputs": {"model": ["1", 0]}}
    return prompt


@pytest.fixture
def comfy(request, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    events = tmp_path / "events.jsonl"
    with memx_on(request.param, events=events) as mm:
        import sys
        target = install_pack(tmp_path, "multigpu_like")
        multigpu_like = sys.modules[str(target).replace(".", "_x_")]   # ComfyUI names a pack's module by its path
        import execution
        try:
            yield mm, multigpu_like, execution.PromptExecutor(None), events, caplog
        finally:
            multigpu_like.restore()


def loads(events):
    return [e for e in read_events(events) if e["event"] == "load"]


@pytest.mark.parametrize("comfy", VERSIONS, indirect=True)
def test_a_core_nodes_load_is_owned_by_core_with_the_wrapping_pack_named_as_via(comfy):
    mm, pack, executor, events, _ = comfy
    run_prompt(executor, "p0", sampler_prompt(0))
    assert executor.success, executor.status_messages
    [load] = loads(events)
    assert load["owner"]["class_type"] == "SimSampler" and load["owner"]["package"] == "core"
    assert load["owner"]["via"] == "multigpu_like"


@pytest.mark.parametrize("comfy", VERSIONS, indirect=True)
def test_a_replaced_load_models_gpu_is_noticed_said_once_and_wrapped_again(comfy):
    mm, pack, executor, events, caplog = comfy
    run_prompt(executor, "p0", sampler_prompt(0, distorch=True))
    assert executor.success, executor.status_messages
    # the loader node replaced it before the sampler ran: the sampler's load is still in the ledger
    assert mm.load_models_gpu is not pack.distorch_load_models_gpu
    assert mm.load_models_gpu.__wrapped__ is pack.distorch_load_models_gpu
    assert [e["owner"]["class_type"] for e in loads(events)] == ["SimSampler"]
    [status] = [s for s in registry.site_status() if s["site"] == "load_models_gpu"]
    assert status["state"] == "rewrapped" and "multigpu_like.distorch_load_models_gpu" in status["reason"]
    for step in range(1, 4):
        run_prompt(executor, f"p{step}", sampler_prompt(step, distorch=True))
    said = [r.getMessage() for r in caplog.records if "without calling comfy_memx's wrapper" in r.getMessage()]
    assert len(said) == 1 and "load_models_gpu was replaced by multigpu_like.distorch_load_models_gpu" in said[0]
    assert "(package multigpu_like)" in said[0]
    # a clone of a loaded model replaces its entry inside load_models_gpu: recorded as such, not as "dropped"
    first = STATE.ledger.records()[0]
    patcher = first.live_patcher()
    mm.load_models_gpu([patcher])
    mm.load_models_gpu([patcher.clone()])
    del patcher, first
    reasons = [e["reason"] for e in read_events(events) if e["event"] == "unload"]
    # once: the old wrapper beneath passes through, so two wrappers of ours never count one call twice
    assert reasons.count("clone_replaced") == 1 and "dropped" not in reasons


@pytest.mark.parametrize("comfy", VERSIONS, indirect=True)
def test_a_free_flag_set_by_a_packs_code_is_charged_to_that_pack(comfy):
    mm, pack, executor, events, _ = comfy
    import execution
    run_prompt(executor, "p0", sampler_prompt(0))
    queue = execution.PromptQueue(None)
    monitor = threading.Thread(target=pack.request_free, args=(queue,), name="ram-monitor")
    monitor.start()
    monitor.join(10)

    def prompt_worker():                  # what ComfyUI's worker does with the flags
        flags = queue.get_flags()
        if flags.get("unload_models", flags.get("free_memory")):
            mm.unload_all_models()
    prompt_worker()
    [unload] = [e for e in read_events(events) if e["event"] == "unload"]
    assert unload["reason"] == "free_request"
    assert unload["requested_by"]["kind"] == "node" and unload["requested_by"]["package"] == "multigpu_like"
    assert unload["requested_by"]["via"] == "PromptQueue.set_flag"
    # ComfyUI's own /free (set by core code) is ComfyUI's again
    run_prompt(executor, "p1", sampler_prompt(1))
    queue.set_flag("unload_models", True)
    prompt_worker()
    last = [e for e in read_events(events) if e["event"] == "unload"][-1]
    assert last["requested_by"]["kind"] == "comfyui"
