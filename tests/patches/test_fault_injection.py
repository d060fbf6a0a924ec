"""Fault injection: a bug in any of comfy_memx's subscribers never changes what ComfyUI's functions do.

On the stand-ins, one scenario drives every patched site (a prompt with a load, node runs and ComfyUI's garbage
pass, a free flag set and served, the worker's unload and cache reset, a checkpoint file load, the server's routes,
ComfyUI's checkpoint loader building a model, a CLIP and a VAE, and a clone).
Then, for every subscriber of every signal in turn, the same scenario runs with that subscriber replaced by one that
raises, under the production error policy: every ComfyUI call answers exactly as it does without comfy_memx, and
the fault is logged exactly once (and no other internal error is).  A ``MemoryError``, a ``RecursionError`` and a
``KeyboardInterrupt`` raised by a subscriber stay what they are.  The per-layer pin calls that the pin patches make
directly are covered by the same scenario on the pinning stand-in.
"""

import asyncio
import logging

import pytest

from comfy_memx.core import registry, signals
from comfy_memx.core.bootstrap import bootstrap
from comfy_memx.core.state import STATE
from fake_comfy.loader import make_patcher, purge_fake_comfy, use_fake_comfy

VERSIONS = ["0.3.64", "0.27.0"]
registry.load_subscriptions()
SUBSCRIBERS = [(signal, fn) for signal in signals.CATALOGUE for fn in signal.subscribers()]
PROMPT = {"1": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 2, "tensor_numel": 64}},
          "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0]}}}


class Planted(Exception):
    """The fault planted in a subscriber."""


def prompt_worker(mm, queue, executor):
    """What ComfyUI's prompt worker does after a prompt when free flags are set (named as ComfyUI's, which is how
    the ledger tells the worker's ``unload_all_models`` from anyone else's)."""
    flags = queue.get_flags()
    if flags.get("unload_models", flags.get("free_memory", False)):
        mm.unload_all_models()
    if flags.get("free_memory"):
        executor.reset()
    return sorted(flags)


def scenario(version, tmp_path):
    """Drive every patched site once; returns what ComfyUI's calls answered (comparable across runs)."""
    mm = use_fake_comfy(version)
    import comfy.utils
    import execution
    import server
    import torch
    answers = []
    loop = asyncio.new_event_loop()
    try:
        prompt_server = server.PromptServer(loop)
        answers.append(prompt_server.add_routes())
        executor = execution.PromptExecutor(prompt_server)
        executor.execute(PROMPT, "prompt-1")
        answers.append((executor.success, len(mm.current_loaded_models)))
        patcher = make_patcher(2, 64)
        answers.append(mm.load_models_gpu([patcher]))
        answers.append(prompt_server.prompt_queue.set_flag("unload_models", True))
        answers.append(prompt_worker(mm, prompt_server.prompt_queue, executor))
        answers.append(len(mm.current_loaded_models))
        answers.append(mm.free_memory(1 << 40, mm.get_torch_device()))
        answers.append(mm.cleanup_models_gc())
        path = tmp_path / "weights.pt"
        torch.save({"w": torch.zeros(3)}, path)
        answers.append(sorted(comfy.utils.load_torch_file(str(path))))
        answers.append(checkpoint_built(tmp_path))
    finally:
        loop.close()
    return answers


def checkpoint_built(tmp_path):
    """ComfyUI's checkpoint loader builds a model, a CLIP and a VAE (each a new ModelPatcher); a CLIP clone builds a
    patcher around the same module.  Returns what they answered."""
    import comfy.sd
    import torch
    path = tmp_path / "checkpoint.pt"
    torch.save({"model.diffusion_model.w": torch.ones(8), "cond_stage_model.w": torch.ones(4),
                "first_stage_model.w": torch.ones(2)}, path)
    model, clip, vae, vision = comfy.sd.load_checkpoint_guess_config(str(path))
    clone = clip.clone()
    return (model.model_size(), clone.cond_stage_model is clip.cond_stage_model, clone.patcher.model_size(),
            vae.patcher.model_size(), vision)


def run(version, tmp_path, environ=None):
    """The scenario's answers with comfy_memx active under the production policy (or inactive with None)."""
    STATE.reset()
    try:
        if environ is not None:
            bootstrap("api", environ)
        return scenario(version, tmp_path)
    finally:
        registry.remove_all()
        purge_fake_comfy()
        STATE.reset()


def internal_errors(caplog):
    return [r.getMessage() for r in caplog.records if "internal error in" in r.getMessage()]


@pytest.fixture(params=VERSIONS)
def version(request):
    return request.param


@pytest.fixture
def baseline(version, tmp_path):
    """What the scenario's ComfyUI calls answer without comfy_memx."""
    return run(version, tmp_path)


def production(tmp_path):
    return {"COMFY_MEMX_EVENTS": str(tmp_path / "events.jsonl")}


