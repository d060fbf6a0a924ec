"""Fault injection on the stand-ins: a bug anywhere in comfy_memx never changes what ComfyUI's calls answer, never
keeps a model ComfyUI dropped, and is logged once and counted.

The sites are found, not listed (``tests/fault_sites.py``): every function and method a wing defines, every
subscriber of every signal and pair, every guarded facade entry.  One *world* drives every patched site the way a
server meets them: a prompt that loads a model a pack keeps (ComfyUI warns at its garbage pass, comfy_memx reports
the leak and, with ``COMFY_MEMX_RELEASE=auto``, releases it), a prompt whose model another pack keeps after the
worker's unload (a leak ComfyUI never warns about), free flags set and served, ``free_memory``,
``unload_model_and_clones``, ``cleanup_models_gc``, a checkpoint file load, ComfyUI's checkpoint loader building a model, a CLIP and a VAE (and a clone), the
server's routes and, on 0.27.0, the
pin path (legacy tensor pins, DynamicVRAM layer pins and their lookups, ComfyUI's eviction walks, a node's cast
buffers).  The world runs once without comfy_memx (ComfyUI's answers), once with it and a profile hook (which sites
it reaches), then with failures planted: in each reached site alone, every unreached site together (none of their
faults may fire).  After each planted world, with the plants removed, the test clears the packs' own caches (as their
authors would) and checks:

(a) every ComfyUI call answered as without comfy_memx (return values, prompt success, exceptions);
(b) every model and ModelPatcher ComfyUI dropped is dead (weakref);
(c) each planted raise was counted once in ``errors.error_counts()`` (``/memx/status`` ``internal_errors``), every
    counted site was logged exactly once, and no other error happened.

``MemoryError``, ``RecursionError`` and ``KeyboardInterrupt`` stay what they are.  The failures a reviewer planted
in the code before the guarded pairs (the pin calls that reached ComfyUI, the load record that kept models alive,
the release that skipped the check of never-warned leaks) have named tests below; each failed on that code.
"""

import asyncio
import gc
import os
import shutil
import sys
import weakref

import pytest

import fault_sites
from comfy_memx.core import errors, registry, signals
from comfy_memx.core.bootstrap import bootstrap
from comfy_memx.core.state import STATE
from fake_comfy.loader import PACKS_DIR, make_model, make_patcher, purge_fake_comfy, use_fake_comfy

VERSIONS = ["0.3.64", "0.27.0", "0.38"]
"""The stand-ins: 0.3.64, 0.27.0, and 0.38's pins (the 0.27.0 stand-in with ``fake_comfy.v0_38_pins``)."""
SETTINGS = {"COMFY_MEMX_RELEASE": "auto", "COMFY_MEMX_RELEASE_PACKAGES": "leaky_pack",
            "COMFY_MEMX_PIN_LIMIT": "64MiB"}
