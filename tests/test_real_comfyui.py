"""comfy_memx against real ComfyUI servers, driven by tests/real_comfy/drive.py.

The real-server tests are skipped unless two variables are set:

* ``COMFY_MEMX_REAL_COMFYUI``: one or more ComfyUI trees (folders with main.py), os.pathsep-separated;
* ``COMFY_MEMX_REAL_PYTHON``: the interpreter that runs them (a venv with ComfyUI's requirements).

Example::

    COMFY_MEMX_REAL_COMFYUI=/work/comfy/c0364:/work/comfy/c0270 \\
    COMFY_MEMX_REAL_PYTHON=/work/comfy/venv/bin/python python -m pytest -q tests/test_real_comfyui.py

Each server run takes about 20 s (boot 15-18 s on 2 cores); runs are shared between tests of a module.
The ``module`` and ``env`` launcher runs are skipped as well unless comfy_memx is importable by that
interpreter (``pip install --no-deps -e .`` into the venv). Server logs and summaries stay under pytest's
temporary folder (the path is in each failure message).

The offline tests at the top check the harness itself (workflows against the node pack, launch commands)
and always run.
"""

import gc
import importlib.util
import os
import subprocess
import sys
import types
import weakref
from pathlib import Path

import pytest

REAL_COMFY_DIR = Path(__file__).parent / "real_comfy"
TREES_ENV = "COMFY_MEMX_REAL_COMFYUI"
PYTHON_ENV = "COMFY_MEMX_REAL_PYTHON"


