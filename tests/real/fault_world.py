"""Fault injection inside a real ComfyUI process: every site of ``tests/fault_sites.py`` planted in worlds of ComfyUI's
own code.

Run with the interpreter of a ComfyUI tree, comfy_memx installed for it (``tests/real/test_real_faults.py`` does)::

    python tests/real/fault_world.py --comfyui path/to/ComfyUI --json OUT [--batch 8]

One process imports the tree once (``main.py --cpu``) and runs every world in it.  Before each world comfy_memx starts
as a late activation (the bootstrap patches what is imported) under the production policy with
``COMFY_MEMX_RELEASE=auto`` for the test pack; after it, comfy_memx is unpatched and reset, the pack lets its models
go (as its author would) and the world's models must all be dead.  A world, all through ComfyUI's own code:

* a prompt run by ComfyUI's ``PromptExecutor`` (in-process, no server) with the nodes of a test pack that ComfyUI's
  ``load_custom_node`` loads from a ``custom_nodes`` folder of the run: its loader keeps the model in a class-level
  cache, ComfyUI's cache reset drops the patcher, ``cleanup_models_gc`` warns, comfy_memx reports the leak and
  releases it;
* a prompt whose model the pack appends to a module-level list, the free flags set and served by a function named
  ``prompt_worker`` (``unload_all_models``, the cache reset, a garbage pass), ``cleanup_models_gc``: a leak ComfyUI
  never warns about;
* ``load_models_gpu``, ``unload_model_and_clones`` (0.27.0+), ``free_memory``, ``cleanup_models_gc``,
  ``load_torch_file`` of a small safetensors file;
* on trees with pinned memory (0.27.0+), ComfyUI's own pin code with the registration stood in as
  ``bench/pin_invariant.py`` does (``cudaHostRegister`` recorded, comfy-aimdo's allocator stood in, the load device
  ``meta``, ``vram_state`` NO_VRAM): a legacy model loaded with every weight pinned, a DynamicVRAM model's layers
  pinned and looked up, a node's cast buffers, ComfyUI's eviction walks (reordered on 0.27.0, booked on 0.33.0+),
  then a prompt, which must still succeed.

What each ComfyUI call answered is compared with the same world without comfy_memx.  Sites are planted as the stand-in
suite plants them (``fault_sites.sweep``: a few per world, a silent site again alone, a failing batch split); the
routes (``PromptServer.add_routes``) are left to the stand-ins and to the server test of test_real_faults.py.  Prints
and writes a JSON verdict: the tree, the sites, the worlds run, the sites reached, the failures per site, the
baseline worlds, the seconds.  Exit status 0 when nothing failed, 1 when something did, 2 when it could not run.
"""

import argparse
import asyncio
import gc
import inspect
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
SETTINGS = {"COMFY_MEMX_RELEASE": "auto", "COMFY_MEMX_RELEASE_PACKAGES": "memx_fault_pack",
            "COMFY_MEMX_PIN_LIMIT": "64MiB"}
PACK = '''
"""A pack of the fault suite: a loader that keeps its model in a class-level cache, one that appends it to a
module-level list, and a node that loads its input model (the output node)."""
import torch

import comfy.model_management
import comfy.model_patcher

KEPT = []


def _patcher(width):
    mm = comfy.model_management
    return comfy.model_patcher.ModelPatcher(torch.nn.Linear(width, width), load_device=mm.get_torch_device(),
                                            offload_device=torch.device("cpu"))


class MemxFaultLoader:
    _cache = {}

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "kept"}), "width": ("INT", {"default": 8})}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "load"
    CATEGORY = "memx"

    def load(self, name, width):
        patcher = _patcher(width)
        MemxFaultLoader._cache[name] = patcher.model
        comfy.model_management.load_models_gpu([patcher])
        return (patcher,)


class MemxFaultListLoader(MemxFaultLoader):
    def load(self, name, width):
        patcher = _patcher(width)
        KEPT.append(patcher.model)
        comfy.model_management.load_models_gpu([patcher])
        return (patcher,)


class MemxFaultUse:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "use"
    OUTPUT_NODE = True
    CATEGORY = "memx"

    def use(self, model):
        comfy.model_management.load_models_gpu([model])
        return (int(model.loaded_size()),)


NODE_CLASS_MAPPINGS = {"MemxFaultLoader": MemxFaultLoader, "MemxFaultListLoader": MemxFaultListLoader,
                       "MemxFaultUse": MemxFaultUse}
'''


