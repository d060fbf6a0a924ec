"""Pin invariants inside a real ComfyUI: ComfyUI's own pin code under comfy_memx's budget, checked after every step.

Run it with the interpreter of a ComfyUI tree (0.27.0 or newer; comfy_memx importable)::

    python -m bench.pin_invariant --comfyui path/to/ComfyUI [--limit 2.5MiB] [--register fake|real] [--json OUT]

It prints one JSON object (and writes it to ``--json``); exit status 0 when every check held, 1 when one failed,
2 when it could not run.  ``tests/real/test_real_pins.py`` runs it with ``--register fake`` on CPU; ``bench/gpu_check.py``
runs it with ``--register real`` on an NVIDIA GPU.

What runs for real: ComfyUI's ``load_models_gpu``, ``LoadedModel``, ``ModelPatcher.load`` / ``detach`` (legacy
per-tensor pins of a lowvram load), ``pin_memory`` / ``unpin_memory``, ``ensure_pin_budget``,
``ensure_pin_registerable``, ``free_pins``, ``free_registrations``, ``free_model_pins`` (0.33+),
``reset_cast_buffers``, ``unload_all_models``, ``ModelPatcherDynamic`` (construction, ``load``,
``partially_unload_ram``, ``unregister_inactive_pins``, ``unpatch_model``, ``__del__``) and
``comfy.pinned_memory.pin_memory`` / ``get_pin`` (including pin stealing), all under comfy_memx's patches.

What is stood in, and why:

* ``torch.cuda.cudart().cudaHostRegister`` / ``cudaHostUnregister``: with ``--register fake`` a recorder that
  answers success (no CUDA here); with ``--register real`` the real calls, through a recorder.  The recorder is
  the independent truth the checks compare against: which addresses are registered, for which model.
* comfy-aimdo's ``HostBuffer``, ``hostbuf_to_tensor``, ``ModelVBAR`` and ``vbar_unpin``: they need aimdo's
  CUDA-initialised allocator, which a CPU machine cannot start.  The stand-ins keep the same protocol (extend,
  truncate with unregistration, a tensor view of the buffer); extends are rounded to pages so that no two pins
  share a page (``cudaHostRegister`` refuses a page that is already registered).
* The ops-time cast path (``comfy/ops.py``) needs CUDA streams: the driver calls what it calls per layer
  (``pin_memory(layer, subset, size)`` then ``get_pin``), as one node's run, followed by ``reset_cast_buffers``.
* With ``--register fake`` the load device is ``meta`` (ComfyUI treats every non-CPU device alike here) with
  ``get_free_memory`` answering 1 TiB for it, ``vram_state`` NO_VRAM (every weight offloaded, hence pinned) and
  ``MAX_PINNED_MEMORY`` set as ComfyUI sets it on an NVIDIA machine before comfy_memx adopts it.  With
  ``--register real`` the device is the GPU and only ``vram_state`` is forced.

Checks, after every step: ``books`` (comfy_memx's bytes, per model and in total, equal the recorder's and
``TOTAL_PINNED_MEMORY``), ``raw_books`` (the same before any read-time settling, on steps whose paths comfy_memx
wraps), ``cap`` (registered bytes never above the cap), ``mru`` (the victims are the most recently used other
model), ``no_reregister_in_load`` (no address unregistered and registered again within one ``load_models_gpu``).
"""

import argparse
import gc
import json
import os
import sys
import time
import types

MIB = 1024 ** 2
PAGE = 4096
DEFAULT_LIMIT = "2.75MiB"     # legacy: 2.75 models of 1 MiB; dynamic: two runs fit, a third evicts
LAYERS = 4
WIDTH = 256                     # one layer: a 256 x 256 float32 weight = 256 KiB, no bias
PATCH_BYTES = 64 * 1024         # one LowVRAM-patch pin (``patches`` subset)
HERE = os.path.dirname(os.path.abspath(__file__))


