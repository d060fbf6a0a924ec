"""Late activation on the stand-ins: comfy_memx switched on after ComfyUI's modules were imported (the node-pack
install), with a module that bound ``load_models_gpu`` by name before it."""

import sys
import types

import pytest

from comfy_memx.core import registry
from comfy_memx.core.bootstrap import bootstrap
from comfy_memx.core.state import STATE
from fake_comfy.loader import purge_fake_comfy, use_fake_comfy

BINDER = "memx_early_binder_pack.nodes"


@pytest.fixture(params=["0.3.64", "0.27.0"])
def late(request, tmp_path):
    """The stand-in imported first, a custom node that did ``from comfy.model_management import load_models_gpu``,
    then comfy_memx bootstrapped (late); yields (model_management, binder module)."""
    mm = use_fake_comfy(request.param)
    import execution  # noqa: F401
    import server  # noqa: F401
    binder = types.ModuleType(BINDER)
    binder.__file__ = str(tmp_path / "custom_nodes" / "memx_early_binder_pack" / "nodes.py")
    binder.load_models_gpu = mm.load_models_gpu
    sys.modules[BINDER] = binder
    STATE.reset()
    bootstrap("node pack", {"COMFY_MEMX_RAISE_INTERNAL": "1"})
    try:
        yield mm, binder
    finally:
        sys.modules.pop(BINDER, None)
        registry.remove_all()
        purge_fake_comfy()


def test_the_startup_line_says_late_and_names_the_module_holding_the_unwrapped_function(late):
    mm, binder = late
    assert binder.load_models_gpu is not mm.load_models_gpu      # the patch reached the module, not the binder
    line = registry.startup_line("0", STATE.source, "report")
    assert "active (node pack, leak mode report, release off)" in line
    assert ("late activation (comfy.model_management, comfy.model_patcher, comfy.utils, execution, server imported "
            "before comfy_memx)") in line   # the stand-in's nodes.py imports comfy.sd, as ComfyUI's does
    assert ("load_models_gpu held by custom node memx_early_binder_pack (memx_early_binder_pack.nodes)" in line)


def test_a_module_that_binds_the_name_after_activation_is_not_listed(late):
    mm, binder = late
    binder.load_models_gpu = mm.load_models_gpu                   # re-bound after the patch: the wrapper
    line = registry.startup_line("0", STATE.source, "report")
    assert "memx_early_binder_pack" not in line and "no module holds an unwrapped function" in line


def test_models_loaded_before_activation_are_named_as_adopted_without_an_owner(late):
    mm, _ = late
    mm.current_loaded_models.append(types.SimpleNamespace(model=None, real_model=None))
    try:
        line = registry.startup_line("0", STATE.source, "report")
    finally:
        mm.current_loaded_models.pop()
    assert "1 model(s) loaded before it are adopted without an owner" in line


def test_an_activation_before_comfyui_imports_is_not_late(tmp_path):
    STATE.reset()
    bootstrap("api", {"COMFY_MEMX_RAISE_INTERNAL": "1"})
    try:
        use_fake_comfy("0.27.0")
        import server  # noqa: F401
        line = registry.startup_line("0", STATE.source, "report")
        assert "late activation" not in line and "unreachable" not in line
    finally:
        registry.remove_all()
        purge_fake_comfy()