def prompt(loader, name):
    """A two-node prompt: ``loader`` builds a model, the output node loads it."""
    return {"1": {"class_type": loader, "inputs": {"name": name, "width": 8}},
            "2": {"class_type": "MemxFaultUse", "inputs": {"model": ["1", 0]}}}


def answer(call, *args, **kwargs):
    """What a ComfyUI call answered: its value (simplified to JSON), or the type and text of what it raised."""
    try:
        value = call(*args, **kwargs)
    except Exception as exc:   # a ComfyUI call that raised: part of its answer
        return ["raised", type(exc).__name__, str(exc)[:200]]
    return ["returned", value if isinstance(value, (type(None), bool, int, float, str)) else type(value).__name__]


class Server:
    """What ComfyUI's executor and prompt queue need of ``server.PromptServer``, without HTTP."""
    client_id = None
    last_node_id = None
    last_prompt_id = None

    def __init__(self, execution):
        self.prompt_queue = execution.PromptQueue(self)

    def send_sync(self, *args, **kwargs):
        pass

    def queue_updated(self):
        pass


class World:
    """ComfyUI imported once, with what every world needs (see the module docstring)."""

    def __init__(self, tree, folder):
        self.tree, self.folder = tree, folder
        sys.path.insert(0, tree)
        sys.argv = ["main.py", "--cpu"]
        import comfy.options
        comfy.options.enable_args_parsing()
        import torch
        import comfy.model_management as mm
        import comfy.model_patcher
        import comfy.utils
        import execution
        import nodes
        self.torch, self.mm, self.mp, self.utils, self.execution = torch, mm, comfy.model_patcher, comfy.utils, execution
        self.pins = os.path.exists(os.path.join(tree, "comfy", "pinned_memory.py"))
        if self.pins:
            self._stand_in_registration()
        pack = os.path.join(folder, "custom_nodes", "memx_fault_pack")
        os.makedirs(pack)
        with open(os.path.join(pack, "__init__.py"), "w", encoding="utf-8") as f:
            f.write(PACK)
        assert asyncio.run(nodes.load_custom_node(pack)) is not False, "the test pack did not load"
        self.pack = sys.modules[nodes.NODE_CLASS_MAPPINGS["MemxFaultUse"].__module__]
        self.weights = os.path.join(folder, "weights.safetensors")
        import safetensors.torch
        safetensors.torch.save_file({"w": torch.zeros(3)}, self.weights)
        self.tracked = []
        init = self.mp.ModelPatcher.__init__

        def tracked(patcher, *args, **kwargs):
            init(patcher, *args, **kwargs)
            self.tracked.append(weakref.ref(patcher))
            model = getattr(patcher, "model", None)
            if model is not None:
                self.tracked.append(weakref.ref(model))
        self.mp.ModelPatcher.__init__ = tracked

    def _stand_in_registration(self):
        """bench/pin_invariant.py's stand-ins: a recorder for cudaHostRegister, comfy-aimdo's allocator, a ``meta``
        load device with room, and the pin cap ComfyUI sets on an NVIDIA machine (comfy_memx adopts it)."""
        import comfy_memx  # noqa: F401  (the installed one, before the checkout joins the path for its bench package)
        if ROOT not in sys.path:
            sys.path.append(ROOT)
        from bench import pin_invariant as invariant
        torch, mm = self.torch, self.mm
        import comfy.ops
        import comfy.pinned_memory
        self.ops, self.pm, self.invariant = comfy.ops, comfy.pinned_memory, invariant
        recorder_ref = [None]
        invariant.install_aimdo_stand_ins(torch, recorder_ref)
        self.device = torch.device("meta")
        mm.discard_cuda_async_error = lambda: None
        cpu_free = mm.get_free_memory

        def get_free_memory(dev=None, torch_free_too=False):
            if getattr(dev, "type", None) == "meta":
                return (1 << 40, 1 << 40) if torch_free_too else 1 << 40
            return cpu_free(dev, torch_free_too)
        mm.get_free_memory = get_free_memory
        mm.get_all_torch_devices = lambda exclude_current=False: [] if exclude_current else [self.device]
        mm.MAX_PINNED_MEMORY = 64 * 1024 ** 3
        recorder = invariant.Recorder(None, lambda ptr: "?", 1 << 62)
        recorder_ref[0] = recorder
        torch.cuda.cudart = lambda: recorder
        mm.vram_state = mm.VRAMState.NO_VRAM

    def net(self):
        """A torch module of ComfyUI ``Linear`` layers whose weights start on page boundaries (pins never share one)."""
        torch, invariant = self.torch, self.invariant
        net = torch.nn.Module()
        net.layers = torch.nn.ModuleList()
        for _ in range(2):
            layer = self.ops.disable_weight_init.Linear(64, 64, bias=False, dtype=torch.float32)
            storage = invariant.aligned_bytes(torch, 64 * 64 * 4)
            layer.weight = torch.nn.Parameter(storage.view(torch.float32).view(64, 64).zero_(), requires_grad=False)
            net.layers.append(layer)
        return net

    def executor(self):
        """ComfyUI's executor with the classic cache (``main.prompt_worker``'s arguments where it takes them)."""
        execution = self.execution
        parameters = inspect.signature(execution.PromptExecutor).parameters
        kwargs = {"cache_type": execution.CacheType.CLASSIC} if "cache_type" in parameters else {}
        if "cache_args" in parameters:
            kwargs["cache_args"] = {"lru": 0, "ram": 0, "ram_inactive": 0}
        return execution.PromptExecutor(Server(execution), **kwargs)

    def run_prompt(self, executor, graph, prompt_id):
        executor.execute(graph, prompt_id, {}, ["2"])
        return executor.success

    def pin_path(self, answers):
        """ComfyUI's own pins (see the module docstring)."""
        mm, pm = self.mm, self.pm
        legacy = self.mp.ModelPatcher(self.net(), load_device=self.device, offload_device=self.torch.device("cpu"))
        answers.append(answer(mm.load_models_gpu, [legacy]))
        dynamic = self.mp.ModelPatcherDynamic(self.net(), self.device, self.torch.device("cpu"))
        answers.append(answer(mm.load_models_gpu, [dynamic]))
        import comfy.memory_management
        for layer in dynamic.model.layers:
            size = comfy.memory_management.vram_aligned_size([layer.weight, layer.bias])
            answers.append(answer(pm.pin_memory, layer, subset="weights", size=size))
            answers.append(answer(lambda: pm.get_pin(layer, subset="weights") is not None))
        answers.append(answer(mm.reset_cast_buffers))
        answers.append(answer(mm.free_pins, 4096))
        answers.append(answer(mm.free_registrations, 1))
        for layer in dynamic.model.layers:             # a pin ComfyUI unregistered: get_pin registers it again
            answers.append(answer(lambda: pm.get_pin(layer, subset="weights") is not None))
        answers.append(answer(mm.unload_all_models))
        del legacy, dynamic

    def drive(self):
        """One world (see the module docstring); returns what ComfyUI's calls answered."""
        mm = self.mm
        answers = []
        executor = self.executor()
        answers.append(answer(self.run_prompt, executor, prompt("MemxFaultLoader", "warned"), "warned"))
        answers.append(answer(executor.reset))            # ComfyUI drops the patcher; the pack keeps the model
        gc.collect()                                      # the worker's garbage pass (0.3.64's patcher is in a cycle)
        answers.append(answer(mm.cleanup_models_gc))      # ComfyUI warns; comfy_memx reports and releases
        answers.append(answer(self.run_prompt, executor, prompt("MemxFaultListLoader", "kept"), "kept"))
        queue = executor.server.prompt_queue
        answers.append(answer(queue.set_flag, "unload_models", True))
        answers.append(prompt_worker(mm, queue, executor))
        answers.append(answer(mm.cleanup_models_gc))      # the kept model: a leak ComfyUI never warns about
        patcher = self.mp.ModelPatcher(self.torch.nn.Linear(8, 8), load_device=mm.get_torch_device(),
                                       offload_device=self.torch.device("cpu"))
        answers.append(answer(mm.load_models_gpu, [patcher]))
        if hasattr(mm, "unload_model_and_clones"):
            answers.append(answer(mm.unload_model_and_clones, patcher))
        answers.append(answer(mm.free_memory, 1 << 40, mm.get_torch_device()))
        answers.append(answer(mm.cleanup_models_gc))
        del patcher
        answers.append(answer(lambda: sorted(self.utils.load_torch_file(self.weights))))
        if self.pins:
            self.pin_path(answers)
            answers.append(answer(self.run_prompt, executor, prompt("MemxFaultLoader", "after pins"), "after pins"))
        answers.append(answer(mm.unload_all_models))
        answers.append(answer(executor.reset))
        return answers

    def let_go(self):
        """What the pack's author would do: drop every model it keeps."""
        self.pack.MemxFaultLoader._cache.clear()
        self.pack.KEPT.clear()


