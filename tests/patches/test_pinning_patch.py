"""The pinned-memory patches on the ComfyUI stand-ins: cap, MRU eviction, no churn, RAM pressure, threads, events,
and (with ``fake_comfy.v0_38_pins``) the 0.33+/0.38 shapes: per-subset pins, fast subsets, tiered eviction, the new
``pin_memory`` answer and disable switch.  ComfyUI's own pin code is exercised in tests/real/test_real_pins.py.

The 0.27.0 stand-in pins through a simulated CUDA registration backend (``HOST_REGISTER``); models are tiny (a few
MiB of 1 MiB tensors) and caps are set in MiB with ``COMFY_MEMX_PIN_LIMIT``.  In the NO_VRAM state the stand-in
keeps every weight in RAM and pins all of them on each load, and with its default 8 GiB of simulated VRAM it never
unloads a model, so pins pile up until the cap decides.
"""

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
import types

import pytest

from comfy_memx.pins import host as hostmem
from comfy_memx.pins import cap as pincap
from comfy_memx.pins import owners
from comfy_memx.pins import session as pinning
from comfy_memx.core import errors, registry
from comfy_memx.core.state import STATE
from comfy_memx.core import wrapping
from comfy_memx.core.bootstrap import bootstrap
from fake_comfy.loader import make_patcher, purge_fake_comfy, shape_paths, shape_root
from memx_helpers import memx_on, read_events

MiB = 1024 ** 2
SITES = ["pin_memory", "unpin_memory", "ensure_pin_budget", "ensure_pin_registerable", "reset_cast_buffers",
         "free_model_pins", "free_pins", "free_registrations"]
SITES_0270 = [site for site in SITES if site != "free_model_pins"]  # free_model_pins is new in 0.33.0


def checked_register(mm, cap):
    """Replace the stand-in's registration backend with one that records any moment registered bytes exceed ``cap``."""
    class Checked(type(mm.HOST_REGISTER)):
        def __init__(self):
            super().__init__()
            self.lock = threading.Lock()
            self.peak = 0
            self.violations = []

        def register(self, ptr, size):
            with self.lock:
                ok = super().register(ptr, size)
                total = sum(self.registered.values())
                self.peak = max(self.peak, total)
                if total > cap:
                    self.violations.append(total)
                return ok

        def unregister(self, ptr):
            with self.lock:
                return super().unregister(ptr)
    mm.HOST_REGISTER = Checked()
    return mm.HOST_REGISTER


def pin_events(path, kind=None):
    return [e for e in read_events(path) if e["event"].startswith("pin_") and (kind is None or e["event"] == kind)]


def model_id(patcher):
    return STATE.ledger.find(patcher.model).model_id


def pinned_bytes(mm, patcher):
    """Bytes of ``patcher``'s weights that the stand-in really registered."""
    return sum(t.nbytes for _, t in patcher.model.named_parameters() if t.data_ptr() in mm.PINNED_MEMORY)


@contextlib.contextmanager
def memx_with_argv(version, argv, **settings):
    """Like memx_on, but the stand-in parses ``argv`` as ComfyUI's command line (e.g. ``--cpu``)."""
    environ = {"COMFY_MEMX_" + k.upper(): str(v) for k, v in settings.items()}
    environ["COMFY_MEMX_RAISE_INTERNAL"] = "1"
    STATE.reset()
    bootstrap("api", environ)
    saved_argv = sys.argv
    purge_fake_comfy()
    importlib.invalidate_caches()
    sys.path[:0] = shape_paths(version)
    sys.argv = ["main.py", *argv]
    try:
        importlib.import_module("comfy.options").enable_args_parsing()
        yield importlib.import_module("comfy.model_management")
    finally:
        sys.argv = saved_argv
        registry.remove_all()
        purge_fake_comfy()


# --- the cap ---------------------------------------------------------------------------------------------------

def test_limit_replaces_comfyui_cap_after_import_and_is_logged(caplog):
    caplog.set_level(logging.INFO, logger="comfy_memx")
    with memx_on("0.27.0", pin_limit="12MiB") as mm:
        assert mm.MAX_PINNED_MEMORY == 12 * MiB
        comfyui_value = pinning.comfyui_max()
        assert comfyui_value > 12 * MiB  # the stand-in's own rule: 90 % of RAM
        assert pinning.budget().cap_bytes == 12 * MiB
        lines = [r.getMessage() for r in caplog.records if "pinned-memory cap" in r.getMessage()]
        assert lines == ["comfy_memx: pinned-memory cap 12.0 MiB (COMFY_MEMX_PIN_LIMIT=12MiB; ComfyUI 0.27.0 "
                         "would use %.1f GiB)" % (comfyui_value / 1024 ** 3)]
    assert mm.MAX_PINNED_MEMORY == comfyui_value  # unpatched on exit: ComfyUI's value is back


FAKE_GIB = 1024 ** 3