def test_the_scenario_fires_every_subscriber(version, baseline, tmp_path, monkeypatch):
    fired = set()
    for signal, fn in SUBSCRIBERS:
        def counted(*args, _fn=fn, _key=(signal.name, fn)):
            fired.add(_key)
            return _fn(*args)
        monkeypatch.setattr(signal, "_subscribers", tuple((counted if f is fn else f, kind)
                                                           for f, kind in signal._subscribers))
    assert run(version, tmp_path, production(tmp_path)) == baseline
    expected = {(signal.name, fn) for signal, fn in SUBSCRIBERS}
    assert {name for name, _fn in expected - fired} <= {"server_unpatching"}   # fired by remove_all, after


def planted(signal, fn, error):
    def fault(*args):
        raise error
    fault.__qualname__ = fn.__qualname__
    fault.__module__ = fn.__module__
    return tuple((fault if f is fn else f, kind) for f, kind in signal._subscribers)


@pytest.mark.parametrize("signal,fn", SUBSCRIBERS, ids=[f"{s.name}-{f.__module__}.{f.__qualname__}"
                                                        for s, f in SUBSCRIBERS])
def test_a_faulty_subscriber_changes_no_answer_and_is_logged_once(version, baseline, tmp_path, monkeypatch, caplog,
                                                                   signal, fn):
    monkeypatch.setattr(signal, "_subscribers", planted(signal, fn, Planted(f"planted in {signal.name}")))
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    assert run(version, tmp_path, production(tmp_path)) == baseline
    kind = f"{signal.name} -> {fn.__module__}.{fn.__qualname__}"
    assert internal_errors(caplog) == [f"comfy_memx: internal error in {kind} (ComfyUI continues; further {kind} "
                                       "errors are not logged)"]


@pytest.mark.parametrize("phase", ["load_starting", "load_ended"])
@pytest.mark.parametrize("error", [MemoryError, RecursionError, KeyboardInterrupt])
def test_memory_recursion_and_interrupt_stay_what_they_are(version, tmp_path, monkeypatch, caplog, error, phase):
    """Raised before ComfyUI's ``load_models_gpu`` (which then does not run) or after it (in its ``finally``), each
    reaches the caller unchanged and unlogged."""
    signal = getattr(signals, phase)
    [fn] = [f for f in signal.subscribers() if f.__module__ == "comfy_memx.ledger.subscriptions"]
    monkeypatch.setattr(signal, "_subscribers", planted(signal, fn, error("planted")))
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    with pytest.raises(error, match="planted"):
        run(version, tmp_path, production(tmp_path))
    assert internal_errors(caplog) == []


def pin_scenario(environ):
    """Legacy tensor pins (offloaded weights), DynamicVRAM layer pins and their lookups, an unload and a node's
    cast-buffer reset on the 0.27.0 stand-in; returns what ComfyUI's calls answered (how many bytes end up pinned
    is the budget's to decide, so it is not compared)."""
    STATE.reset()
    try:
        if environ is not None:
            bootstrap("api", environ)
        mm = use_fake_comfy("0.27.0")
        import comfy.pinned_memory as pm
        from fake_comfy.loader import make_model
        mm.vram_state = mm.VRAMState.NO_VRAM
        mm.SIM_RAM_AVAILABLE = 100 * 1024 ** 3
        answers = [mm.load_models_gpu([make_patcher(4, 1024)])]
        blocks = list(make_model(3, 300).blocks)
        answers.append([pm.pin_memory(block) for block in blocks])
        answers.append([pm.get_pin(block) is not None for block in blocks])
        answers.append([mm.reset_cast_buffers(), mm.unload_all_models()])
        return answers
    finally:
        registry.remove_all()
        purge_fake_comfy()
        STATE.reset()


DIRECT_PIN_CALLS = ["managing", "pin_lock", "before_tensor_pin", "after_tensor_pin", "before_tensor_unpin",
                    "after_tensor_unpin", "note_pin_check", "after_node_reset", "before_layer_pin", "after_layer_pin",
                    "layer_pin"]


@pytest.mark.parametrize("name", DIRECT_PIN_CALLS)
def test_a_fault_in_a_direct_pin_call_changes_no_answer_and_is_logged_once(name, monkeypatch, caplog):
    """The pin patches call the pin budget directly (the per-layer hot path): a fault in each call they make is
    logged once and ComfyUI answers as with a working budget (which grants every pin under this cap)."""
    from comfy_memx.pins import api as pins
    baseline = pin_scenario({"COMFY_MEMX_PIN_LIMIT": "64MiB"})

    def fault(*args, **kwargs):
        raise Planted(name)
    monkeypatch.setattr(pins, name, fault)
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    assert pin_scenario({"COMFY_MEMX_PIN_LIMIT": "64MiB"}) == baseline
    assert len(internal_errors(caplog)) == 1, internal_errors(caplog)
