"""The fake ComfyUI shapes have the semantics comfy_memx's patches rely on (reference sections 3-8, 11-13)."""
import asyncio
import gc
import inspect
import json
import logging
import os
import subprocess
import sys
import threading

import pytest

if __package__:
    from .fake_comfy import fixtures as _fixtures, loader as fc
else:
    from fake_comfy import fixtures as _fixtures, loader as fc

fake_comfy = _fixtures.fake_comfy
fake_comfy_0364 = _fixtures.fake_comfy_0364
fake_comfy_0270 = _fixtures.fake_comfy_0270

MiB = 1024 * 1024
LEAK_INFO = "Potential memory leak detected with model BaseModel, doing a full garbage collect"
LEAK_WARNING = "WARNING, memory leak with model BaseModel. Please make sure it is not being referenced from somewhere."


def load(mm, *patchers):
    for p in patchers:
        mm.load_models_gpu([p])


def record_unloads(mm, monkeypatch):
    """Patchers passed to LoadedModel.model_unload, in call order."""
    calls = []
    original = mm.LoadedModel.model_unload

    def spy(self, *args, **kwargs):
        calls.append(self.model)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(mm.LoadedModel, "model_unload", spy)
    return calls


def squeeze_vram(mm, free_bytes):
    """Leave ``free_bytes`` above the inference reserve free on the simulated GPU, counting resident weights."""
    used = mm.SIM_VRAM_TOTAL - mm.get_free_memory(mm.get_torch_device())
    mm.SIM_VRAM_TOTAL = int(mm.minimum_inference_memory() + used + free_bytes)


# --- load_models_gpu / current_loaded_models -------------------------------------------------------------

def test_load_makes_weights_resident_and_most_recent_first(fake_comfy):
    mm = fake_comfy
    a, b, c = (fc.make_patcher(4, 64 * 1024) for _ in range(3))
    load(mm, a, b, c)
    assert [e.model for e in mm.current_loaded_models] == [c, b, a]
    assert all(p.loaded_size() == p.model_size() == 4 * 256 * 1024 for p in (a, b, c))
    assert mm.get_free_memory(mm.get_torch_device()) == mm.SIM_VRAM_TOTAL - 3 * a.model_size()
    assert mm.load_models_gpu([a]) is None
    assert [e.model for e in mm.current_loaded_models] == [a, c, b]


def test_loaded_weights_are_copies_that_come_back_on_offload(fake_comfy):
    mm = fake_comfy
    import torch
    p = fc.make_patcher(2, 16)
    load(mm, p)
    buffers = p.model._sim_device_weights
    assert set(buffers) == {"blocks.0.weight", "blocks.1.weight"}
    assert buffers["blocks.0.weight"].data_ptr() != p.model.blocks[0].weight.data_ptr()
    with torch.inference_mode():  # weights are loaded and used in inference mode, as in ComfyUI
        buffers["blocks.0.weight"].fill_(7.0)
    mm.unload_all_models()
    assert p.model._sim_device_weights == {} and p.loaded_size() == 0
    assert float(p.model.blocks[0].weight[0]) == 7.0


def test_clone_replaces_loaded_entry_silently(fake_comfy, monkeypatch, caplog):
    mm = fake_comfy
    base = fc.make_patcher(2, 1024)
    load(mm, base)
    old_entry = mm.current_loaded_models[0]
    buffer = base.model._sim_device_weights["blocks.0.weight"]
    unloads = record_unloads(mm, monkeypatch)
    clone = base.clone()
    assert clone.parent is base and clone.is_clone(base)
    with caplog.at_level(logging.INFO):
        load(mm, clone)
    assert [e.model for e in mm.current_loaded_models] == [clone]
    assert unloads == [] and not old_entry.model_finalizer.alive
    assert base.model._sim_device_weights["blocks.0.weight"] is buffer  # detach(unpatch_all=False) kept weights
    assert "Requested to load BaseModel" in caplog.text


def test_free_memory_victim_order_and_return_value(fake_comfy, monkeypatch):
    mm = fake_comfy
    held = fc.make_patcher(2, 1024)      # smallest, but referenced twice
    plain = fc.make_patcher(4, 1024)
    offloaded = fc.make_patcher(8, 1024)  # biggest, partly offloaded: goes first
    load(mm, held, plain, offloaded)
    extra_reference = [held]
    assert mm.current_loaded_models[0].model_unload(memory_to_free=1) is False
    assert offloaded.loaded_size() < offloaded.model_size()
    unloads = record_unloads(mm, monkeypatch)
    entries = list(mm.current_loaded_models)
    popped = mm.free_memory(1e30, mm.get_torch_device())
    assert unloads == [offloaded, plain, held]
    assert popped == entries[::-1]  # popped by descending index: oldest first
    assert mm.current_loaded_models == [] and all(e.real_model is None for e in popped)
    assert extra_reference