def fake_host(ram_gib=64, swap_gib=0, limit_gib=None):
    """A host reading with round figures, so that the expected caps can be written down."""
    ram = (limit_gib or ram_gib) * FAKE_GIB
    return hostmem.HostMemory(ram_total=ram, ram_available=ram // 2, swap_disk=0 if limit_gib else swap_gib * FAKE_GIB,
                              swap_zram=0, cgroup_limit=limit_gib * FAKE_GIB if limit_gib else None,
                              platform="linux", ram_physical=ram_gib * FAKE_GIB)


@pytest.mark.parametrize("ram, swap, limit, expected", [
    (64, 0, None, 51539607552),      # 64 GiB - 16 GiB = 48 GiB
    (64, 32, None, 61847529062),     # 0.9 x 64 GiB (57.6 GiB) is the smallest of the three
    (64, 32, 24, 10307921510),       # a 24 GiB cgroup limit: swap stops counting, 0.4 x 24 GiB = 9.6 GiB
])
def test_auto_cap_is_the_swap_aware_rule(ram, swap, limit, expected, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="comfy_memx")
    monkeypatch.setattr(hostmem, "probe_host", lambda *a, **k: fake_host(ram, swap, limit))
    with memx_on("0.27.0") as mm:
        assert mm.MAX_PINNED_MEMORY == expected and pinning.cap().bytes == expected
        assert pinning.cap().source == "auto"
        line = [r.getMessage() for r in caplog.records if "pinned-memory cap" in r.getMessage()][0]
        assert "(auto: %.1f GiB RAM, " % (limit or ram) in line and "ComfyUI 0.27.0 would use" in line


