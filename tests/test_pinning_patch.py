"""The pinned-memory patches on the ComfyUI stand-ins: cap, MRU eviction, no churn, RAM pressure, threads, events.

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
from comfy_memx.pins import session as pinning
from comfy_memx.core import registry
from comfy_memx.core.state import STATE
from comfy_memx.core import wrapping
from comfy_memx.core.bootstrap import bootstrap
from fake_comfy.loader import make_patcher, purge_fake_comfy, shape_root
from memx_helpers import memx_on, read_events

MiB = 1024 ** 2
SITES = ["pin_memory", "unpin_memory", "ensure_pin_budget", "ensure_pin_registerable", "free_pins",
         "free_registrations"]


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
    sys.path.insert(0, shape_root(version))
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


def test_auto_cap_is_the_swap_aware_rule_on_this_host(caplog):
    caplog.set_level(logging.INFO, logger="comfy_memx")
    with memx_on("0.27.0") as mm:
        host = hostmem.probe_host()
        assert mm.MAX_PINNED_MEMORY == pincap.auto_cap(host) == pinning.cap().bytes
        assert pinning.cap().source == "auto"
        line = [r.getMessage() for r in caplog.records if "pinned-memory cap" in r.getMessage()][0]
        assert "(auto: %.1f GiB RAM, " % (host.ram_total / 1024 ** 3) in line and "ComfyUI 0.27.0 would use" in line


def test_limit_above_ram_is_clamped_with_a_warning(caplog):
    with memx_on("0.27.0", pin_limit="1000TiB") as mm:
        assert mm.MAX_PINNED_MEMORY == hostmem.probe_host().ram_total
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
        originals = {site: wrapping.original_of(mm, site) for site in SITES}
        wrappers = {site: getattr(mm, site) for site in SITES}
        assert all(wrappers[site] is not originals[site] for site in SITES)
        assert set(patches.patch(mm).values()) == {"already patched"}
        assert {site: getattr(mm, site) for site in SITES} == wrappers
        comfyui_value = pinning.comfyui_max()
        patches.unpatch(mm)
        assert all(getattr(mm, site) is originals[site] for site in SITES)
        assert mm.MAX_PINNED_MEMORY == comfyui_value and not pinning.managing()
        assert set(patches.unpatch(mm).values()) == {"not patched"}
        patches.patch(mm)
        patches.adopt(mm)
        assert all(getattr(mm, site).__wrapped__ is originals[site] for site in SITES)
        assert mm.MAX_PINNED_MEMORY == 12 * MiB and pinning.managing(mm)

        dynamic = registry.patch_of("dynamic_pins")
        original_pin = wrapping.original_of(pm, "pin_memory")
        assert pm.pin_memory is not original_pin and pm.pin_memory.__wrapped__ is original_pin
        dynamic.unpatch(pm)
        assert pm.pin_memory is original_pin
        dynamic.patch(pm)
        assert pm.pin_memory.__wrapped__ is original_pin


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
        monkeypatch.setattr(pinning, "RAM_READING_MAX_AGE", 0.0)
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
            pinning.budget().touch(pinning._patcher_model_id(patchers[name]))
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
        entries = pinning.budget()._registry.entries()
        assert entries.get(os.getpid(), 0) >= 4 * MiB
    from comfy_memx.pins.budget import HostRegistry
    assert os.getpid() not in HostRegistry(str(tmp_path / "comfy_memx-pins.json")).entries()


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
    host = hostmem.probe_host()
    report = doctor.collect(shape_root("0.27.0"), environ={"COMFY_MEMX_PIN_LIMIT": "30%"})
    assert report["ram_bytes"] == host.ram_total and report["swap_disk_bytes"] == host.swap_disk
    assert report["swap_zram_bytes"] == host.swap_zram and report["cgroup_limit_bytes"] == host.cgroup_limit
    assert report["pin_cap_bytes"] == int(host.ram_total * 0.3)
    assert report["pin_cap_source"] == "COMFY_MEMX_PIN_LIMIT"
    assert report["comfyui_pin_cap_bytes"] == pincap.comfyui_cap(host, "0.27.0") > 0
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