def load_module(name, path):
    """Import a file that is not on sys.path under a private module name."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


drive = load_module("memx_real_comfy_drive", REAL_COMFY_DIR / "drive.py")
node_pack = load_module("memx_real_comfy_nodes", REAL_COMFY_DIR / "memx_test_nodes" / "__init__.py")


def configured_trees():
    """The ComfyUI trees named by COMFY_MEMX_REAL_COMFYUI (empty list when unset)."""
    return [path for path in os.environ.get(TREES_ENV, "").split(os.pathsep) if path]


def configured_python():
    """The interpreter named by COMFY_MEMX_REAL_PYTHON, or None."""
    return os.environ.get(PYTHON_ENV) or None


# ---------------------------------------------------------------------------------------------------------------
# Offline checks of the harness (always run, no ComfyUI needed)
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", drive.SCENARIOS)
def test_scenario_prompts_only_use_pack_nodes_with_their_declared_inputs(scenario):
    for step in drive.scenario_steps(scenario):
        if step["kind"] != "prompt":
            continue
        prompt = step["prompt"]
        for node_id, node in prompt.items():
            node_class = node_pack.NODE_CLASS_MAPPINGS[node["class_type"]]
            declared = node_class.INPUT_TYPES()["required"]
            assert set(node["inputs"]) == set(declared), (step["name"], node_id)
            for input_name, value in node["inputs"].items():
                if isinstance(value, list):
                    source_id, output_index = value
                    source_class = node_pack.NODE_CLASS_MAPPINGS[prompt[source_id]["class_type"]]
                    assert source_class.RETURN_TYPES[output_index] == declared[input_name][0]
        output_nodes = [n for n in prompt.values() if getattr(node_pack.NODE_CLASS_MAPPINGS[n["class_type"]],
                                                               "OUTPUT_NODE", False)]
        assert output_nodes, f"{step['name']} has no output node, ComfyUI would reject it"


def test_leak_scenario_replaces_loader_input_and_basic_keeps_it():
    def loader_inputs(scenario):
        return [step["prompt"]["1"]["inputs"] for step in drive.scenario_steps(scenario) if step["kind"] == "prompt"]

    leak = loader_inputs("leak")
    basic = loader_inputs("basic")
    assert leak[0] != leak[1]
    assert basic[0] == basic[1]
    assert drive.scenario_steps("leak")[-1] == {"kind": "free", "name": "free", "body": drive.FREE_ALL}


@pytest.mark.parametrize("launcher,prefix,extra_env", [
    ("plain", ["PY", "/t/main.py"], {}),
    ("module", ["PY", "-m", "comfy_memx", "/t/main.py"], {}),
    ("env", ["PY", "/t/main.py"], {"COMFY_MEMX": "1"}),
])
def test_server_command_per_launcher(launcher, prefix, extra_env):
    argv, env = drive.server_command("PY", "/t", launcher, 4321, ["--cache-classic"])
    assert argv == prefix + ["--cpu", "--listen", "127.0.0.1", "--port", "4321", "--cache-classic"]
    assert env == extra_env


def test_unknown_launcher_and_bad_env_pairs_are_rejected():
    with pytest.raises(ValueError):
        drive.server_command("PY", "/t", "docker", 1, [])
    with pytest.raises(ValueError):
        drive.parse_env_pairs(["NOEQUALS"])
    assert drive.parse_env_pairs(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}


def test_caller_comfy_memx_variables_do_not_reach_the_server(monkeypatch):
    monkeypatch.setenv("COMFY_MEMX", "1")
    monkeypatch.setenv("COMFY_MEMX_LEAK_MODE", "strict")
    monkeypatch.setenv("MEMX_UNRELATED", "kept")
    env = drive.inherited_env()
    assert not [key for key in env if key.startswith("COMFY_MEMX")]
    assert env["MEMX_UNRELATED"] == "kept"


def test_leak_lines_are_found_with_and_without_ansi_colours():
    log = ("\x1b[32m[INFO]\x1b[0m Potential memory leak detected with model MemxTinyNet, doing a full garbage collect\n"
           "Prompt executed in 0.03 seconds\n"
           "WARNING, memory leak with model MemxTinyNet. Please make sure it is not being referenced from somewhere.\n")
    assert drive.lines_containing(log, drive.LEAK_INFO_TEXT) == [
        "[INFO] Potential memory leak detected with model MemxTinyNet, doing a full garbage collect"]
    assert len(drive.lines_containing(log, drive.LEAK_WARNING_TEXT)) == 1
    assert drive.lines_containing(log, "absent") == []


def test_node_pack_install_copies_without_bytecode(tmp_path):
    (tmp_path / "custom_nodes").mkdir()
    target = Path(drive.install_node_pack(str(tmp_path)))
    assert (target / "__init__.py").read_bytes() == (REAL_COMFY_DIR / "memx_test_nodes" / "__init__.py").read_bytes()
    assert not list(target.rglob("*.pyc"))
    with pytest.raises(FileNotFoundError):
        drive.install_node_pack(str(tmp_path / "not_a_tree"))


@pytest.fixture
def stub_model_management(monkeypatch):
    """A stand-in ``comfy.model_management`` that records load_models_gpu calls (the real one needs ComfyUI)."""
    loads = []
    management = types.ModuleType("comfy.model_management")
    management.load_models_gpu = lambda models: loads.append(list(models))
    comfy = types.ModuleType("comfy")
    comfy.model_management = management
    monkeypatch.setitem(sys.modules, "comfy", comfy)
    monkeypatch.setitem(sys.modules, "comfy.model_management", management)
    return loads


class FakePatcher:
    """The two ModelPatcher attributes the test nodes use."""

    def __init__(self, model, load_device):
        self.model = model
        self.load_device = load_device


def test_leaky_cache_keeps_the_module_but_not_the_patcher(stub_model_management):
    torch = pytest.importorskip("torch")
    module = node_pack.tiny_net_class()(16, 2)
    patcher = FakePatcher(module, torch.device("cpu"))
    leaky = node_pack.MemxLeakyCache()
    try:
        result = leaky.keep(patcher, "k")
        assert stub_model_management == [[patcher]]
        assert result["ui"]["memx_leak"][0]["key"] == "k"
        stub_model_management.clear()
        patcher_ref, module_ref = weakref.ref(patcher), weakref.ref(module)
        del patcher, module
        gc.collect()
        assert patcher_ref() is None
        assert module_ref() is not None and type(module_ref()).__name__ == drive.TINY_MODEL_CLASS
    finally:
        node_pack.MemxLeakyCache._cache.clear()


def test_tiny_model_weights_depend_only_on_the_loader_name():
    torch = pytest.importorskip("torch")
    net = node_pack.tiny_net_class()

    def weights(name):
        torch.manual_seed(node_pack.seed_from_text(name))
        return net(8, 2).layers[0].weight

    assert torch.equal(weights("a"), weights("a"))
    assert not torch.equal(weights("a"), weights("b"))
    assert node_pack.seed_from_text("a") == node_pack.seed_from_text("a") != node_pack.seed_from_text("b")


# ---------------------------------------------------------------------------------------------------------------
# Real ComfyUI (opt-in through COMFY_MEMX_REAL_COMFYUI and COMFY_MEMX_REAL_PYTHON)
# ---------------------------------------------------------------------------------------------------------------

real_trees = configured_trees() or ["<COMFY_MEMX_REAL_COMFYUI unset>"]
needs_real_comfyui = pytest.mark.skipif(
    not (configured_trees() and configured_python()),
    reason=f"set {TREES_ENV} (ComfyUI trees) and {PYTHON_ENV} (their interpreter) to run against real ComfyUI")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """Return ``run(tree, scenario, launcher="plain")`` -> drive.py summary; each combination runs once."""
    results = {}

    def run(tree, scenario, launcher="plain", extra=()):
        key = (tree, scenario, launcher, tuple(extra))
        if key not in results:
            out = tmp_path_factory.mktemp(f"{Path(tree).name}-{scenario}-{launcher}")
            options = drive.build_parser().parse_args([
                "--tree", tree, "--python", configured_python(), "--scenario", scenario,
                "--launcher", launcher, "--out", str(out), "--quiet", *extra])
            results[key] = drive.run(options)
        return results[key]

    return run


def describe(summary):
    """A short failure message: what failed and where the full log is."""
    return f"error={summary.get('error')!r}, log={summary.get('server_log')}"


@pytest.fixture(scope="module")
def memx_importable_by_real_python(tmp_path_factory):
    """True when the real interpreter runs ``-m comfy_memx --version`` from outside the repository (installed)."""
    python = configured_python()
    if not python:
        return False
    probe = subprocess.run([python, "-m", "comfy_memx", "--version"], capture_output=True, timeout=60,
                           cwd=tmp_path_factory.mktemp("memx-probe"), env=drive.inherited_env())
    return probe.returncode == 0


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_real_comfyui_boots_runs_prompts_and_stops(tree, real_run):
    summary = real_run(tree, "basic")
    assert summary["comfyui_version"], describe(summary)
    assert summary["ok"], describe(summary)
    assert [step["name"] for step in summary["steps"]] == ["first", "reseeded", "free"]
    outputs = [step["outputs"]["2"]["memx_sample"][0] for step in summary["steps"][:2]]
    assert [output["seed"] for output in outputs] == [1, 2]
    assert outputs[0]["checksum"] != outputs[1]["checksum"]
    assert summary["stop_method"] == "SIGINT" and summary["server_exit_code"] == 0, describe(summary)


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_real_comfyui_reports_no_leak_when_nothing_holds_the_model(tree, real_run):
    summary = real_run(tree, "basic")
    assert summary["ok"], describe(summary)
    assert summary["leak_info_lines"] == [] and summary["leak_warning_lines"] == [], describe(summary)


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_real_comfyui_warns_about_the_module_held_by_the_leaky_node(tree, real_run):
    summary = real_run(tree, "leak")
    assert summary["ok"], describe(summary)
    assert summary["leak_info_lines"], describe(summary)
    assert summary["leak_warning_lines"], describe(summary)
    assert all(drive.TINY_MODEL_CLASS in line for line in summary["leak_warning_lines"])
    assert summary["leak_warning_lines"][0].endswith(
        "WARNING, memory leak with model MemxTinyNet. Please make sure it is not being referenced from somewhere.")


@needs_real_comfyui
@pytest.mark.parametrize("launcher", ["module", "env"])
@pytest.mark.parametrize("tree", real_trees)
def test_real_comfyui_under_comfy_memx_launchers_still_runs_prompts(tree, launcher, real_run,
                                                                    memx_importable_by_real_python):
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps -e .)")
    summary = real_run(tree, "leak", launcher)
    assert summary["ok"], describe(summary)
    assert summary["leak_warning_lines"], describe(summary)


def memx_log_lines(summary):
    """comfy_memx's own lines of a run's server log, ANSI colours removed."""
    text = Path(summary["server_log"]).read_text(encoding="utf-8", errors="replace")
    return drive.lines_containing(text, "comfy_memx")


@needs_real_comfyui
@pytest.mark.parametrize("launcher", ["module", "env"])
@pytest.mark.parametrize("tree", real_trees)
def test_real_comfyui_logs_the_startup_line_and_names_the_leaking_package(tree, launcher, real_run,
                                                                         memx_importable_by_real_python):
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps -e .)")
    summary = real_run(tree, "leak", launcher)
    lines = memx_log_lines(summary)
    source = "launcher" if launcher == "module" else "env"
    startup = [line for line in lines if f"active ({source}, leak mode report): patched" in line]
    assert len(startup) == 1 and "load_models_gpu" in startup[0], describe(summary)
    assert "Torch already imported" not in Path(summary["server_log"]).read_text(errors="replace")
    owner = [line for line in lines if "comfy_memx: leaked model MemxTinyNet (MemxTinyNet#1), loaded by" in line]
    assert owner and "package memx_test_nodes" in owner[0], describe(summary)


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_real_comfyui_strict_mode_names_the_holder_and_routes_answer(tree, real_run,
                                                                    memx_importable_by_real_python):
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps -e .)")
    summary = real_run(tree, "leak", "module", ["--env", "COMFY_MEMX_LEAK_MODE=strict", "--get", "/memx/models",
                                                "--post-memx-free", "60"])
    lines = memx_log_lines(summary)
    assert any("memx_test_nodes.MemxLeakyCache._cache['a']  [package memx_test_nodes, class_attribute]" in line
               for line in lines), describe(summary)
    models = summary["gets"][0]
    assert models["http_status"] == 200 and any(row["model_id"] == "MemxTinyNet#1" for row in models["body"])
    receipt = summary["memx_free"]
    assert receipt["http_status"] == 200, receipt
    survivors = {s["model_id"]: s for s in receipt["body"]["survivors"]}
    assert survivors["MemxTinyNet#1"]["holders"][0]["path"] == "memx_test_nodes.MemxLeakyCache._cache['a']"