def test_limit_above_ram_is_clamped_with_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(hostmem, "probe_host", lambda *a, **k: fake_host(64))
    with memx_on("0.27.0", pin_limit="1000TiB") as mm:
        assert mm.MAX_PINNED_MEMORY == 68719476736
        assert any(r.levelno == logging.WARNING and "clamped to RAM" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("argv", [["--cpu"], ["--disable-pinned-memory"]])
def test_pinning_left_off_where_comfyui_does_not_pin(argv, caplog):
    caplog.set_level(logging.DEBUG, logger="comfy_memx")
    with memx_with_argv("0.27.0", argv, pin_limit="12MiB") as mm:
        assert mm.MAX_PINNED_MEMORY == -1 and not pinning.managing()
        import torch
        assert mm.pin_memory(torch.ones(256)) is False and mm.HOST_REGISTER.calls == []
        assert any("pinned memory stays off" in r.getMessage() for r in caplog.records)


def test_off_turns_pinning_off_and_unpatch_restores(tmp_path):
    with memx_on("0.27.0", pin_limit="off", events=tmp_path / "e.jsonl") as mm:
        comfyui_value = pinning.comfyui_max()
        assert mm.MAX_PINNED_MEMORY == 0 and pinning.budget() is None
        mm.vram_state = mm.VRAMState.NO_VRAM
        patcher = make_patcher(4, 64 * 1024)
        mm.load_models_gpu([patcher])
        assert mm.HOST_REGISTER.calls == [] and patcher.pinned == set()
        registry.patch_of("pinned_memory").unpatch(mm)
        assert mm.MAX_PINNED_MEMORY == comfyui_value


def test_every_site_skipped_on_0364():
    with memx_on("0.3.64") as mm:
        status = {row["site"]: row for row in registry.site_status() if row["patch"] == "pinned_memory"}
        assert set(status) == set(SITES)
        assert all(row["state"] == "skipped" and row["reason"] == "absent in this ComfyUI" for row in status.values())
        assert not hasattr(mm, "MAX_PINNED_MEMORY") and pinning.cap() is None
        assert importlib.util.find_spec("comfy.pinned_memory") is None  # so dynamic_pins never applies there


def test_patch_contract_on_0270():
    with memx_on("0.27.0", pin_limit="12MiB") as mm:
        import comfy.pinned_memory as pm
        patches = registry.patch_of("pinned_memory")
        status = {row["site"]: row for row in registry.site_status() if row["patch"] == "pinned_memory"}
        assert status["free_model_pins"]["state"] == "skipped"
        assert status["free_model_pins"]["reason"] == "absent in this ComfyUI"
        originals = {site: wrapping.original_of(mm, site) for site in SITES_0270}
        wrappers = {site: getattr(mm, site) for site in SITES_0270}
        assert all(wrappers[site] is not originals[site] for site in SITES_0270)
        again = patches.patch(mm)
        assert isinstance(again.pop("free_model_pins"), errors.PatchSkipped)
        assert set(again.values()) == {"already patched"}
        assert {site: getattr(mm, site) for site in SITES_0270} == wrappers
        comfyui_value = pinning.comfyui_max()
        patches.unpatch(mm)
        assert all(getattr(mm, site) is originals[site] for site in SITES_0270)
        assert mm.MAX_PINNED_MEMORY == comfyui_value and not pinning.managing()
        assert set(patches.unpatch(mm).values()) == {"not patched"}
        patches.patch(mm)
        patches.adopt(mm)
        assert all(getattr(mm, site).__wrapped__ is originals[site] for site in SITES_0270)
        assert mm.MAX_PINNED_MEMORY == 12 * MiB and pinning.managing(mm)

        dynamic = registry.patch_of("dynamic_pins")
        for site in ("pin_memory", "get_pin"):
            original = wrapping.original_of(pm, site)
            assert getattr(pm, site) is not original and getattr(pm, site).__wrapped__ is original
        originals = {site: wrapping.original_of(pm, site) for site in ("pin_memory", "get_pin")}
        dynamic.unpatch(pm)
        assert pm.pin_memory is originals["pin_memory"] and pm.get_pin is originals["get_pin"]
        dynamic.patch(pm)
        assert pm.pin_memory.__wrapped__ is originals["pin_memory"]
        assert pm.get_pin.__wrapped__ is originals["get_pin"]


# --- budget, MRU order, churn ------------------------------------------------------------------------------------

def test_cyclic_workflow_evicts_most_recently_used_and_never_exceeds_the_cap(tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on("0.27.0", pin_limit="8MiB", events=events) as mm:
        backend = checked_register(mm, 8 * MiB)
        mm.vram_state = mm.VRAMState.NO_VRAM
        te, unet, vae = (make_patcher(4, 256 * 1024) for _ in range(3))  # 4 MiB each: the cap holds two
        order = [te, unet, vae] * 3
        evictions_per_load = []
        recent = []  # most recently loaded last
        for patcher in order:
            before = len(pin_events(events, "pin_evict")) if events.exists() else 0
            mm.load_models_gpu([patcher])
            new = pin_events(events, "pin_evict")[before:]
            victims = list(dict.fromkeys(e["model_id"] for e in new))
            if victims:  # the model used most recently before this one gave up all its pins
                previous = [p for p in reversed(recent) if p is not patcher][0]
                assert victims == [model_id(previous)] and pinned_bytes(mm, previous) == 0
            evictions_per_load.append(victims)
            if patcher in recent:
                recent.remove(patcher)
            recent.append(patcher)
            assert pinned_bytes(mm, patcher) == 4 * MiB  # the model being loaded always got all its pins
        assert backend.violations == [] and backend.peak == 8 * MiB
        assert evictions_per_load == [[], [], [model_id(unet)], [], [model_id(te)], [],
                                      [model_id(vae)], [], [model_id(unet)]]
        # bytes the budget counts are the bytes ComfyUI really has pinned, model by model
        stats = pinning.budget().stats()
        assert stats["per_model"] == {model_id(p): pinned_bytes(mm, p) for p in (te, unet, vae) if pinned_bytes(mm, p)}


def test_no_churn_and_no_eviction_of_the_models_being_loaded(tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on("0.27.0", pin_limit="6MiB", events=events) as mm:
        checked_register(mm, 6 * MiB)
        mm.vram_state = mm.VRAMState.NO_VRAM
        old, first, second = (make_patcher(4, 256 * 1024) for _ in range(3))
        mm.load_models_gpu([old])
        start = len(mm.HOST_REGISTER.calls)
        mm.load_models_gpu([first, second])
        calls = mm.HOST_REGISTER.calls[start:]
        registered = {c[1] for c in calls if c[0] == "register"}
        unregistered = {c[1] for c in calls if c[0] == "unregister"}
        assert registered and not registered & unregistered  # nothing pinned in this load was unpinned in it
        own = {t.data_ptr() for p in (first, second) for _, t in p.model.named_parameters()}
        assert not unregistered & own
        assert pinned_bytes(mm, old) == 0  # the older model gave up all of its pins first
        evicted = {e["model_id"] for e in pin_events(events, "pin_evict")}
        refused = pin_events(events, "pin_refused")
        assert evicted == {model_id(old)}
        assert refused and {e["reason"] for e in refused} == {"over_cap"}
        assert pinned_bytes(mm, first) + pinned_bytes(mm, second) == 6 * MiB


def test_partial_unload_during_a_load_never_unpins_the_model_being_loaded(tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on("0.27.0", pin_limit="5MiB", events=events) as mm:
        loading, resident = make_patcher(4, 256 * 1024), make_patcher(4, 256 * 1024)
        mm.vram_state = mm.VRAMState.NO_VRAM
        mm.load_models_gpu([loading])                 # all 4 MiB of it pinned, nothing on the GPU
        mm.vram_state = mm.VRAMState.NORMAL_VRAM
        mm.load_models_gpu([resident])                # fully on the GPU, nothing pinned
        # Little VRAM: loading `loading` again offloads (and pins) part of `resident` first, inside that load.
        mm.SIM_VRAM_TOTAL = int(mm.minimum_inference_memory() + 6.9 * MiB)
        mm.load_models_gpu([loading])
        assert resident.loaded_size() < 4 * MiB and pinned_bytes(mm, resident) == MiB
        assert not any(e["model_id"] == model_id(loading) for e in pin_events(events, "pin_evict"))
        refused = pin_events(events, "pin_refused")
        assert [(e["model_id"], e["reason"]) for e in refused] == [(model_id(resident), "over_cap")]


def test_unpins_give_bytes_back():
    with memx_on("0.27.0", pin_limit="64MiB") as mm:
        mm.vram_state = mm.VRAMState.NO_VRAM
        patcher = make_patcher(4, 256 * 1024)
        mm.load_models_gpu([patcher])
        assert pinning.budget().pinned(model_id(patcher)) == 4 * MiB
        mm.unload_all_models()
        assert pinning.budget().stats()["pinned_bytes"] == 0 == mm.TOTAL_PINNED_MEMORY


def test_ram_pressure_makes_room_first_or_refuses(tmp_path, monkeypatch):
    events = tmp_path / "events.jsonl"
    headroom = 8 * MiB
    with memx_on("0.27.0", pin_limit="64MiB", events=events) as mm:
        monkeypatch.setattr(hostmem, "RAM_READING_MAX_AGE", 0.0)
        base = [headroom + 6 * MiB]
        pinning.start(mm, available_ram=lambda: base[0] - sum(mm.HOST_REGISTER.registered.values()),
                      headroom_bytes=headroom)
        mm.vram_state = mm.VRAMState.NO_VRAM
        first, second = make_patcher(4, 256 * 1024), make_patcher(4, 256 * 1024)
        mm.load_models_gpu([first])
        mm.load_models_gpu([second])  # 2 MiB fit above the headroom; 2 more need 2 MiB of `first` unpinned
        assert pinned_bytes(mm, second) == 4 * MiB and pinned_bytes(mm, first) == 2 * MiB
        evicts = pin_events(events, "pin_evict")
        assert [(e["model_id"], e["bytes"], e["reason"]) for e in evicts] == \
            [(model_id(first), MiB, "ram_pressure")] * 2
        base[0] -= 4 * MiB  # something else took RAM: nothing of `second` can be pinned again
        mm.unload_all_models()
        mm.load_models_gpu([second])
        refused = pin_events(events, "pin_refused")
        assert refused and all(e["reason"] == "ram_pressure" and e["model_id"] == model_id(second) for e in refused)
        assert base[0] - sum(mm.HOST_REGISTER.registered.values()) >= headroom


# --- events ----------------------------------------------------------------------------------------------------

def test_evict_and_refuse_events_name_the_model(tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on("0.27.0", pin_limit="6MiB", events=events) as mm:
        mm.vram_state = mm.VRAMState.NO_VRAM
        old, new = make_patcher(4, 256 * 1024), make_patcher(8, 256 * 1024)
        mm.load_models_gpu([old])
        mm.load_models_gpu([new])
    evict, refused = pin_events(events, "pin_evict"), pin_events(events, "pin_refused")
    assert evict and refused
    for event in evict + refused:
        assert {"model", "model_id", "bytes", "reason", "policy", "time", "pid"} <= set(event)
        assert event["model"] == "BaseModel" and event["policy"] == "mru" and event["bytes"] == MiB
    assert {e["reason"] for e in evict} == {"cap"} and {e["reason"] for e in refused} == {"over_cap"}
    assert sum(e["bytes"] for e in evict) == 4 * MiB and len(refused) == 2


# --- threads ---------------------------------------------------------------------------------------------------

def run_threads(workers):
    errors = []

    def guarded(work):
        try:
            work()
        except BaseException as exc:  # reported to the test below
            errors.append(exc)
    threads = [threading.Thread(target=guarded, args=(w,)) for w in workers]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


def test_concurrent_pins_and_unpins_keep_the_books():
    with memx_on("0.27.0", pin_limit="2MiB") as mm:
        backend = checked_register(mm, 2 * MiB)
        patchers = [make_patcher(8, 16 * 1024) for _ in range(4)]  # 512 KiB each: all four fit

        def cycle(patcher):
            def work():
                keys = [key for key, _ in patcher.model.named_parameters()]
                for _ in range(25):
                    for key in keys:
                        patcher.pin_weight_to_device(key)
                    patcher.unpin_all_weights()
            return work
        run_threads([cycle(p) for p in patchers])
        stats = pinning.budget().stats()
        assert backend.violations == [] and stats["refusals"] == 0
        assert stats["pinned_bytes"] == 0 and mm.HOST_REGISTER.registered == {}
        assert mm.TOTAL_PINNED_MEMORY == sum(mm.PINNED_MEMORY.values())  # the stand-in's own counter, on its own
        registered = sum(c[2] for c in backend.calls if c[0] == "register")
        assert stats["registered_bytes"] == registered == 4 * 25 * 512 * 1024


def test_concurrent_pins_with_evictions_never_exceed_the_cap():
    with memx_on("0.27.0", pin_limit="1MiB") as mm:
        backend = checked_register(mm, MiB)
        patchers = [make_patcher(8, 16 * 1024) for _ in range(6)]  # 512 KiB each: two fit

        def pin_repeatedly(patcher):
            def work():
                keys = [key for key, _ in patcher.model.named_parameters()]
                for _ in range(40):
                    for key in keys:
                        patcher.pin_weight_to_device(key)
            return work
        run_threads([pin_repeatedly(p) for p in patchers])
        stats = pinning.budget().stats()
        assert backend.violations == [] and stats["evictions"] > 0
        assert stats["pending_evict_bytes"] == 0
        assert {model_id(p): pinning.budget().pinned(model_id(p)) for p in patchers} == \
            {model_id(p): pinned_bytes(mm, p) for p in patchers}


# --- DynamicVRAM pins and ComfyUI's own eviction ----------------------------------------------------------------

def test_dynamic_pins_count_against_the_same_cap(tmp_path):
    events = tmp_path / "events.jsonl"
    with memx_on("0.27.0", pin_limit="6KiB", events=events) as mm:
        import comfy.pinned_memory as pm
        from fake_comfy.loader import make_model
        mm.SIM_RAM_AVAILABLE = 100 * 1024 ** 3
        blocks = list(make_model(4, 300).blocks)  # 1200 bytes each, 2 KiB once aligned
        assert [pm.pin_memory(b) for b in blocks] == [True, True, True, False]
        assert pm.pin_memory(blocks[0]) is None  # already pinned: passed through, nothing counted
        assert pinning.budget().stats()["pinned_bytes"] == mm.TOTAL_PINNED_MEMORY == 6 * 1024
        refused = pin_events(events, "pin_refused")
        assert [(e["bytes"], e["reason"]) for e in refused] == [(2048, "over_cap")]


class FakeDynamicPatcher:
    """The parts of a DynamicVRAM ModelPatcher that ComfyUI's pin eviction uses (the stand-in has none)."""

    def __init__(self, name, active, calls, mm):
        from fake_comfy.loader import make_model
        self.name, self.calls, self.mm = name, calls, mm
        self.model = make_model(1, 16)
        self.load_device = mm.get_torch_device()
        self.model.dynamic_pins = {self.load_device: {"active": active}}
        self.registered = 4 * MiB

    def is_dynamic(self):
        return True

    def unregister_inactive_pins(self, ram_to_unload):
        freed = min(self.registered, ram_to_unload)
        self.registered -= freed
        self.calls.append(("unregister", self.name, freed))
        return freed

    def partially_unload_ram(self, ram_to_unload):
        freed = min(self.registered, ram_to_unload)
        self.registered -= freed
        self.calls.append(("unload_ram", self.name, freed))
        return freed


def test_comfyui_eviction_walks_most_recently_used_first(monkeypatch):
    with memx_on("0.27.0", pin_limit="64MiB") as mm:
        calls = []
        patchers = {name: FakeDynamicPatcher(name, active, calls, mm)
                    for name, active in (("a", False), ("b", False), ("c", True), ("d", False))}
        # current_loaded_models is MRU first (d loaded last); the budget saw them used in the same order
        monkeypatch.setattr(mm, "current_loaded_models",
                            [types.SimpleNamespace(model=patchers[n]) for n in ("d", "c", "b", "a")])
        for name in ("a", "b", "c", "d"):
            pinning.budget().touch(owners.patcher_model_id(patchers[name]))
        monkeypatch.setattr(mm, "REGISTERABLE_PIN_HYSTERESIS", 0)
        assert mm.free_registrations(6 * MiB) is True
        assert calls == [("unregister", "d", 4 * MiB), ("unregister", "b", 2 * MiB)]
        calls.clear()
        assert mm.free_pins(12 * MiB, evict_active=True) == 2 * MiB + 4 * MiB + 4 * MiB
        assert [c for c in calls if c[2]] == [("unload_ram", "b", 2 * MiB), ("unload_ram", "a", 4 * MiB),
                                              ("unload_ram", "c", 4 * MiB)]
        # ComfyUI 0.27.0's own loop, for contrast, starts from the least recently used end
        for patcher in patchers.values():
            patcher.registered = 4 * MiB
        calls.clear()
        wrapping.original_of(mm, "free_registrations")(6 * MiB)
        assert [c[1] for c in calls] == ["a", "b"]


def test_host_scope_shares_the_cap_through_the_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with memx_on("0.27.0", pin_limit="64MiB", pin_scope="host") as mm:
        mm.vram_state = mm.VRAMState.NO_VRAM
        mm.load_models_gpu([make_patcher(4, 256 * 1024)])
        assert pinning.budget().scope == "host"
        registry = pinning.budget()._registry
        assert registry.entries().get(registry.me, 0) >= 4 * MiB
    from comfy_memx.core.hostshare import HostRegistry
    assert registry.me not in HostRegistry(str(tmp_path / "comfy_memx-pins.json")).entries()


def test_a_dead_model_leaves_the_budget():
    with memx_on("0.27.0", pin_limit="64MiB") as mm:
        import gc
        import weakref
        mm.vram_state = mm.VRAMState.NO_VRAM
        patcher = make_patcher(4, 256 * 1024)
        mm.load_models_gpu([patcher])
        module = weakref.ref(patcher.model)
        mm.unload_all_models()
        mm.current_loaded_models.clear()
        del patcher
        gc.collect()
        assert module() is None  # comfy_memx kept nothing alive
        assert pinning.budget().stats()["per_model"] == {}


# --- doctor and late activation ----------------------------------------------------------------------------------

def test_doctor_reports_host_memory_and_both_caps(monkeypatch, capsys):
    from comfy_memx.cli import doctor
    monkeypatch.setattr(hostmem, "probe_host", lambda *a, **k: fake_host(64, swap_gib=8))
    report = doctor.collect(shape_root("0.27.0"), environ={"COMFY_MEMX_PIN_LIMIT": "30%"})
    assert report["ram_bytes"] == 68719476736 and report["swap_disk_bytes"] == 8589934592
    assert report["swap_zram_bytes"] == 0 and report["cgroup_limit_bytes"] is None
    assert report["pin_cap_bytes"] == 20615843020          # 30 % of 64 GiB
    assert report["pin_cap_source"] == "COMFY_MEMX_PIN_LIMIT"
    assert report["comfyui_pin_cap_bytes"] == 61847529062  # ComfyUI 0.27.0: 90 % of physical RAM
    assert doctor.collect(shape_root("0.3.64"), environ={})["comfyui_pin_cap_bytes"] is None
    assert doctor.collect(environ={})["pin_cap_source"] == "auto"
    monkeypatch.setenv("COMFY_MEMX_PIN_LIMIT", "twelve")
    assert doctor.main(["--json"]) == 2
    assert "COMFY_MEMX_PIN_LIMIT" in capsys.readouterr().err


def test_late_activation_counts_pins_made_before():
    from fake_comfy.loader import use_fake_comfy
    import torch
    mm = use_fake_comfy("0.27.0")
    try:
        early = torch.ones(256 * 1024)  # 1 MiB pinned while comfy_memx was not active
        assert mm.pin_memory(early) is True
        STATE.reset()
        bootstrap("api", {"COMFY_MEMX_PIN_LIMIT": "3MiB", "COMFY_MEMX_RAISE_INTERNAL": "1"})
        assert mm.MAX_PINNED_MEMORY == 3 * MiB
        assert pinning.budget().stats()["pinned_bytes"] == MiB
        later = [torch.ones(256 * 1024) for _ in range(3)]
        assert [mm.pin_memory(t) for t in later] == [True, True, False]
        assert pinning.budget().stats()["refusals"] == 1
        assert mm.unpin_memory(early) is True
        assert pinning.budget().stats()["pinned_bytes"] == 2 * MiB
    finally:
        registry.remove_all()
        purge_fake_comfy()


def test_a_load_stops_protecting_its_models_when_it_returns():
    with memx_on("0.27.0", pin_limit="4MiB") as mm:
        mm.vram_state = mm.VRAMState.NO_VRAM
        loaded = make_patcher(4, 256 * 1024)
        mm.load_models_gpu([loaded])  # the cap is full of `loaded`, which its load protected
        later = make_patcher(1, 256 * 1024)
        key = next(k for k, _ in later.model.named_parameters())
        run_threads([lambda: later.pin_weight_to_device(key)])  # another thread, outside any load
        assert pinned_bytes(mm, later) == MiB and pinned_bytes(mm, loaded) == 3 * MiB


# --- ComfyUI 0.33+/0.38 shapes: per-subset pins, fast subsets, tiered eviction, the new pin_memory answer --------

@contextlib.contextmanager
def comfy_038(limit, events=None):
    """The 0.27.0 stand-in with the 0.38-shaped pin layer of ``fake_comfy.v0_38_pins``, then comfy_memx started as
    a late activation (it patches what is already imported).  Yields (model_management, pinned_memory)."""
    from fake_comfy import v0_38_pins
    from fake_comfy.loader import use_fake_comfy
    STATE.reset()
    mm = use_fake_comfy("0.27.0")
    import comfy.pinned_memory as pm
    mm.SIM_RAM_AVAILABLE = 100 * 1024 ** 3
    v0_38_pins.install(mm, pm)
    environ = {"COMFY_MEMX_PIN_LIMIT": limit, "COMFY_MEMX_RAISE_INTERNAL": "1"}
    if events is not None:
        environ["COMFY_MEMX_EVENTS"] = str(events)
    bootstrap("api", environ)
    try:
        yield mm, pm
    finally:
        registry.remove_all()
        purge_fake_comfy()


def dynamic(mm, layers=4):
    from fake_comfy import v0_38_pins
    return v0_38_pins.DynamicPatcher(mm, layers=layers)   # 4 layers of 256 KiB


def registered(patcher, subset=None):
    """Bytes of ``patcher``'s pins really registered (per the stand-in's registration backend)."""
    regs = patcher.mm.HOST_REGISTER.registered
    return sum(entry["pin"].nbytes for layer in patcher.layers()
               for name, entry in layer.__dict__.get("_pins", {}).items()
               if (subset is None or name == subset) and "pin" in entry and entry["pin"].data_ptr() in regs)


def books(mm):
    """(comfy_memx's settled total, its unsettled total, ComfyUI's TOTAL_PINNED_MEMORY)."""
    state = pinning.current()
    raw = state.budget.totals()[0] - state.budget.totals()[1]
    return pinning.budget().stats()["pinned_bytes"], raw, mm.TOTAL_PINNED_MEMORY


def test_038_layers_pinned_per_subset_never_ask_twice():
    with comfy_038("3MiB") as (mm, pm):
        from fake_comfy.v0_38_pins import loaded
        p = dynamic(mm)
        loaded(mm, p)
        assert [pm.pin_memory(layer) for layer in p.layers()] == [True] * 4
        assert pm.pin_memory(p.layers()[0], subset="weights-fast") is True
        grants = pinning.current().budget.stats()["grants"]
        assert [pm.pin_memory(layer) for layer in p.layers()] == [None] * 4    # already pinned: no request
        assert pinning.current().budget.stats()["grants"] == grants
        assert books(mm) == (int(1.25 * MiB),) * 3
        assert pinning.budget().pinned(model_id(p)) == registered(p) == int(1.25 * MiB)


def test_038_evictions_destroy_fast_subsets_first():
    with comfy_038("2MiB") as (mm, pm):
        from fake_comfy.v0_38_pins import loaded
        p, q = dynamic(mm), dynamic(mm)
        loaded(mm, q, p)
        for layer in p.layers():
            pm.pin_memory(layer)
        for layer in p.layers()[:2]:
            pm.pin_memory(layer, subset="weights-fast")
        assert registered(p) == int(1.5 * MiB)
        assert [pm.pin_memory(layer) for layer in q.layers()] == [True] * 4   # 0.5 MiB of room made in P
        assert registered(p, "weights-fast") == 0 and registered(p, "weights") == MiB
        assert all("pin" not in layer._pins["weights-fast"] for layer in p.layers()[:2])  # destroyed, not kept
        assert books(mm) == (2 * MiB,) * 3 and sum(mm.HOST_REGISTER.registered.values()) == 2 * MiB


def test_038_comfyui_tiered_eviction_is_booked_with_events(tmp_path):
    events = tmp_path / "events.jsonl"
    with comfy_038("8MiB", events=events) as (mm, pm):
        from fake_comfy.v0_38_pins import loaded
        p, q = dynamic(mm), dynamic(mm)
        loaded(mm, q, p)
        for patcher in (p, q):
            for layer in patcher.layers():
                pm.pin_memory(layer)
            patcher.state()["active"] = False
        pm.pin_memory(p.layers()[0], subset="weights-fast")
        # ComfyUI's tiers: the fast subsets first (P's 256 KiB), then the plain pins of the model loaded most
        # recently (Q: 768 KiB of it).
        assert mm.free_pins(MiB) == MiB
        assert registered(p) == MiB and registered(q) == 256 * 1024
        assert books(mm) == (int(1.25 * MiB),) * 3
        evicted = [(e["model_id"], e["bytes"], e["reason"], e["by"]) for e in pin_events(events, "pin_evict")]
        assert sorted(evicted) == sorted([(model_id(p), 256 * 1024, "ram_pressure", "comfyui"),
                                          (model_id(q), 768 * 1024, "ram_pressure", "comfyui")])
        assert mm.free_registrations(1) is True       # with its 2 GiB hysteresis it unregisters everything
        assert registered(p) == registered(q) == 0 and books(mm) == (0, 0, 0)
        assert [e["reason"] for e in pin_events(events, "pin_evict")][-1] == "cap"


def test_038_node_end_drops_every_patches_subset():
    with comfy_038("8MiB") as (mm, pm):
        from fake_comfy.v0_38_pins import loaded
        p = dynamic(mm)
        loaded(mm, p)
        for layer, subset in zip(p.layers(), ("weights", "patches", "patches-loaded", "patches-fast")):
            assert pm.pin_memory(layer, subset=subset) is True
        assert books(mm) == (MiB,) * 3
        mm.reset_cast_buffers()
        assert registered(p) == 256 * 1024 and books(mm) == (256 * 1024,) * 3


def test_038_a_tensor_pin_comfyui_refuses_gives_the_grant_back():
    with comfy_038("3MiB") as (mm, pm):
        import torch
        first, second = torch.ones(256 * 1024), torch.ones(256 * 1024)   # 1 MiB each
        assert mm.pin_memory(first, evict_active=False) is True           # 0.38's argument passes through
        mm.MAX_PINNED_MEMORY = int(1.5 * MiB)   # e.g. lowered by a custom node: ComfyUI's own check now refuses
        assert mm.pin_memory(second) is False and second.data_ptr() not in mm.PINNED_MEMORY
        stats = pinning.budget().stats()
        assert stats["pinned_bytes"] == MiB == mm.TOTAL_PINNED_MEMORY and stats["in_flight_bytes"] == 0
        assert stats["evictions"] == 0 and stats["grants"] == 2


def test_038_disable_switch_is_comfyuis_own():
    with comfy_038("3MiB") as (mm, pm):
        from fake_comfy.v0_38_pins import loaded
        p = dynamic(mm)
        loaded(mm, p)
        mm.DISABLE_PINNED_MEMORY = True
        assert pm.pin_memory(p.layers()[0]) is None
        assert pinning.current().budget.stats()["grants"] == 0 and mm.HOST_REGISTER.calls == []


def test_038_reregistration_by_get_pin_is_budgeted(tmp_path):
    events = tmp_path / "events.jsonl"
    with comfy_038("1.25MiB", events=events) as (mm, pm):
        from fake_comfy.v0_38_pins import loaded
        p, stray = dynamic(mm), dynamic(mm)   # stray is not loaded: its pins cannot be told apart, nor evicted
        loaded(mm, p)
        for layer in p.layers():
            pm.pin_memory(layer)
        p.unregister_inactive_pins(1e30)        # ComfyUI unregisters on a path comfy_memx does not wrap
        assert [pm.pin_memory(layer) for layer in stray.layers()] == [True] * 4
        assert books(mm) == (MiB,) * 3
        first, second = p.layers()[:2]
        assert pm.get_pin(first) is first._pins["weights"]["pin"] and first._pins["weights"]["registered"]
        pin = pm.get_pin(second)                 # over the cap and nothing evictable: refused, pin unregistered
        assert pin is second._pins["weights"]["pin"] and not second._pins["weights"]["registered"]
        assert books(mm) == (int(1.25 * MiB),) * 3 and max(books(mm)) <= pinning.cap().bytes
        refused = pin_events(events, "pin_refused")
        assert [(e["model_id"], e["bytes"], e["reason"]) for e in refused] == [(model_id(p), 256 * 1024, "over_cap")]


def test_an_unpin_from_a_finalizer_inside_the_budget_is_settled_after_it():
    """A garbage collection that runs while this thread holds the budget's lock unpins a dead model's weights
    (ModelPatcher.__del__); its bookkeeping must wait until the thread leaves the budget (the lock is not
    reentrant), then settle: no hang, and the books end equal to ComfyUI's."""
    import gc
    with memx_on("0.27.0", pin_limit="64MiB") as mm:
        mm.vram_state = mm.VRAMState.NO_VRAM
        doomed = make_patcher(4, 256 * 1024)
        mm.load_models_gpu([doomed])
        mm.current_loaded_models.clear()     # ComfyUI forgot it without unloading: only a cycle keeps it alive
        doomed.cycle = doomed
        del doomed
        budget = pinning.current().budget
        decide = budget._decide
        collected = []

        def decide_with_a_collection(*args):
            collected.append(gc.collect())   # the finalizer runs here, with the budget's lock held
            return decide(*args)
        budget._decide = decide_with_a_collection
        survivor = make_patcher(1, 256 * 1024)
        worker = threading.Thread(target=lambda: mm.load_models_gpu([survivor]))
        worker.start()
        worker.join(20)
        assert not worker.is_alive(), "deadlock: the finalizer waited for the budget's lock"
        budget._decide = decide
        assert collected and collected[0] > 0
        assert pinning.budget().stats()["pinned_bytes"] == mm.TOTAL_PINNED_MEMORY == MiB
        assert pinning.current().budget.totals() == (MiB, 0)   # settled without a read-time settle


def test_038_evict_active_false_spares_the_active_models():
    with comfy_038("2MiB") as (mm, pm):
        import torch
        from fake_comfy.v0_38_pins import loaded
        p, q = dynamic(mm), dynamic(mm)
        loaded(mm, p, q)
        for patcher in (q, p):                       # P pinned last: the most recently used
            for layer in patcher.layers():
                pm.pin_memory(layer)
        q.state()["active"] = False                  # Q's node is over; P is running
        first, second = torch.ones(128 * 1024), torch.ones(128 * 1024)   # 512 KiB each
        assert mm.pin_memory(first, evict_active=False) is True
        assert (registered(p), registered(q)) == (MiB, 512 * 1024)       # room made in Q, not in active P
        assert mm.pin_memory(second) is True
        assert (registered(p), registered(q)) == (512 * 1024, 512 * 1024)  # now P, the most recently used
        assert books(mm) == (2 * MiB,) * 3


def test_loads_and_unloads_call_the_pin_wing_only_while_a_pin_session_runs():
    from comfy_memx.core import signals
    from comfy_memx.pins.loadscope import end_load_protection, settle_after_unload

    def subscribed():
        return (end_load_protection in signals.load.subscribers(),
                settle_after_unload in signals.model_unload.subscribers())
    with memx_with_argv("0.27.0", ["--cpu"], pin_limit="12MiB"):
        assert subscribed() == (False, False)     # ComfyUI pins nothing: no session, no call per load
    with memx_on("0.27.0", pin_limit="64MiB") as mm:
        assert subscribed() == (True, True)
        mm.vram_state = mm.VRAMState.NO_VRAM
        patcher = make_patcher(4, 256 * 1024)
        mm.load_models_gpu([patcher])
        assert pinning.budget().pinned(model_id(patcher)) == 4 * MiB
        pinning.stop()
        assert subscribed() == (False, False)     # the session closed: the wing left the load path
    assert subscribed() == (False, False)