class Recorder:
    """``torch.cuda.cudart()`` for ComfyUI: records every (un)registration, forwarding to ``real`` when given."""

    def __init__(self, real, owner_of, cap):
        self.real, self.owner_of, self.cap = real, owner_of, cap
        self.registered = {}    # ptr -> (size, owner)
        self.log = []           # ("register" | "unregister", ptr, owner)
        self.cap_violations = []
        self.failures = 0
        self.register_seconds = 0.0
        self.register_bytes = 0

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 (CUDA's name)
        """Register (or pretend to), record it under its owner, and note any moment above the cap."""
        started = time.perf_counter()
        rc = 0 if self.real is None else as_int(self.real.cudaHostRegister(ptr, size, flags))
        self.register_seconds += time.perf_counter() - started
        if rc == 0:
            owner = self.owner_of(ptr)
            self.registered[ptr] = (size, owner)
            self.register_bytes += size
            self.log.append(("register", ptr, owner))
            total = self.total()
            if total > self.cap:
                self.cap_violations.append({"registered": total, "cap": self.cap, "owner": owner})
        else:
            self.failures += 1
        return rc

    def cudaHostUnregister(self, ptr):  # noqa: N802
        """Unregister (or pretend to) and record it."""
        rc = 0 if self.real is None else as_int(self.real.cudaHostUnregister(ptr))
        if rc == 0 and ptr in self.registered:
            _, owner = self.registered.pop(ptr)
            self.log.append(("unregister", ptr, owner))
        return rc

    def total(self):
        """Bytes registered now."""
        return sum(size for size, _ in self.registered.values())

    def per_owner(self):
        """Bytes registered now, by owner name."""
        found = {}
        for size, owner in self.registered.values():
            found[owner] = found.get(owner, 0) + size
        return found

    def __getattr__(self, name):  # anything else ComfyUI asks of cudart
        if self.real is None:
            raise AttributeError(name)
        return getattr(self.real, name)


def as_int(code):
    """A CUDA runtime status as an int (torch returns a pybind enum)."""
    try:
        return int(code)
    except (TypeError, ValueError):
        return int(getattr(code, "value", 1))


def install_aimdo_stand_ins(torch, recorder_ref):
    """Replace comfy-aimdo's host buffer and VRAM allocator by pure-Python stand-ins (see the module docstring)."""
    import comfy_aimdo.host_buffer
    import comfy_aimdo.model_vbar
    import comfy_aimdo.torch

    class HostBuffer:
        """A host buffer of ``max_size`` bytes; extends are rounded up to pages."""

        def __init__(self, _flags, _chunk, max_size):
            self.size = 0
            self.capacity = int(max_size) + PAGE
            self.tensor = None
            self.regions = []

        def extend(self, size, register=False):
            """Grow by ``size`` bytes rounded up to a page."""
            rounded = -(-int(size) // PAGE) * PAGE
            if self.size + rounded > self.capacity:
                raise RuntimeError("host buffer full")
            if self.tensor is None:
                self.tensor = aligned_bytes(torch, self.capacity)
            self.regions.append(self.size)
            self.size += rounded

        def truncate(self, offset, do_unregister=True):
            """Drop the regions from ``offset`` on, unregistering them first when asked (aimdo does both)."""
            for start in [r for r in self.regions if r >= offset]:
                if do_unregister:
                    recorder_ref[0].cudaHostUnregister(self.tensor[start:].data_ptr())
                self.regions.remove(start)
            self.size = offset

    class ModelVBAR:
        """A VRAM allocator that allocates nothing (the driver never runs a layer on the device)."""

        def __init__(self, size, index):
            self.allocated = 0

        def prioritize(self):
            pass

        def alloc(self, size):
            self.allocated += size
            return (self, 0, int(size))

        def loaded_size(self):
            return 0

        def free_memory(self, size):
            return 0

    comfy_aimdo.host_buffer.HostBuffer = HostBuffer
    comfy_aimdo.torch.hostbuf_to_tensor = lambda hostbuf: hostbuf.tensor
    comfy_aimdo.model_vbar.ModelVBAR = ModelVBAR
    comfy_aimdo.model_vbar.vbar_unpin = lambda _v: None
    return HostBuffer


def aligned_bytes(torch, nbytes):
    """A page-aligned uint8 CPU tensor of ``nbytes`` (a view into a slightly larger allocation)."""
    raw = torch.empty(nbytes + PAGE, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % PAGE
    return raw[skip:skip + nbytes]


class Driver:
    """One run: set-up, the scenario, and the checks; ``result()`` is the JSON verdict."""

    def __init__(self, tree, limit, register):
        self.tree, self.limit, self.register = tree, limit, register
        self.steps, self.failures = [], {name: [] for name in
                                         ("books", "raw_books", "cap", "mru", "no_reregister_in_load", "run")}
        self.models = {}        # name -> ModelPatcher
        self.node_ends = []     # (start, end) of the recorder log entries made by reset_cast_buffers
        self.weight_owner = {}  # data_ptr of a legacy weight -> model name
        self.started = time.monotonic()

    # -- set-up -------------------------------------------------------------------------------------------------

    def setup(self):
        """Import ComfyUI under comfy_memx with the stand-ins of the module docstring."""
        sys.path.insert(0, self.tree)      # the ComfyUI root, as ComfyUI's main.py has it
        from comfy_memx.core.bootstrap import bootstrap
        environ = {"COMFY_MEMX_PIN_LIMIT": str(self.limit), "COMFY_MEMX_RAISE_INTERNAL": "1"}
        self.config = bootstrap("api", environ)
        sys.argv = ["main.py", "--cpu"] if self.register == "fake" else ["main.py"]
        import comfy.options
        comfy.options.enable_args_parsing()
        import torch
        self.torch = torch
        import comfy.model_management as mm
        import comfy.model_patcher
        import comfy.ops
        import comfy.pinned_memory
        self.mm, self.mp, self.pm, self.ops = mm, comfy.model_patcher, comfy.pinned_memory, comfy.ops
        self.recorder_ref = [None]
        install_aimdo_stand_ins(torch, self.recorder_ref)
        real = None
        if self.register == "real":
            real = torch.cuda.cudart()
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("meta")
            mm.discard_cuda_async_error = lambda: None
            cpu_free = mm.get_free_memory

            def get_free_memory(dev=None, torch_free_too=False):
                if getattr(dev, "type", None) == "meta":
                    return (1 << 40, 1 << 40) if torch_free_too else 1 << 40
                return cpu_free(dev, torch_free_too)
            mm.get_free_memory = get_free_memory
            mm.get_all_torch_devices = lambda exclude_current=False: [] if exclude_current else [self.device]
        from comfy_memx.pins import api as pins
        from comfy_memx.core import registry
        self.adopted_at_import = pins.managing(mm)
        if getattr(mm, "MAX_PINNED_MEMORY", -1) <= 0:
            # What ComfyUI does at import on an NVIDIA machine; comfy_memx then adopts it as it would at import.
            mm.MAX_PINNED_MEMORY = 64 * 1024 ** 3
            registry.patch_of("pinned_memory").adopt(mm)
        self.pins = pins
        self.cap = pins.cap().bytes if pins.cap() is not None else None
        if not pins.managing(mm):
            raise RuntimeError("comfy_memx does not budget pins in this ComfyUI (cap %r)" % self.cap)
        self.cap_applied = {"adopted_at_import": self.adopted_at_import, "cap_bytes": self.cap,
                            "max_pinned_memory": int(mm.MAX_PINNED_MEMORY),
                            "comfyui_max_pinned_memory": pins.comfyui_max()}
        if int(mm.MAX_PINNED_MEMORY) != self.cap:
            self.failures["cap"].append(dict(self.cap_applied, problem="MAX_PINNED_MEMORY is not comfy_memx's cap"))
        recorder = Recorder(real, self.owner_of, self.cap)
        self.recorder_ref[0] = recorder
        self.recorder = recorder
        torch.cuda.cudart = lambda: recorder
        mm.vram_state = mm.VRAMState.NO_VRAM
        self.version = _version(self.tree)
        self.subsets = None

    # -- models -------------------------------------------------------------------------------------------------

    def net(self):
        """A torch module of LAYERS ComfyUI ``Linear`` layers whose weights start on page boundaries."""
        torch = self.torch

        class Net(torch.nn.Module):
            pass
        net = Net()
        layers = torch.nn.ModuleList()
        for _ in range(LAYERS):
            layer = self.ops.disable_weight_init.Linear(WIDTH, WIDTH, bias=False, dtype=torch.float32)
            storage = aligned_bytes(torch, WIDTH * WIDTH * 4)
            layer.weight = torch.nn.Parameter(storage.view(torch.float32).view(WIDTH, WIDTH).zero_(),
                                              requires_grad=False)
            layers.append(layer)
        net.layers = layers
        return net

    def legacy(self, name):
        """A legacy ModelPatcher named ``name`` (its weights' addresses are remembered as its own)."""
        patcher = self.mp.ModelPatcher(self.net(), load_device=self.device, offload_device=self.torch.device("cpu"))
        for layer in patcher.model.layers:
            self.weight_owner[layer.weight.data_ptr()] = name
        self.models[name] = patcher
        return patcher

    def dynamic(self, name):
        """A DynamicVRAM ModelPatcher named ``name``."""
        patcher = self.mp.ModelPatcherDynamic(self.net(), self.device, self.torch.device("cpu"))
        self.models[name] = patcher
        return patcher

    def owner_of(self, ptr):
        """Which model an address belongs to, from ComfyUI's own structures (never from comfy_memx)."""
        owner = self.weight_owner.get(ptr)
        if owner is not None:
            return owner
        for name, patcher in self.models.items():
            for state in getattr(patcher.model, "dynamic_pins", {}).values():
                for value in state.values():
                    if type(value) is tuple and value and getattr(value[0], "tensor", None) is not None:
                        start = value[0].tensor.data_ptr()
                        if start <= ptr < start + value[0].capacity:
                            return name
        return "unknown"

    def model_id(self, name):
        """comfy_memx's key for the model named ``name`` (from its ledger), or None."""
        from comfy_memx.core.state import STATE
        record = STATE.ledger.find(self.models[name].model)
        return record.model_id if record is not None else None

    # -- one node's run of a dynamic model ----------------------------------------------------------------------

    def run_node(self, name):
        """What one sampler node does with a dynamic model: load it, pin and use each layer, end the node."""
        patcher = self.models[name]
        self.mm.load_models_gpu([patcher])
        pin_state = patcher.model.dynamic_pins[patcher.load_device]
        if self.subsets is None:
            self.subsets = sorted(k for k, v in pin_state.items() if type(v) is tuple)
        for index, layer in enumerate(patcher.model.layers):
            size = self.mm_memory().vram_aligned_size([layer.weight, layer.bias])
            self.pm.pin_memory(layer, subset="weights", size=size)
            self.pm.get_pin(layer, subset="weights")
            if index == 0 and "weights-loaded" in pin_state:  # 0.33+: a file-backed weight's pin
                self.pm.pin_memory(layer, subset="weights-loaded", size=size)
        for holder in getattr(patcher, "_memx_patches", []):
            self.pm.pin_memory(holder, subset="patches", size=PATCH_BYTES)
            self.pm.get_pin(holder, subset="patches")
        start = len(self.recorder.log)
        self.mm.reset_cast_buffers()   # the node ends: its patches pins are destroyed (not an eviction)
        self.node_ends.append((start, len(self.recorder.log)))

    def mm_memory(self):
        """ComfyUI's ``comfy.memory_management``."""
        import comfy.memory_management
        return comfy.memory_management

    def with_patches(self, name, count=2):
        """Give a dynamic model LowVRAM-patch-like objects that pin in the ``patches`` subset (as ``LowVramPatch``
        does: any object with the model's ``_pin_state``)."""
        patcher = self.models[name]
        pin_state = patcher.model.dynamic_pins[patcher.load_device]
        patcher._memx_patches = [types.SimpleNamespace(_pin_state=pin_state) for _ in range(count)]

    # -- steps and checks ---------------------------------------------------------------------------------------

    def step(self, label, action, load=False, wrapped=True, victims=None):
        """Run one step, then check every invariant; ``victims`` is the set of models that must lose pins."""
        mark = len(self.recorder.log)
        try:
            action()
        except Exception as exc:
            self.failures["run"].append({"step": label, "error": "%s: %s" % (type(exc).__name__, exc)})
        state = self.pins.current()
        raw = None
        if state is not None:
            pinned, in_flight = state.budget.totals()
            raw = pinned - in_flight
        budget = self.pins.budget()
        stats = budget.stats() if budget is not None else {"pinned_bytes": None, "per_model": {}}
        total = int(self.mm.TOTAL_PINNED_MEMORY)
        registered = self.recorder.total()
        by_owner = self.recorder.per_owner()
        per_model = {}
        for name in self.models:
            model_id = self.model_id(name)
            per_model[name] = {"registered": by_owner.get(name, 0),
                               "memx": stats["per_model"].get(model_id, 0) if model_id else 0}
        unattributed = stats["per_model"].get(self.pins.UNATTRIBUTED, 0)
        window = self.recorder.log[mark:]
        node_end = {index for start, end in self.node_ends for index in range(max(start, mark), end)}
        lost = sorted({owner for index, (verb, _, owner) in enumerate(window, mark)
                       if verb == "unregister" and index not in node_end})
        record = {"step": label, "total_pinned_memory": total, "registered": registered,
                  "memx": stats["pinned_bytes"], "memx_raw": raw, "per_model": per_model, "unregistered": lost,
                  "unattributed": unattributed}
        self.steps.append(record)
        books_ok = (stats["pinned_bytes"] == total == registered and unattributed == 0
                    and all(row["registered"] == row["memx"] for row in per_model.values()))
        if not books_ok:
            self.failures["books"].append(record)
        if wrapped and raw != total:
            self.failures["raw_books"].append({"step": label, "memx_raw": raw, "total_pinned_memory": total})
        if victims is not None and set(lost) != set(victims):
            self.failures["mru"].append({"step": label, "expected_victims": sorted(victims), "victims": lost})
        if load:
            gone = set()
            for verb, ptr, _owner in window:
                if verb == "unregister":
                    gone.add(ptr)
                elif ptr in gone:
                    self.failures["no_reregister_in_load"].append({"step": label, "ptr": ptr})

    def scenario(self):
        """Legacy phase, then DynamicVRAM phase (see the module docstring for the cap that makes them evict)."""
        mm = self.mm
        a, b, c = self.legacy("A"), self.legacy("B"), self.legacy("C")
        self.step("load A (legacy)", lambda: mm.load_models_gpu([a]), load=True, victims=())
        self.step("load B (legacy)", lambda: mm.load_models_gpu([b]), load=True, victims=())
        # The cap holds 2.75 models: C's pins evict from B, the model used most recently (LRU would take A).
        self.step("load C (legacy): evicts B", lambda: mm.load_models_gpu([c]), load=True, victims=("B",))
        self.step("unload all (legacy)", mm.unload_all_models, victims=("A", "B", "C"))
        for name in ("A", "B", "C"):
            self.forget(name)
        self.step("legacy models collected", gc.collect)

        p, q, r = self.dynamic("P"), self.dynamic("Q"), self.dynamic("R")
        self.step("run P (dynamic)", lambda: (self.with_patches("P"), self.run_node("P")), victims=())
        self.step("run Q (dynamic)", lambda: (self.with_patches("Q"), self.run_node("Q")), victims=())
        # R needs room: Q (used most recently) gives registrations up, P keeps all of its own.
        self.step("run R (dynamic): evicts Q", lambda: (self.with_patches("R"), self.run_node("R")),
                  victims=("Q",))
        # Q again: get_pin registers Q's unregistered pins again, which evicts R (now the most recent other).
        self.step("run Q again: re-registers, evicts R", lambda: self.run_node("Q"), victims=("R",))
        # ComfyUI's own RAM-pressure eviction (the executor's per-node free_pins): most recently used first.
        self.step("free_pins (ComfyUI)", lambda: mm.free_pins(PAGE), victims=("Q",))
        self.step("free_registrations (ComfyUI)", lambda: mm.free_registrations(1))
        self.step("run P again", lambda: self.run_node("P"), victims=())
        self.step("unload all (dynamic)", mm.unload_all_models)
        for name in ("P", "Q", "R"):
            self.forget(name)
        del p, q, r
        self.step("dynamic models collected", gc.collect, wrapped=False)

    def forget(self, name):
        """Drop the driver's references to the model named ``name``."""
        patcher = self.models.pop(name)
        for layer in getattr(patcher.model, "layers", ()):
            self.weight_owner.pop(layer.weight.data_ptr(), None)

    def result(self):
        """The JSON verdict of the run."""
        checks = {name: {"ok": not found, "failures": found[:5]} for name, found in self.failures.items()}
        violations = self.failures["cap"] + (self.recorder.cap_violations if hasattr(self, "recorder") else [])
        checks["cap"] = {"ok": hasattr(self, "recorder") and not violations, "failures": violations[:5]}
        registered = getattr(getattr(self, "recorder", None), "register_bytes", 0)
        seconds = getattr(getattr(self, "recorder", None), "register_seconds", 0.0)
        return {
            "tree": self.tree, "comfyui_version": getattr(self, "version", None), "register": self.register,
            "cap_bytes": getattr(self, "cap", None), "cap_applied": getattr(self, "cap_applied", None),
            "subsets": getattr(self, "subsets", None),
            "ok": all(check["ok"] for check in checks.values()), "checks": checks, "steps": self.steps,
            "registered_bytes_total": registered, "register_seconds_total": round(seconds, 6),
            "register_seconds_per_gib": round(seconds / (registered / 1024 ** 3), 6) if registered else None,
            "register_failures": getattr(getattr(self, "recorder", None), "failures", None),
            "seconds": round(time.monotonic() - self.started, 3),
        }


def _version(tree):
    try:
        with open(os.path.join(tree, "comfyui_version.py"), encoding="utf-8") as f:
            return f.read().split("__version__ = ")[1].strip().strip("\"'")
    except (OSError, IndexError):
        return None


def main(argv=None):
    """Command line: run the scenario in this interpreter and print the verdict (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--comfyui", required=True, help="a ComfyUI tree (folder with main.py), 0.27.0 or newer")
    parser.add_argument("--limit", default=DEFAULT_LIMIT, help="COMFY_MEMX_PIN_LIMIT for the run (%(default)s)")
    parser.add_argument("--register", choices=("fake", "real"), default="fake",
                        help="fake: record cudaHostRegister without CUDA; real: the real calls, recorded")
    parser.add_argument("--json", help="also write the verdict to this file")
    options = parser.parse_args(argv)
    tree = os.path.abspath(options.comfyui)
    driver = Driver(tree, options.limit, options.register)
    status = 0
    try:
        driver.setup()
        driver.scenario()
        verdict = driver.result()
        status = 0 if verdict["ok"] else 1
    except Exception as exc:
        import traceback
        verdict = dict(driver.result(), ok=False, error="%s: %s" % (type(exc).__name__, exc),
                       traceback=traceback.format_exc()[-4000:])
        status = 2
    text = json.dumps(verdict, default=str)
    if options.json:
        with open(options.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