def test_free_memory_ties_go_to_most_recently_loaded(fake_comfy, monkeypatch):
    mm = fake_comfy
    older, newer = fc.make_patcher(2, 1024), fc.make_patcher(2, 1024)
    load(mm, older, newer)
    unloads = record_unloads(mm, monkeypatch)
    mm.free_memory(1e30, mm.get_torch_device())
    assert unloads == [newer, older]


def test_smart_memory_unloads_only_what_is_needed(fake_comfy, monkeypatch):
    mm = fake_comfy
    small, big = fc.make_patcher(2, 256 * 1024), fc.make_patcher(8, 256 * 1024)
    load(mm, big, small)
    squeeze_vram(mm, 0)
    unloads = record_unloads(mm, monkeypatch)
    popped = mm.free_memory(mm.minimum_inference_memory() + MiB // 2, mm.get_torch_device())
    assert unloads == [small] and popped == []  # the first victim gave up one 1 MiB tensor; that was enough
    assert small.loaded_size() == MiB and big.loaded_size() == big.model_size()
    assert [e.model for e in mm.current_loaded_models] == [small, big]


def test_partial_unload_returns_false_and_full_unload_true(fake_comfy):
    mm = fake_comfy
    p = fc.make_patcher(4, 256 * 1024)
    load(mm, p)
    entry = mm.current_loaded_models[0]
    assert entry.model_unload(memory_to_free=MiB // 2) is False
    assert p.loaded_size() == 3 * MiB and entry.real_model() is p.model
    assert entry.model_unload(memory_to_free=10 * MiB) is True
    assert p.loaded_size() == 0 and entry.real_model is None and entry.model_finalizer is None


def test_disable_smart_memory_unloads_every_candidate(fake_comfy):
    mm = fake_comfy
    a, b, c = fc.make_patcher(2, 1024), fc.make_patcher(2, 1024), fc.make_patcher(2, 1024)
    load(mm, a, b)
    mm.DISABLE_SMART_MEMORY = True
    assert len(mm.free_memory(1, mm.get_torch_device())) == 2
    assert a.loaded_size() == b.loaded_size() == 0
    load(mm, a, c)  # each load now evicts every other model
    assert [e.model for e in mm.current_loaded_models] == [c] and a.loaded_size() == 0


def test_memory_pressure_in_load_models_gpu_evicts_older_model(fake_comfy):
    mm = fake_comfy
    old, new = fc.make_patcher(4, 256 * 1024), fc.make_patcher(4, 256 * 1024)
    load(mm, old)
    squeeze_vram(mm, int(0.05 * new.model_size()))  # load asks for 1.1x: the old model must go entirely
    load(mm, new)
    assert [e.model for e in mm.current_loaded_models] == [new]
    assert old.loaded_size() == 0 and new.loaded_size() == new.model_size()


def test_cpu_shape_never_calls_free_memory(fake_comfy, monkeypatch):
    mm = fake_comfy
    mm.set_sim_device("cpu")
    calls = []
    original = mm.free_memory
    monkeypatch.setattr(mm, "free_memory", lambda *a, **k: calls.append(a) or original(*a, **k))
    a, b = fc.make_patcher(2, 1024), fc.make_patcher(2, 1024)
    load(mm, a, b)
    assert calls == [] and len(mm.current_loaded_models) == 2
    assert a.current_loaded_device().type == "cpu" and a.loaded_size() == a.model_size()
    mm.unload_all_models()  # internal call through the module global
    assert len(calls) == 1 and mm.current_loaded_models == []


# --- leak detection ----------------------------------------------------------------------------------------

def test_leaked_module_is_dead_entry_with_two_stage_logs(fake_comfy, caplog):
    mm = fake_comfy
    patcher = fc.make_patcher(2, 1024)
    load(mm, patcher)
    entry = mm.current_loaded_models[0]
    leak = {"module": patcher.model}
    del patcher
    assert entry.is_dead()
    with caplog.at_level(logging.INFO):
        mm.cleanup_models_gc()
    levels = [(r.levelno, r.getMessage()) for r in caplog.records if "leak" in r.getMessage()]
    assert levels[0][0] == logging.INFO and levels[0][1].startswith(LEAK_INFO)
    assert levels[1:] == [(logging.WARNING, LEAK_WARNING)]
    assert mm.current_loaded_models == [entry]  # dead entries stay until the module dies
    leak.clear()
    assert mm.current_loaded_models == []


def test_cycle_only_leak_logs_info_but_no_warning(fake_comfy, caplog):
    mm = fake_comfy
    patcher = fc.make_patcher(2, 1024)
    load(mm, patcher)
    gc.disable()
    try:
        patcher.model.cycle = [patcher.model]
        del patcher
        assert mm.current_loaded_models[0].is_dead()
        with caplog.at_level(logging.INFO):
            mm.cleanup_models_gc()
    finally:
        gc.enable()
    assert LEAK_INFO in caplog.text and LEAK_WARNING not in caplog.text
    assert mm.current_loaded_models == []


# --- signatures and version differences --------------------------------------------------------------------

def test_free_memory_has_3_params_in_0364(fake_comfy_0364):
    mm = fake_comfy_0364
    assert list(inspect.signature(mm.free_memory).parameters) == ["memory_required", "device", "keep_loaded"]
    for name in ("pin_memory", "MAX_PINNED_MEMORY", "unload_model_and_clones", "is_oom", "get_all_torch_devices"):
        assert not hasattr(mm, name)
    assert issubclass(mm.OOM_EXCEPTION, BaseException)


def test_free_memory_has_6_params_in_0270(fake_comfy_0270):
    mm = fake_comfy_0270
    assert list(inspect.signature(mm.free_memory).parameters) == [
        "memory_required", "device", "keep_loaded", "for_dynamic", "pins_required", "ram_required"]
    assert mm.is_oom(mm.OOM_EXCEPTION("CUDA out of memory")) and not mm.is_oom(ValueError())


def test_common_signatures(fake_comfy):
    mm = fake_comfy
    assert list(inspect.signature(mm.load_models_gpu).parameters) == [
        "models", "memory_required", "force_patch_weights", "minimum_memory_required", "force_full_load"]
    assert list(inspect.signature(mm.LoadedModel.model_unload).parameters) == ["self", "memory_to_free", "unpatch_weights"]
    assert list(inspect.signature(mm.get_free_memory).parameters) == ["dev", "torch_free_too"]


def test_unload_model_and_clones_keeps_other_models(fake_comfy_0270):
    mm = fake_comfy_0270
    base, other = fc.make_patcher(2, 1024), fc.make_patcher(2, 1024)
    clone = base.clone()
    load(mm, clone, other)
    mm.unload_model_and_clones(base)
    assert [e.model for e in mm.current_loaded_models] == [other]


# --- pinned memory (0.27.0) --------------------------------------------------------------------------------

def test_pin_bookkeeping_follows_offload_and_load(fake_comfy_0270):
    mm = fake_comfy_0270
    assert mm.MAX_PINNED_MEMORY > 0
    p = fc.make_patcher(4, 256 * 1024)
    load(mm, p)
    assert mm.TOTAL_PINNED_MEMORY == 0 and mm.HOST_REGISTER.calls == []
    mm.current_loaded_models[0].model_unload(memory_to_free=MiB + 1)  # two 1 MiB tensors go to CPU
    assert mm.TOTAL_PINNED_MEMORY == 2 * MiB == sum(mm.PINNED_MEMORY.values())
    assert len(p.pinned) == 2 and [c[0] for c in mm.HOST_REGISTER.calls] == ["register"] * 2
    load(mm, p)  # loading the rest unpins first
    assert mm.TOTAL_PINNED_MEMORY == 0 and mm.PINNED_MEMORY == {} and p.pinned == set()
    assert [c[0] for c in mm.HOST_REGISTER.calls] == ["register"] * 2 + ["unregister"] * 2


def test_pin_refusals_and_failures(fake_comfy_0270, caplog):
    mm = fake_comfy_0270
    import torch
    t = torch.ones(256)
    mm.HOST_REGISTER.fail = True
    assert mm.pin_memory(t) is False and "Pin error." in caplog.text
    mm.HOST_REGISTER.fail = False
    assert mm.pin_memory(t) is True and mm.pin_memory(t) is False  # already pinned
    assert mm.pin_memory(torch.ones(4, 4).t()) is False  # not contiguous
    assert mm.unpin_memory(torch.ones(3)) is False and "not pinned by ComfyUI" in caplog.text
    assert mm.unpin_memory(t) is True and mm.TOTAL_PINNED_MEMORY == 0
    mm.set_sim_device("cpu")
    assert mm.MAX_PINNED_MEMORY == -1 and mm.pin_memory(t) is False


def test_pin_budget_and_registerable(fake_comfy_0270):
    mm = fake_comfy_0270
    mm.SIM_RAM_AVAILABLE = 100 * 1024 ** 3
    assert mm.ensure_pin_budget(MiB) is True
    mm.SIM_RAM_AVAILABLE = MiB
    assert mm.ensure_pin_budget(MiB) is False  # short on RAM and no dynamic pins to free
    mm.MAX_PINNED_MEMORY = 4 * MiB
    mm.TOTAL_PINNED_MEMORY = 3 * MiB
    assert mm.ensure_pin_registerable(MiB) is True
    assert mm.ensure_pin_registerable(2 * MiB) is False
    mm.MAX_PINNED_MEMORY = -1
    assert mm.free_registrations(1) is False


def test_free_memory_runs_pin_budget_step(fake_comfy_0270, monkeypatch):
    mm = fake_comfy_0270
    calls = []
    monkeypatch.setattr(mm, "ensure_pin_budget", lambda size, evict_active=False: calls.append(("budget", size)) or True)
    monkeypatch.setattr(mm, "ensure_pin_registerable", lambda size, evict_active=True: calls.append(("reg", size)) or True)
    p = fc.make_patcher(2, 1024)
    load(mm, p)
    assert calls == [("budget", p.model_size()), ("reg", p.model_size())]


def test_module_pins_count_towards_total(fake_comfy_0270):
    mm = fake_comfy_0270
    import comfy.pinned_memory as pinned_memory
    mm.SIM_RAM_AVAILABLE = 100 * 1024 ** 3
    block = fc.make_model(1, 300).blocks[0]
    assert pinned_memory.pin_memory(block) is True
    assert mm.TOTAL_PINNED_MEMORY == 2048 and pinned_memory.get_pin(block).nbytes == 2048
    assert pinned_memory.pin_memory(block) is None


# --- cli_args -----------------------------------------------------------------------------------------------

def fresh_shape(version):
    """Purge every shape and put ``version`` on sys.path without importing anything from it."""
    fc.purge_fake_comfy()
    sys.path[:0] = fc.shape_paths(version)


@pytest.mark.parametrize("version", ["0.3.64", "0.27.0"])
def test_cli_args_parse_argv_once_and_only_when_enabled(version, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["main.py", "--cpu"])
    try:
        fresh_shape(version)
        import comfy.cli_args
        import comfy.options
        assert comfy.cli_args.args.cpu is False
        comfy.options.enable_args_parsing()
        import comfy.cli_args as again
        assert again.args.cpu is False  # frozen at first import
        fresh_shape(version)
        import comfy.options
        comfy.options.enable_args_parsing()
        import comfy.cli_args
        assert comfy.cli_args.args.cpu is True
        fresh_shape(version)
        monkeypatch.setattr(sys, "argv", ["main.py", "--disable-pinned-memory"])
        import comfy.options
        comfy.options.enable_args_parsing()
        if version == "0.3.64":
            with pytest.raises(SystemExit) as exit_info:
                import comfy.cli_args  # noqa: F401
            assert exit_info.value.code == 2
        else:
            import comfy.cli_args
            assert comfy.cli_args.args.disable_pinned_memory is True
    finally:
        fc.purge_fake_comfy()


# --- execution, nodes, custom nodes, main.prompt_worker ----------------------------------------------------

LOADER_PROMPT = {"1": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 2, "tensor_numel": 1024}},
                 "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0]}}}


def executor():
    import execution
    return execution.PromptExecutor(None)


def test_executor_caches_loader_output_across_prompts(fake_comfy, caplog):
    mm = fake_comfy
    e = executor()
    with caplog.at_level(logging.INFO):
        e.execute(LOADER_PROMPT, "p1")
        patcher = mm.current_loaded_models[0].model
        e.execute(LOADER_PROMPT, "p2")
    assert e.success and caplog.text.count("Requested to load BaseModel") == 1
    assert mm.current_loaded_models[0].model is patcher and patcher.loaded_size() == patcher.model_size()
    del patcher
    e.reset()  # drops the cache: patcher and module die, the finalizer removes the entry
    assert mm.current_loaded_models == []


def test_executor_node_context_and_one_cleanup_per_prompt(fake_comfy, monkeypatch):
    mm = fake_comfy
    import nodes
    from comfy_execution.utils import get_executing_context
    seen = []

    class Probe:
        FUNCTION = "run"
        OUTPUT_NODE = True

        def run(self, value):
            seen.append(get_executing_context())
            return (value,)

    monkeypatch.setitem(nodes.NODE_CLASS_MAPPINGS, "Probe", Probe)
    calls = []
    original = mm.cleanup_models_gc
    monkeypatch.setattr(mm, "cleanup_models_gc", lambda: calls.append(1) or original())
    executor().execute({"7": {"class_type": "Probe", "inputs": {"value": 1}}}, "prompt-a")
    assert seen == [("prompt-a", "7", 0)] and get_executing_context() is None
    assert calls == [1]


def test_ram_pressure_eviction_mid_prompt_keeps_the_inputs_of_the_nodes_still_to_run(fake_comfy_0270, caplog):
    import execution
    # RAM always short of the headroom: after every node the RAM-pressure step evicts even the active entries.
    e = execution.PromptExecutor(None, cache_type=execution.CacheType.RAM_PRESSURE,
                                 cache_args={"ram": 1 << 20, "ram_inactive": 1 << 20})
    e.execute(LOADER_PROMPT, "p")
    assert e.success and "Exception during processing" not in caplog.text
    assert e.caches.outputs.entries == {}          # the loader's output was evicted before the sampler ran


def test_executor_oom_unloads_all_models(fake_comfy, caplog):
    mm = fake_comfy
    e = executor()
    e.execute(LOADER_PROMPT, "ok")
    bad = {"1": LOADER_PROMPT["1"], "3": {"class_type": "SimSampler", "inputs": {"model": ["1", 0], "raise_oom": True}}}
    e.execute(bad, "oom")
    assert not e.success and "Got an OOM, unloading all loaded models." in caplog.text
    assert mm.current_loaded_models == []


def test_executor_unloads_at_end_without_smart_memory(fake_comfy):
    mm = fake_comfy
    mm.DISABLE_SMART_MEMORY = True
    executor().execute(LOADER_PROMPT, "p")
    assert mm.current_loaded_models == []


def test_leaky_pack_leak_is_reported(fake_comfy, caplog):
    mm = fake_comfy
    import folder_paths
    import nodes
    folder_paths.add_model_folder_path("custom_nodes", fc.PACKS_DIR)
    asyncio.run(nodes.init_extra_nodes())
    assert "LeakyLoader" in nodes.NODE_CLASS_MAPPINGS
    prompt = {"1": {"class_type": "LeakyLoader", "inputs": {"name": "k", "leak": True}},
              "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}
    e = executor()
    e.execute(prompt, "p")
    e.reset()
    with caplog.at_level(logging.INFO):
        mm.cleanup_models_gc()
    assert LEAK_WARNING in caplog.text
    nodes.NODE_CLASS_MAPPINGS["LeakyLoader"]._cache.clear()
    assert mm.current_loaded_models == []


def test_prompt_queue_flags_wake_the_worker_queue(fake_comfy):
    import execution
    q = execution.PromptQueue(execution._SilentServer())
    threading.Timer(0.05, q.set_flag, args=("unload_models", True)).start()
    assert q.get(timeout=30) is None
    assert q.get_flags(reset=False) == {"unload_models": True}
    assert q.get_flags() == {"unload_models": True} and q.get_flags() == {}


def test_prompt_worker_handles_free_flags(fake_comfy, monkeypatch, caplog):
    mm = fake_comfy
    unloads = []
    original = mm.unload_all_models
    monkeypatch.setattr(mm, "unload_all_models", lambda: unloads.append(1) or original())
    root_handlers = list(logging.getLogger().handlers)
    root_level = logging.getLogger().level
    try:
        import main
        import nodes
        assert "WARNING: Potential Error in code: Torch already imported, torch should never be imported before this point." in caplog.text

        class Stop(BaseException):
            """Not an Exception, so the executor lets it end prompt_worker."""

        class StopWorker:
            FUNCTION = "stop"
            OUTPUT_NODE = True

            def stop(self):
                raise Stop

        def run_worker(q, server):
            try:
                main.prompt_worker(q, server)
            except Stop:
                pass

        nodes.NODE_CLASS_MAPPINGS["StopWorker"] = StopWorker
        server = main.HeadlessServer(None)
        q = server.prompt_queue
        q.put((0, "load", LOADER_PROMPT, {}, ["2"], {}))
        q.put((1, "stop", {"9": {"class_type": "StopWorker", "inputs": {}}}, {}, ["9"], {}))
        q.set_flag("free_memory", True)  # read after the first prompt, before the second
        worker = threading.Thread(target=run_worker, args=(q, server), daemon=True)
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive()
        assert unloads == [1]  # unload_models defaults to the free_memory value
        assert mm.current_loaded_models == [] and q.history["load"]["status"]["status_str"] == "success"
    finally:
        logging.getLogger().handlers[:] = root_handlers
        logging.getLogger().setLevel(root_level)


def test_load_torch_file_shapes(fake_comfy, tmp_path):
    import safetensors.torch
    import torch
    import comfy.utils
    sd = {"a": torch.ones(2), "b": torch.zeros(3)}
    st = str(tmp_path / "m.safetensors")
    safetensors.torch.save_file(sd, st, metadata={"format": "pt"})
    loaded, metadata = comfy.utils.load_torch_file(st, return_metadata=True)
    assert set(loaded) == {"a", "b"} and metadata == {"format": "pt"} and torch.equal(loaded["a"], sd["a"])
    for name, payload in (("w.ckpt", {"state_dict": sd}), ("x.pt", {"model": sd}), ("y.pt", sd)):
        torch.save(payload, str(tmp_path / name))
        assert set(comfy.utils.load_torch_file(str(tmp_path / name))) == {"a", "b"}
    assert comfy.utils.load_torch_file(str(tmp_path / "y.pt"), return_metadata=True)[1] is None


# --- main.py as a process ----------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def main_runs(request):
    """Start main.py of both shapes when this module starts, so their torch imports overlap the other tests."""
    if not any(item.originalname == "test_main_quick_test_for_ci_exits_0" for item in request.session.items):
        yield {}
        return
    env = dict(os.environ, FAKE_COMFY_CUSTOM_NODE_DIRS=fc.PACKS_DIR)
    procs = {version: subprocess.Popen([sys.executable, os.path.join(fc.shape_root(version), "main.py"), "--cpu",
                                        "--quick-test-for-ci", "--verbose", "DEBUG"],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for version in fc.SHAPES}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.mark.parametrize("version", ["0.3.64", "0.27.0"])
def test_main_quick_test_for_ci_exits_0(main_runs, version):
    out, _ = main_runs[version].communicate(timeout=120)
    assert main_runs[version].returncode == 0, out
    assert f"ComfyUI version: {version}" in out and "Set vram state to: DISABLED" in out
    assert "Torch already imported" not in out
    assert "Trying to load custom node" in out and "leaky_pack" in out


# --- one base, a version layer per version ---------------------------------------------------------------

STAND_IN_MODULES = ("main", "comfyui_version", "comfy", "comfy.options", "comfy.cli_args", "comfy.model_management",
                    "comfy.model_patcher", "comfy.model_base", "comfy.utils", "comfy_execution.utils", "execution",
                    "nodes", "server", "folder_paths", "hook_breaker_ac10a0", "stand_in_version")


def test_the_0_3_64_shape_is_the_base_with_its_own_version_layer(tmp_path):
    """0.3.64 keeps no copy of the base: imported as ComfyUI, every module but its main.py and comfyui_version.py
    is the base's, and what 0.3.64 does differently comes from its version layer (one file per base module)."""
    root, base = fc.shape_root("0.3.64"), fc.BASE
    code = ("import importlib, json, sys; [importlib.import_module(name) for name in %r]; "
            "mm = sys.modules['comfy.model_management']; "
            "print(json.dumps({'files': {name: sys.modules[name].__file__ for name in %r}, "
            "'free_memory': mm.free_memory.__code__.co_filename, 'pins': hasattr(mm, 'pin_memory')}))"
            % (STAND_IN_MODULES, STAND_IN_MODULES))
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(fc.shape_paths("0.3.64") + sys.path)})
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])

    own = {name: path for name, path in found["files"].items() if not path.startswith(base + os.sep)}
    assert own == {"main": os.path.join(root, "main.py"), "comfyui_version": os.path.join(root, "comfyui_version.py")}
    assert found["free_memory"] == os.path.join(root, "version_layer", "comfy", "model_management.py")
    assert found["pins"] is False
    layer = os.path.join(root, "version_layer")
    parts = {os.path.relpath(os.path.join(folder, name), layer)
             for folder, _, names in os.walk(layer) if "__pycache__" not in folder for name in names}
    assert parts and all(os.path.isfile(os.path.join(base, part)) for part in parts), parts
