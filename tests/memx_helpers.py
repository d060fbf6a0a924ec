"""Helpers for tests that run comfy_memx's real patch path on the ComfyUI stand-ins."""

import contextlib
import json
import os

from comfy_memx.core import registry
from comfy_memx.core.state import STATE
from comfy_memx.core.bootstrap import bootstrap
from fake_comfy.loader import purge_fake_comfy, use_fake_comfy

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench_env(base=None):
    """``base`` (default: this environment) with the checkout on PYTHONPATH, so that a child process finds the
    ``bench`` package (``python -m bench.<case>``) wherever it runs."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = CHECKOUT + os.pathsep + env.get("PYTHONPATH", "") if env.get("PYTHONPATH") else CHECKOUT
    return env


@contextlib.contextmanager
def memx_on(version, **settings):
    """Bootstrap comfy_memx with ``settings`` (COMFY_MEMX_* names without prefix), then import the stand-in.

    The patches are applied by the post-import hook, as in a real ComfyUI start.  Yields the stand-in's
    ``comfy.model_management``; unpatches and purges the stand-in afterwards.
    """
    environ = {"COMFY_MEMX_" + k.upper(): str(v) for k, v in settings.items()}
    environ["COMFY_MEMX_RAISE_INTERNAL"] = "1"
    STATE.reset()
    bootstrap("api", environ)
    try:
        mm = use_fake_comfy(version)
        import execution  # noqa: F401  (the execution patch fires on its import)
        try:
            import server  # noqa: F401  (the startup line is logged once server is imported, as in main.py)
        except ImportError:
            pass
        yield mm
    finally:
        registry.remove_all()
        purge_fake_comfy()


@contextlib.contextmanager
def umask(mask):
    """Run the block under the process umask ``mask`` (022: the usual one, which makes a plain new file 0644)."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode_of(path):
    """The permission bits of ``path`` (0o600: only its owner reads and writes it)."""
    import stat
    return stat.S_IMODE(os.stat(path).st_mode)


def read_events(path):
    """The JSON objects of an events file."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def install_pack(tmp_path, name="leaky_pack"):
    """Copy a test pack under ``tmp_path/custom_nodes/`` and load it with the stand-in's own custom-node loader."""
    import asyncio
    import os
    import shutil
    import nodes
    from fake_comfy.loader import PACKS_DIR
    target = tmp_path / "custom_nodes" / name
    shutil.copytree(os.path.join(PACKS_DIR, name), target)
    assert asyncio.run(nodes.load_custom_node(str(target))) is not False
    return target


def run_prompt(executor, prompt_id, prompt):
    """Execute a prompt dict ({node_id: {"class_type", "inputs"}}) synchronously through the stand-in executor."""
    executor.execute(prompt, prompt_id)
    return executor


def load_module(name, path, register=False):
    """Import the file ``path`` under the module name ``name`` (kept in ``sys.modules`` when ``register``)."""
    import importlib.util
    import sys
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stub_comfy_modules(monkeypatch):
    """Put a minimal ``comfy`` (model_management, model_patcher, model_base) in ``sys.modules`` for the bench node
    packs' offline tests; returns the list that the stub ``load_models_gpu`` appends the loaded models to."""
    import sys
    import types

    class ModelPatcher:
        def __init__(self, model, load_device=None, offload_device=None):
            self.model, self.load_device, self.offload_device = model, load_device, offload_device

    class BaseModel:
        pass

    loaded = []
    comfy = types.ModuleType("comfy")
    model_management = types.ModuleType("comfy.model_management")
    model_management.get_torch_device = lambda: "cpu"
    model_management.unet_offload_device = lambda: "cpu"
    model_management.load_models_gpu = lambda models, **kwargs: loaded.extend(models)
    model_patcher = types.ModuleType("comfy.model_patcher")
    model_patcher.ModelPatcher = ModelPatcher
    model_base = types.ModuleType("comfy.model_base")
    model_base.BaseModel = BaseModel
    comfy.model_management, comfy.model_patcher, comfy.model_base = model_management, model_patcher, model_base
    for name, module in (("comfy", comfy), ("comfy.model_management", model_management),
                         ("comfy.model_patcher", model_patcher), ("comfy.model_base", model_base)):
        monkeypatch.setitem(sys.modules, name, module)
    return loaded