LEAKED = {"1": {"class_type": "LeakyLoader", "inputs": {"name": "warned", "tensor_count": 2, "tensor_numel": 64,
                                                        "leak": True}},
          "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}
KEPT = {"1": {"class_type": "ListLoader", "inputs": {"name": "kept", "tensor_count": 2, "tensor_numel": 64}},
        "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}
PLAIN = {"1": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 2, "tensor_numel": 64}},
         "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0]}}}
SITES = fault_sites.all_sites()


def answer(call, *args, **kwargs):
    """What a ComfyUI call answered: its value, or the type and text of what it raised."""
    try:
        return ("returned", call(*args, **kwargs))
    except Exception as exc:   # a ComfyUI call that raised: part of its answer
        return ("raised", type(exc).__name__, str(exc))


def prompt_worker(mm, queue, executor):
    """What ComfyUI's prompt worker does after a prompt when free flags are set (named as ComfyUI's, which is how
    the ledger tells the worker's ``unload_all_models`` from anyone else's), then its garbage pass."""
    flags = queue.get_flags()
    answers = [sorted(flags)]
    if flags.get("unload_models", flags.get("free_memory", False)):
        answers.append(mm.unload_all_models())   # called from here: the ledger reads the caller's name
    if flags.get("free_memory"):
        answers.append(executor.reset())
    gc.collect()
    return answers


def install_packs(tmp_path):
    import nodes
    for name in ("leaky_pack", "hoarding_pack"):
        target = tmp_path / "custom_nodes" / name
        if not target.exists():
            shutil.copytree(os.path.join(PACKS_DIR, name), target)
        assert asyncio.run(nodes.load_custom_node(str(target))) is not False


def tracked_models():
    """Weak references to every torch model and ModelPatcher the stand-in builds from now on."""
    import comfy.model_base
    import comfy.model_patcher
    refs = []
    for cls in (comfy.model_base.BaseModel, comfy.model_patcher.ModelPatcher):
        init = cls.__init__

        def tracked(self, *args, _init=init, **kwargs):
            _init(self, *args, **kwargs)
            refs.append(weakref.ref(self))
        cls.__init__ = tracked
    return refs


def pin_path(mm, answers):
    """0.27.0's pins: legacy tensor pins of an offloaded load, DynamicVRAM layer pins and lookups, ComfyUI's
    eviction walks, a node's cast buffers, the unload of everything."""
    import comfy.pinned_memory as pm
    mm.vram_state = mm.VRAMState.NO_VRAM
    mm.SIM_RAM_AVAILABLE = 100 * 1024 ** 3
    answers.append(answer(mm.load_models_gpu, [make_patcher(4, 1024)]))
    blocks = list(make_model(3, 300).blocks)
    answers.append([answer(pm.pin_memory, block) for block in blocks])
    answers.append([answer(lambda b: pm.get_pin(b) is not None, block) for block in blocks])
    answers.append(answer(mm.free_pins, 1 << 20))
    answers.append(answer(mm.free_registrations, 1 << 20))
    answers.append(answer(mm.ensure_pin_budget, 1 << 10))
    answers.append(answer(mm.ensure_pin_registerable, 1 << 10))
    answers.append(answer(mm.reset_cast_buffers))
    del blocks


def pin_path_038(mm, answers):
    """0.38's pins (the 0.27.0 stand-in with ``fake_comfy.v0_38_pins``, no server: the first load logs the startup
    line): a load, per-subset layer pins, ComfyUI's own tiered eviction (booked, not reordered), a pin that ComfyUI
    unregistered and ``get_pin`` registers again, a tensor pin with ``evict_active``, a node's cast buffers."""
    import comfy.pinned_memory as pm
    import torch
    from fake_comfy import v0_38_pins
    answers.append(answer(mm.load_models_gpu, [make_patcher(2, 64)]))   # no server imported: the startup line now
    first, second = v0_38_pins.DynamicPatcher(mm, layers=2), v0_38_pins.DynamicPatcher(mm, layers=2)
    v0_38_pins.loaded(mm, second, first)
    for patcher in (first, second):
        answers.append([answer(pm.pin_memory, layer) for layer in patcher.layers()])
    answers.append(answer(pm.pin_memory, first.layers()[0], subset="weights-fast"))
    first.unregister_inactive_pins(1e30)                  # ComfyUI unregisters on a path comfy_memx does not wrap
    answers.append([answer(lambda layer: pm.get_pin(layer) is not None, layer) for layer in first.layers()])
    answers.append(answer(mm.pin_memory, torch.zeros(1024), False))
    answers.append(answer(mm.free_pins, 256 * 1024))
    answers.append(answer(mm.free_registrations, 1))
    answers.append(answer(mm.reset_cast_buffers))
    mm.current_loaded_models.clear()
    del first, second


def drive(version, tmp_path):
    """One world on the stand-in ``version`` (see the module docstring); returns ``(answers, model weakrefs)``."""
    if version == "0.38":
        return drive_038()
    mm = use_fake_comfy(version)
    import comfy.utils
    import execution
    import server
    import torch
    install_packs(tmp_path)
    refs = tracked_models()
    answers = []
    loop = asyncio.new_event_loop()
    try:
        prompt_server = server.PromptServer(loop)
        answers.append(answer(prompt_server.add_routes))
        executor = execution.PromptExecutor(prompt_server)
        answers.append((answer(executor.execute, LEAKED, "leaked"), executor.success))
        answers.append(answer(executor.reset))          # ComfyUI drops the patcher; the pack keeps the model
        answers.append(answer(mm.cleanup_models_gc))    # ComfyUI warns; comfy_memx reports and releases
        answers.append((answer(executor.execute, KEPT, "kept"), executor.success))
        queue = prompt_server.prompt_queue
        answers.append(answer(queue.set_flag, "unload_models", True))
        answers.append(prompt_worker(mm, queue, executor))
        answers.append(answer(mm.cleanup_models_gc))    # the kept model: a leak ComfyUI never warns about
        answers.append((answer(executor.execute, PLAIN, "plain"), executor.success))
        patcher = make_patcher(2, 64)
        answers.append(answer(mm.load_models_gpu, [patcher]))
        if hasattr(mm, "unload_model_and_clones"):
            answers.append(answer(mm.unload_model_and_clones, patcher))
        answers.append(answer(mm.free_memory, 1 << 40, mm.get_torch_device()))
        answers.append(answer(mm.cleanup_models_gc))
        del patcher
        path = tmp_path / "weights.pt"
        torch.save({"w": torch.zeros(3)}, path)
        answers.append(answer(lambda: sorted(comfy.utils.load_torch_file(str(path)))))
        if version == "0.27.0":
            pin_path(mm, answers)
        answers.append(answer(lambda: checkpoint_built(tmp_path)))
        answers.append(answer(mm.unload_all_models))
        answers.append(answer(executor.reset))
    finally:
        loop.close()
    return answers, refs


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


def prepare_038():
    """The 0.27.0 stand-in with the 0.38 pin layer in place, before comfy_memx starts (as a late activation)."""
    from fake_comfy import v0_38_pins
    mm = use_fake_comfy("0.27.0")
    import comfy.pinned_memory as pm
    mm.SIM_RAM_AVAILABLE = 100 * 1024 ** 3
    v0_38_pins.install(mm, pm)


def drive_038():
    """The 0.38 pin world on the stand-in :func:`prepare_038` made."""
    refs = tracked_models()
    answers = []
    pin_path_038(sys.modules["comfy.model_management"], answers)
    return answers, refs


def clear_packs():
    """What the packs' authors would do: drop every model their caches keep."""
    nodes = sys.modules.get("nodes")
    if nodes is None:
        return
    for module in {sys.modules[cls.__module__] for cls in nodes.NODE_CLASS_MAPPINGS.values()}:
        for name in ("LeakyLoader",):
            if hasattr(module, name):
                getattr(module, name)._cache.clear()
        for name in ("_CACHE", "HOARD"):
            if isinstance(getattr(module, name, None), list):
                getattr(module, name).clear()


def world(version, tmp_path, memx=True, plant=(), trace=False):
    """Run one world (comfy_memx off, or on under the production policy with failures planted in ``plant``) and
    return its :class:`fault_sites.Outcome`."""
    STATE.reset()
    try:
        if version == "0.38":
            prepare_038()
        if memx:
            bootstrap("api", dict(SETTINGS))
        with fault_sites.ErrorWatch() as watch, fault_sites.Garden(SITES) as garden:
            garden.plant(plant)
            if trace:
                reached, (answers, refs) = fault_sites.reached(SITES, lambda: drive(version, tmp_path))
            else:
                reached, (answers, refs) = None, drive(version, tmp_path)
        counts = errors.error_counts()
        clear_packs()
        gc.collect()
        survivors = [repr(ref()) for ref in refs if ref() is not None]
        return fault_sites.Outcome(answers, survivors, dict(garden.raised), watch, counts, reached)
    finally:
        registry.remove_all()
        purge_fake_comfy()
        STATE.reset()
        gc.collect()


def verdict(outcome, baseline):
    """Every problem of a planted world (empty when (a), (b) and (c) hold for it and each site that fired)."""
    return fault_sites.world_problems(outcome, baseline) + [
        problem for site in outcome.raised for problem in fault_sites.site_problems(site, outcome)]


@pytest.fixture(scope="module", autouse=True)
def frozen_heap():
    """Leave the heap built before the worlds (torch, pytest, comfy_memx) out of their collections: ComfyUI's
    garbage pass, the worker's and the survivors check collect in every world, and each would scan a few hundred
    thousand objects that no world touches.  The forward holder probe walks from frozen roots as from any; nothing a
    world builds is frozen."""
    import aiohttp.web  # noqa: F401  (what every world imports, once, before the heap is frozen)
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    purge_fake_comfy()
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    """Per version: the world without comfy_memx, and with it, traced (shared by this module's tests)."""
    cache = {}

    def get(version):
        if version not in cache:
            folder = tmp_path_factory.mktemp(f"world-{version}")
            cache[version] = (world(version, folder, memx=False), world(version, folder, trace=True), folder)
        return cache[version]
    return get


@pytest.mark.parametrize("version", VERSIONS)
def test_the_world_answers_as_comfyui_alone_and_keeps_nothing(version, worlds):
    without, with_memx, _ = worlds(version)
    assert with_memx.answers == without.answers
    assert with_memx.survivors == [] == without.survivors
    assert with_memx.counts == {} and with_memx.logged == [] and with_memx.raised == {}


def test_the_worlds_reach_every_guarded_call(worlds):
    reached = set().union(*(worlds(version)[1].reached for version in VERSIONS))
    names = {fault_sites.site_name(fn) for fn in fault_sites.guarded_calls().values()}
    unpatching = {"comfy_memx.surface.subscriptions.stop_metrics", "comfy_memx.pins.api.stop_budget"}  # (after)
    assert names - unpatching <= reached, sorted(names - unpatching - reached)


def test_every_site_is_found_without_a_list():
    """The wings define hundreds of functions; each is a site, and so is every guarded call."""
    assert len(SITES) > 600
    assert set(fault_sites.guarded_calls().values()) <= set(SITES.values())
    for wing in fault_sites.WINGS:
        assert any(name.startswith(f"comfy_memx.{wing}.") for name in SITES), wing


REACHED = {"0.3.64": 250, "0.27.0": 350, "0.38": 50}
"""At least so many sites are reached by each world (about 290, 380 and 70 today)."""
BATCH = {"0.27.0": 2, "0.3.64": 4, "0.38": 4}
"""Sites planted per world (see ``fault_sites.sweep``: a site whose failure did not fire is planted again alone, a
batch that goes wrong is split until each failing site is alone)."""


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failure_planted_in_each_reached_site_changes_no_answer_keeps_no_model_and_is_counted(version, worlds):
    without, traced, folder = worlds(version)
    failures, runs = fault_sites.sweep(lambda batch: world(version, folder, plant=batch), traced.reached, without,
                                       BATCH[version])
    assert len(traced.reached) > REACHED[version] and runs >= len(traced.reached) / BATCH[version]
    assert not failures, "\n".join(f"{name}: {problems}" for name, problems in sorted(failures.items()))


@pytest.mark.parametrize("version", VERSIONS)
def test_failures_planted_in_every_site_the_world_never_reaches_stay_silent(version, worlds):
    without, traced, folder = worlds(version)
    unreached = sorted(set(SITES) - traced.reached)
    outcome = world(version, folder, plant=unreached)
    assert len(unreached) > 250 and outcome.raised == {} and not verdict(outcome, without)


# -- the failures planted by review in the code before the guarded pairs --------------------------------------------

REVIEWED = [
    # reached ComfyUI: the pin path called these unguarded (both prompts failed, nothing was logged)
    "comfy_memx.pins.session.managing", "comfy_memx.pins.context.pin_lock", "comfy_memx.pins.context.current",
    "comfy_memx.pins.eviction.reorders_eviction", "comfy_memx.pins.requests.after_tensor_pin",
    # kept the models ComfyUI dropped: the load record, never popped, held ComfyUI's list and the caller's frame
    "comfy_memx.ledger.accounting.end_load", "comfy_memx.ledger.accounting.exit_unload_scope",
    "comfy_memx.ledger.accounting.enter_unload_scope", "comfy_memx.ledger.accounting.begin_load",
]


@pytest.mark.parametrize("name", REVIEWED)
def test_a_reviewed_failure_leaves_comfyui_alone(name, worlds):
    without, _traced, folder = worlds("0.27.0")
    outcome = world("0.27.0", folder, plant=[name])
    assert outcome.raised.get(name) and not verdict(outcome, without), verdict(outcome, without)


def test_a_failing_release_never_skips_the_check_for_leaks_comfyui_never_warns_about(tmp_path):
    """The release engine's cut and the check of never-warned leaks are subscriptions of their own."""
    release = "comfy_memx.leaks.release.engine.release"
    STATE.reset()
    found = []
    try:
        bootstrap("api", dict(SETTINGS))
        with fault_sites.Garden(SITES) as garden:
            garden.plant([release])
            drive("0.27.0", tmp_path)
            found = [record.leak["found_by"] for record in STATE.ledger.records() if record.leak]
            assert garden.raised[release] >= 1
    finally:
        registry.remove_all()
        purge_fake_comfy()
        STATE.reset()
    assert "after_free" in found and "comfyui_warning" in found, found


# -- nothing of ComfyUI's is reachable from comfy_memx after a failing half -------------------------------------------

def reachable_from_state(limit=200_000):
    """Every object reachable from comfy_memx's process state (``gc`` referents, breadth first; modules, classes and
    functions are not followed: they are code, not state).  A call's record lives nowhere else than in the frames
    of the call (``core.pairs``), so this is everything comfy_memx keeps once the call is over."""
    seen, queue = {}, [STATE]
    while queue and len(seen) < limit:
        obj = queue.pop()
        if id(obj) in seen or isinstance(obj, (type(sys), type, type(reachable_from_state))):
            continue
        seen[id(obj)] = obj
        queue.extend(gc.get_referents(obj))
    return seen.values()


@pytest.mark.parametrize("half", ["begin_load", "end_load", "enter_unload_scope", "exit_unload_scope",
                                  "note_model_unload", "state_before_unload"])
def test_a_failing_half_leaves_no_frame_or_model_reachable_from_comfy_memx(half, tmp_path):
    import types
    name = next(name for name in SITES if name.endswith(f".{half}") and ".ledger." in name)
    STATE.reset()
    try:
        bootstrap("api", {})
        mm = use_fake_comfy("0.27.0")
        with fault_sites.ErrorWatch() as watch, fault_sites.Garden(SITES) as garden:
            garden.plant([name])
            patcher = make_patcher(2, 64)
            models = [patcher]
            mm.load_models_gpu(models)
            mm.load_models_gpu([make_patcher(2, 64)])   # a second load, with one loaded already
            mm.free_memory(1 << 40, mm.get_torch_device())
            assert garden.raised[name] >= 1 and watch.reported[name] >= 1
        refs = [weakref.ref(patcher), weakref.ref(patcher.model)]
        held = [obj for obj in reachable_from_state()
                if isinstance(obj, types.FrameType) or obj is models or any(obj is ref() for ref in refs)]
        assert held == [] and loads_in_progress_seen_by_the_next_load(mm) == 1
        del patcher, models, held
        mm.unload_all_models()
        gc.collect()
        assert [ref() for ref in refs] == [None, None]
    finally:
        registry.remove_all()
        purge_fake_comfy()
        STATE.reset()


def loads_in_progress_seen_by_the_next_load(mm):
    """How many ``load_models_gpu`` calls a new one finds in progress on this thread (itself included): 1 when every
    earlier call is over, whatever failed in it."""
    seen = []

    def count(mm, models, caller_frame):
        seen.append(len(signals.load.calls()))
    signals.load.subscribe(count)
    try:
        mm.load_models_gpu([])
    finally:
        signals.load.unsubscribe(count)
    return seen[0]


# -- errors that are not comfy_memx's to swallow ----------------------------------------------------------------------

@pytest.mark.parametrize("half", ["before", "after"])
@pytest.mark.parametrize("error", [MemoryError, RecursionError, KeyboardInterrupt])
def test_memory_recursion_and_interrupt_stay_what_they_are_and_unwind_the_call(error, half):
    """Raised before ComfyUI's ``load_models_gpu`` (which then does not run) or after it (in its ``finally``), each
    reaches the caller unchanged and unlogged, and the load's record is gone."""
    def raising(*args):
        raise error("planted")
    STATE.reset()
    try:
        bootstrap("api", {})
        mm = use_fake_comfy("0.27.0")
        if half == "before":
            signals.load.subscribe(raising)
        else:
            signals.load.subscribe(after=raising)
        with pytest.raises(error, match="planted"):
            mm.load_models_gpu([make_patcher(2, 64)])
        signals.load.unsubscribe(raising)
        assert loads_in_progress_seen_by_the_next_load(mm) == 1 and errors.error_counts() == {}
    finally:
        signals.load.unsubscribe(raising)
        registry.remove_all()
        purge_fake_comfy()
        STATE.reset()
