"""The patch/unpatch contract for every patch module, on both ComfyUI stand-in shapes."""

import logging

import pytest

from comfy_memx.core.state import STATE

from comfy_memx.ledger import accounting
from comfy_memx.core import errors
from comfy_memx.core import registry
from comfy_memx.core import wrapping
from comfy_memx.core.config import PATCH_NAMES
from fake_comfy.loader import make_patcher
from memx_helpers import memx_on

VERSIONS = ["0.3.64", "0.27.0"]


def targets(mm):
    """Every patch module whose ComfyUI target this stand-in has (imported here if needed)."""
    import importlib
    found = {}
    for name in PATCH_NAMES:
        patches = registry.patch_of(name)
        try:
            found[name] = (patches, importlib.import_module(patches.target))
        except ImportError:
            continue
    assert {"model_management", "execution"} <= set(found)
    return found


def present_sites(patches, module):
    for site in patches.sites:
        try:
            wrapping.resolve(module, site)
        except errors.PatchSkipped:
            continue
        yield site


@pytest.mark.parametrize("version", VERSIONS)
def test_sites_are_patched_or_skipped_with_reason(version):
    with memx_on(version) as mm:
        status = {row["site"]: row for row in registry.site_status()}
        assert status["load_models_gpu"]["state"] == "patched"
        assert status["LoadedModel.model_unload"]["state"] == "patched"
        assert status["PromptExecutor.execute_async"]["state"] == "patched"
        clones = status["unload_model_and_clones"]
        if version == "0.3.64":
            assert clones["state"] == "skipped" and clones["reason"] == "absent in this ComfyUI"
        else:
            assert clones["state"] == "patched"
        assert mm.load_models_gpu.__wrapped__ is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_patch_twice_unpatch_restores_identity_and_repatch_works(version):
    with memx_on(version) as mm:
        for name, (patches, module) in targets(mm).items():
            sites = list(present_sites(patches, module))
            wrapped = {s: wrapping._raw_attr(*wrapping.resolve(module, s)) for s in sites}
            originals = {s: wrapping.original_of(module, s) for s in sites}
            assert all(r in ("already patched",) or isinstance(r, errors.PatchSkipped)
                       for r in patches.patch(module).values())
            assert {s: wrapping._raw_attr(*wrapping.resolve(module, s)) for s in sites} == wrapped
            patches.unpatch(module)
            for site in sites:
                assert wrapping._raw_attr(*wrapping.resolve(module, site)) is originals[site], site
            assert set(patches.unpatch(module).values()) == {"not patched"}
            patches.patch(module)
            for site in sites:
                current = wrapping._raw_attr(*wrapping.resolve(module, site))
                assert current is not originals[site] and current.__wrapped__ is originals[site]


@pytest.mark.parametrize("version", VERSIONS)
def test_wrappers_are_transparent(version):
    with memx_on(version) as mm:
        patcher = make_patcher()
        assert mm.load_models_gpu([patcher]) is None
        assert mm.current_loaded_models[0].model is patcher
        freed = mm.free_memory(1e30, mm.get_torch_device())
        assert [e.model for e in freed] == [patcher] and mm.current_loaded_models == []
        with pytest.raises(TypeError) as patched_error:
            mm.free_memory(1, mm.get_torch_device(), not_a_parameter=1)
        with pytest.raises(AttributeError):
            mm.load_models_gpu([object()])
        if version == "0.27.0":
            assert mm.free_memory(1, mm.get_torch_device(), keep_loaded=[], for_dynamic=False,
                                  pins_required=0, ram_required=0) == []
        original = wrapping.original_of(mm, "free_memory")
        with pytest.raises(TypeError) as original_error:
            original(1, mm.get_torch_device(), not_a_parameter=1)
        assert str(patched_error.value) == str(original_error.value)


@pytest.mark.parametrize("version", VERSIONS)
def test_bookkeeping_errors_never_fail_comfyui_in_production(version, monkeypatch, caplog):
    with memx_on(version) as mm:
        def broken(*args, **kwargs):
            raise RuntimeError("ledger bug")
        monkeypatch.setattr(accounting, "on_load", broken)
        with pytest.raises(RuntimeError, match="ledger bug"):
            mm.load_models_gpu([make_patcher()])
        monkeypatch.setattr(STATE.errors, "raise_internal", False)
        monkeypatch.setattr(STATE.errors, "reported_kinds", set())
        for _ in range(3):
            assert mm.load_models_gpu([make_patcher()]) is None
        reports = [r for r in caplog.records if "internal error in model_load.after -> " in r.getMessage()]
        assert len(reports) == 1 and reports[0].levelno == logging.WARNING


@pytest.mark.parametrize("version", VERSIONS)
def test_foreign_wrapper_installed_on_top_is_kept(version):
    with memx_on(version) as mm:
        ours = mm.free_memory
        calls = []

        def foreign(*args, **kwargs):
            calls.append(args)
            return ours(*args, **kwargs)
        mm.free_memory = foreign
        registry.patch_of("model_management").unpatch(mm)
        assert mm.free_memory is foreign
        assert mm.free_memory(1, mm.get_torch_device()) == [] and len(calls) == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_cast_to_is_never_touched(version):
    with memx_on(version) as mm:
        cast_to = mm.cast_to
        assert cast_to.__module__ == "comfy.model_management" and not hasattr(cast_to, "__wrapped__")
        assert wrapping.original_of(mm, "cast_to") is cast_to


@pytest.mark.parametrize("version", VERSIONS)
def test_disabled_patch_is_skipped_with_reason(version):
    with memx_on(version, disable="execution") as mm:
        import execution
        assert not hasattr(execution.PromptExecutor.execute_async, "__wrapped__")
        status = {row["site"]: row for row in registry.site_status()}
        assert status["PromptExecutor.execute_async"]["reason"] == "disabled by COMFY_MEMX_DISABLE"
        assert hasattr(mm.load_models_gpu, "__wrapped__")


@pytest.mark.parametrize("version", VERSIONS)
def test_startup_line_lists_patched_and_skipped_sites(version, caplog):
    caplog.set_level(logging.INFO, logger="comfy_memx")
    with memx_on(version) as mm:
        mm.load_models_gpu([make_patcher()])   # at the latest, the first load announces
        mm.load_models_gpu([make_patcher()])
        lines = [r.getMessage() for r in caplog.records if "active (api" in r.getMessage()]
    assert len(lines) == 1
    assert "patched load_models_gpu" in lines[0] and "PromptExecutor.execute_async" in lines[0]
    if version == "0.3.64":
        assert "skipped unload_model_and_clones, pin_memory" in lines[0]
        assert "free_registrations (absent in this ComfyUI)" in lines[0]