def prompt_worker(mm, queue, executor):
    """What ComfyUI's prompt worker does with free flags after a prompt (named as ComfyUI's, which is how the ledger
    tells the worker's ``unload_all_models`` from anyone else's), then its garbage pass."""
    flags = queue.get_flags()
    answers = [sorted(flags)]
    if flags.get("unload_models", flags.get("free_memory", False)):
        answers.append(mm.unload_all_models())   # called from here: the ledger reads the caller's name
    if flags.get("free_memory"):
        answers.append(executor.reset())
    gc.collect()
    return answers


def run_world(world, sites, memx=True, plant=(), trace=False):
    """One world (comfy_memx off, or on with failures planted in ``plant``) -> ``fault_sites.Outcome``."""
    import fault_sites
    from comfy_memx.core import errors, registry
    from comfy_memx.core.bootstrap import bootstrap
    from comfy_memx.core.state import STATE
    STATE.reset()
    del world.tracked[:]
    try:
        if memx:
            bootstrap("api", dict(SETTINGS))
        with fault_sites.ErrorWatch() as watch, fault_sites.Garden(sites) as garden:
            garden.plant(plant)
            if trace:
                reached, answers = fault_sites.reached(sites, world.drive)
            else:
                reached, answers = None, world.drive()
        counts = errors.error_counts()
    finally:
        registry.remove_all()
        STATE.reset()
    world.let_go()
    gc.collect()
    survivors = [repr(ref())[:120] for ref in world.tracked if ref() is not None]
    return fault_sites.Outcome(answers, survivors, dict(garden.raised), watch, counts, reached)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comfyui", required=True, help="the ComfyUI tree")
    parser.add_argument("--json", help="where to write the verdict")
    parser.add_argument("--batch", type=int, default=8, help="sites planted per world (default 8)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    verdict = {"tree": args.comfyui, "ok": False}
    sys.path.insert(0, TESTS)
    logging.getLogger().addHandler(logging.NullHandler())
    folder = tempfile.mkdtemp(prefix="memx-fault-world-")
    try:
        if not os.path.isfile(os.path.join(args.comfyui, "comfy", "model_management.py")):
            return _finish(verdict, args, 2, f"{args.comfyui} is no ComfyUI tree (no comfy/model_management.py)")
        import fault_sites
        sites = fault_sites.all_sites()
        world = World(args.comfyui, folder)
        without = run_world(world, sites, memx=False)
        traced = run_world(world, sites, trace=True)
        gc.collect()
        gc.freeze()     # the heap built so far is no world's: ComfyUI's garbage passes leave it out
        failures, worlds = fault_sites.sweep(lambda batch: run_world(world, sites, plant=batch), traced.reached,
                                             without, args.batch)
        unreached = sorted(set(sites) - traced.reached)
        silent = run_world(world, sites, plant=unreached)
        if silent.raised or fault_sites.world_problems(silent, without):
            failures["<every site no world reaches>"] = fault_sites.world_problems(silent, without) + [
                f"fired: {sorted(silent.raised)}"] * bool(silent.raised)
        verdict.update(
            comfyui_version=_version(args.comfyui), pins=world.pins, sites=len(sites), reached=sorted(traced.reached),
            worlds=worlds + 3, failures=failures,
            baseline={"answers": without.answers, "same_with_comfy_memx": traced.answers == without.answers,
                      "survivors": without.survivors + traced.survivors, "counts": traced.counts},
            ok=not failures and traced.answers == without.answers and not without.survivors + traced.survivors
            and not traced.counts)
        return _finish(verdict, args, 0 if verdict["ok"] else 1, None, started)
    except Exception as exc:   # report how the driver itself broke
        import traceback
        return _finish(verdict, args, 2, "".join(traceback.format_exception(exc))[-4000:], started)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _version(tree):
    from comfy_memx.core.comfyui import version_of_tree
    return version_of_tree(tree)


def _finish(verdict, args, status, error, started=None):
    verdict["error"] = error
    verdict["seconds"] = round(time.monotonic() - started, 1) if started else None
    text = json.dumps(verdict, indent=1, default=str)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text)
    print(json.dumps({key: verdict.get(key) for key in ("tree", "ok", "sites", "worlds", "seconds", "error")}))
    return status


if __name__ == "__main__":
    sys.exit(main())
