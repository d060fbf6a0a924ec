"""comfy_memx inside real ComfyUI servers (opt-in), and offline checks of the harness that drives them.

The real-server tests run only when both of these are set (otherwise they are skipped, with that reason):

* ``COMFY_MEMX_REAL_COMFYUI``: one or more ComfyUI trees (folders with main.py), os.pathsep-separated;
* ``COMFY_MEMX_REAL_PYTHON``: the interpreter that runs them (a venv with ComfyUI's requirements and comfy_memx
  installed: ``pip install --no-deps -e .`` or the wheel).

The default text-to-image workflow needs the random-weight SD1.5 checkpoint of ``bench/harness/make_checkpoint.py``:
``COMFY_MEMX_REAL_CHECKPOINT`` names it; when that file does not exist yet (or the variable is unset, then
``${XDG_CACHE_HOME:-~/.cache}/comfy_memx-real/memx_sd15_random.safetensors``) it is built there once (about 25 s,
2 GiB), so CI can cache it. The ``small_checkpoint`` fixture does the same for the small checkpoint of
``make_checkpoint.py --arch small`` (``COMFY_MEMX_REAL_SMALL_CHECKPOINT``, else ``memx_small_random.safetensors``
in that cache folder; 265 MiB), which the default workflow runs on too; ``test_small_checkpoint_samples_in_each_tree``
checks that every configured tree loads and samples it.

Example::

    COMFY_MEMX_REAL_COMFYUI=/tmp/ct/v0.3.64:/tmp/ct/v0.27.0:/tmp/ct/v0.33.0 \\
    COMFY_MEMX_REAL_PYTHON=/work/comfy-venv/bin/python python -m pytest -q tests/real/test_real_comfyui.py

Three servers per tree, each booted once and shared by the tests of this module (a session runs all its steps at
its first use, stops the server, and the tests read what it recorded); every step marks where it starts and ends in
the server log and in comfy_memx's event log (``drive.Session``):

``report``  ``COMFY_MEMX=1`` (env launcher), leak mode report: tiny-model prompts, the leaking pack, ComfyUI's own
            ``POST /free``.
``strict``  ``python -m comfy_memx`` (launcher), leak mode strict, ``COMFY_MEMX_LEAK_FAIL=1``: the leaking pack
            seen in several prompts, ``/memx/free`` with the leak alive and after the pack let go, then
            ``/memx/free`` under concurrency (two at once, against ComfyUI's ``/free``, giving up).
``t2i``     the launcher, leak mode report, the random-weight checkpoint: ComfyUI's default text-to-image workflow,
            ``/memx/free``, then the workflow with an unloading node of ``memx_unload_nodes`` after ``VAEDecode``
            (the unloading packs) and a weight probe around it.

All servers run with ``--cpu``. What that means for "bytes moved" is asserted, not assumed: the probe node reads
where the UNet's weights live and ComfyUI's own accounting (see ``test_cpu_unload_and_reload_move_no_weights``).
Server logs, event logs and ``steps.json`` stay under pytest's temporary folder (paths in failure messages).
"""

import gc
import json
import os
import re
import subprocess
import sys
import time
import types
import weakref
from pathlib import Path

import pytest

from bench.harness import drive, pack_source, waits
from memx_helpers import load_module

REAL_COMFY_DIR = Path(__file__).parents[1] / "real_comfy"
TREES_ENV = "COMFY_MEMX_REAL_COMFYUI"
PYTHON_ENV = "COMFY_MEMX_REAL_PYTHON"
CHECKPOINT_ENV = "COMFY_MEMX_REAL_CHECKPOINT"
SMALL_CHECKPOINT_ENV = "COMFY_MEMX_REAL_SMALL_CHECKPOINT"
UNLOAD_PACK = "memx_unload_nodes"
PATCHER_PACK = str(REAL_COMFY_DIR / "memx_multigpu_like")
TEST_PACK = "memx_test_nodes"
PANEL_SCRIPT = "memx_panel.js"


node_pack = load_module("memx_real_comfy_nodes", Path(pack_source(TEST_PACK)) / "__init__.py")
unload_pack = load_module("memx_real_comfy_unload_nodes", Path(pack_source(UNLOAD_PACK)) / "__init__.py")
ALL_NODES = {**node_pack.NODE_CLASS_MAPPINGS, **unload_pack.NODE_CLASS_MAPPINGS}


def configured_trees():
    """The ComfyUI trees named by COMFY_MEMX_REAL_COMFYUI (empty list when unset)."""
    return [path for path in os.environ.get(TREES_ENV, "").split(os.pathsep) if path]


def configured_python():
    """The interpreter named by COMFY_MEMX_REAL_PYTHON, or None."""
    return os.environ.get(PYTHON_ENV) or None


def checkpoint_path(env=CHECKPOINT_ENV, name=drive.CHECKPOINT_NAME):
    """Where a random-weight checkpoint is (or is to be built): the file ``env`` names (COMFY_MEMX_REAL_CHECKPOINT
    for SD1.5) or ``name`` in the cache."""
    named = os.environ.get(env)
    if named:
        return os.path.abspath(named)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "comfy_memx-real", name)


def small_checkpoint_path():
    """Where the small random-weight checkpoint is (or is to be built): COMFY_MEMX_REAL_SMALL_CHECKPOINT or the
    cache."""
    return checkpoint_path(SMALL_CHECKPOINT_ENV, drive.SMALL_CHECKPOINT_NAME)


# ---------------------------------------------------------------------------------------------------------------
# Prompts of the sessions (also checked offline against the node packs below)
# ---------------------------------------------------------------------------------------------------------------

def tiny_prompt(name, seed):
    """Loader -> sampler on a tiny model; the same ``name`` gives the same model (ComfyUI's cache keeps it)."""
    return {"1": drive.loader_node(name), "2": drive.sampler_node("1", seed)}


def sleep_prompt(seconds, token):
    """A prompt that keeps ComfyUI's worker busy for ``seconds`` (a new ``token`` defeats ComfyUI's cache)."""
    return {"1": {"class_type": "MemxSleep", "inputs": {"seconds": seconds, "token": token}}}


def busy_prompt(name, seed, seconds, token):
    """``tiny_prompt(name, seed)`` plus a sleep: with the tiny prompt run just before, ComfyUI takes the loader and
    the sampler from its cache (which keeps the model alive and loaded) and only sleeps. Without them ComfyUI's
    cache would let go of the model as soon as a prompt that does not use it starts."""
    prompt = tiny_prompt(name, seed)
    prompt["3"] = sleep_prompt(seconds, token)["1"]
    return prompt


def release_prompt(token):
    """A prompt in which the leaking pack lets go of every module it keeps."""
    return {"1": {"class_type": "MemxReleaseCache", "inputs": {"token": token}}}


UNLOADER_NODE = "11"
# The unloading node of each prompt of the t2i session's issue-13 part, in order. The reload in prompt k+1 is
# charged to the node of prompt k; prompts 1-3 reload, so the thrash warning (3 prompts) comes in prompt 3.
UNLOAD_CHAIN = ("MemxUnloadAllModels", "MemxFreeAllMemory", "MemxUnloadAllModels", "MemxDropLoadedModels",
                "MemxUnloadAllModels")


def unloading_workflow(seed, unloader):
    """The default workflow with ``probe -> unloader -> probe`` between VAEDecode and SaveImage.

    The probes (nodes 10 and 12) report where the UNet's weights are and ComfyUI's accounting of them just before
    and just after the unloading node (11).
    """
    workflow = drive.default_workflow(seed)
    workflow["10"] = {"class_type": "MemxWeightProbe", "inputs": {"value": ["8", 0], "model": ["4", 0],
                                                                  "label": "before"}}
    workflow[UNLOADER_NODE] = {"class_type": unloader, "inputs": {"value": ["10", 0]}}
    workflow["12"] = {"class_type": "MemxWeightProbe", "inputs": {"value": [UNLOADER_NODE, 0], "model": ["4", 0],
                                                                  "label": "after"}}
    workflow["9"]["inputs"]["images"] = ["12", 0]
    return workflow


# ---------------------------------------------------------------------------------------------------------------
# Offline checks of the harness (always run, no ComfyUI needed)
# ---------------------------------------------------------------------------------------------------------------

def offline_prompts():
    prompts = {f"{scenario}/{step['name']}": step["prompt"] for scenario in drive.SCENARIOS
               for step in drive.scenario_steps(scenario) if step["kind"] == "prompt"}
    prompts.update({"tiny": tiny_prompt("x", 1), "busy": busy_prompt("x", 1, 1.0, "t"),
                    "release": release_prompt("r")})
    prompts.update({f"unload/{name}": unloading_workflow(3, name) for name in set(UNLOAD_CHAIN)})
    return prompts


CORE_NODES = {"CheckpointLoaderSimple", "CLIPTextEncode", "EmptyLatentImage", "KSampler", "VAEDecode", "SaveImage"}


@pytest.mark.parametrize("name,prompt", sorted(offline_prompts().items()))
def test_session_prompts_only_use_declared_inputs(name, prompt):
    for node_id, node in prompt.items():
        if node["class_type"] in CORE_NODES:
            continue
        node_class = ALL_NODES[node["class_type"]]
        declared = node_class.INPUT_TYPES()["required"]
        assert set(node["inputs"]) == set(declared), (name, node_id)
        for input_name, value in node["inputs"].items():
            if isinstance(value, list):
                source_id, output_index = value
                source = prompt[source_id]["class_type"]
                if source in CORE_NODES:
                    continue
                received = ALL_NODES[source].RETURN_TYPES[output_index]
                assert not received != declared[input_name][0], (name, node_id, input_name)
    assert any(getattr(ALL_NODES.get(n["class_type"]), "OUTPUT_NODE", n["class_type"] == "SaveImage")
               for n in prompt.values()), f"{name} has no output node, ComfyUI would reject it"


def test_unloading_workflow_puts_the_unloader_between_vae_decode_and_save_image():
    workflow = unloading_workflow(7, "MemxFreeAllMemory")
    assert workflow["3"]["inputs"]["seed"] == 7
    assert workflow["10"]["inputs"]["value"] == ["8", 0]
    assert workflow[UNLOADER_NODE] == {"class_type": "MemxFreeAllMemory", "inputs": {"value": ["10", 0]}}
    assert workflow["9"]["inputs"]["images"] == ["12", 0]
    assert drive.default_workflow()["9"]["inputs"]["images"] == ["8", 0]  # the file itself is unchanged


def test_any_type_passes_comfyuis_type_comparison_both_ways():
    # ComfyUI's validate_node_input returns early when `not received_type != input_type`.
    for other in ("IMAGE", "MODEL", "*"):
        assert not other != unload_pack.ANY
        assert not unload_pack.ANY != other
        assert not node_pack.ANY != other


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
    assert (target / "__init__.py").read_bytes() == (Path(pack_source(TEST_PACK)) / "__init__.py").read_bytes()
    assert not list(target.rglob("*.pyc"))
    with pytest.raises(FileNotFoundError):
        drive.install_node_pack(str(tmp_path / "not_a_tree"))


def test_base_directory_holds_packs_checkpoint_and_database(tmp_path):
    tree = tmp_path / "tree"
    (tree / "comfy").mkdir(parents=True)
    (tree / "comfy" / "cli_args.py").write_text('parser.add_argument("--database-url", type=str)\n')
    checkpoint = tmp_path / "weights.safetensors"
    checkpoint.write_bytes(b"x")
    base = tmp_path / "base"
    drive.prepare_base_dir(str(base), (TEST_PACK, UNLOAD_PACK), str(checkpoint))
    for name in ("custom_nodes", "input", "output", "temp", "user", "models/checkpoints"):
        assert (base / name).is_dir(), name
    assert (base / "custom_nodes" / UNLOAD_PACK / "__init__.py").is_file()
    assert not list((base / "custom_nodes").rglob("*.pyc"))
    link = base / "models" / "checkpoints" / drive.CHECKPOINT_NAME
    assert link.resolve() == checkpoint.resolve()
    assert drive.base_dir_args(str(tree), str(base)) == [
        "--base-directory", str(base), "--database-url", f"sqlite:///{base}/user/comfyui.db"]
    (tree / "comfy" / "cli_args.py").write_text("# an old tree without the flag\n")
    assert drive.base_dir_args(str(tree), str(base)) == ["--base-directory", str(base)]


def test_existing_checkpoint_is_used_as_is(tmp_path):
    existing = tmp_path / "memx.safetensors"
    existing.write_bytes(b"weights")
    assert drive.ensure_checkpoint("no-such-python", "no-such-tree", str(existing)) == str(existing)


def test_checkpoint_build_failure_leaves_no_partial_file(tmp_path):
    target = tmp_path / "cache" / "memx.safetensors"
    with pytest.raises(RuntimeError, match="make_checkpoint.py failed"):
        drive.ensure_checkpoint(sys.executable, str(tmp_path / "not_a_tree"), str(target), timeout=120)
    assert not target.exists() and not list(target.parent.iterdir())


def test_in_parallel_returns_results_and_exceptions_in_order():
    def boom():
        raise RuntimeError("x")

    first, second, third = drive.in_parallel(lambda: 1, boom, lambda: "c")
    assert first == 1 and isinstance(second, RuntimeError) and third == "c"


def test_session_marks_split_the_logs_by_step(tmp_path):
    session = drive.Session("/t", "PY", str(tmp_path / "run"), launcher="module", packs=())
    assert session.events_path and session.argv[:4] == ["PY", "-m", "comfy_memx", "/t/main.py"]
    assert session.extra_env["COMFY_MEMX_EVENTS"] == session.events_path
    Path(session.log_path).write_text("boot\n")
    Path(session.events_path).write_text('{"event": "load"}\n')
    before = session.mark()
    with open(session.log_path, "a") as log, open(session.events_path, "a") as events:
        log.write("during\n")
        events.write('{"event": "unload"}\n{"event": "lo')  # the last line is not complete yet
    session._record({"name": "one", "kind": "note"}, before)
    assert session.step_log("one") == "during\n"
    assert session.step_events("one") == [{"event": "unload"}]
    assert session.events_after("one") == []
    assert session.events() == [{"event": "load"}, {"event": "unload"}]
    with pytest.raises(KeyError):
        session.step("two")
    assert drive.Session("/t", "PY", str(tmp_path / "plain"), launcher="plain", packs=()).events_path is None


@pytest.fixture
def stub_model_management(monkeypatch):
    """A stand-in ``comfy.model_management`` that records load_models_gpu calls (the real one needs ComfyUI)."""
    loads = []
    management = types.ModuleType("comfy.model_management")
    management.load_models_gpu = lambda models: loads.append(list(models))
    management.current_loaded_models = []
    management.unloaded = []
    management.unload_all_models = lambda: management.unloaded.append("all")
    management.free_memory = lambda memory, device: management.unloaded.append((memory, device))
    management.get_torch_device = lambda: "cpu"
    comfy = types.ModuleType("comfy")
    comfy.model_management = management
    monkeypatch.setitem(sys.modules, "comfy", comfy)
    monkeypatch.setitem(sys.modules, "comfy.model_management", management)
    return loads


class FakePatcher:
    """The ModelPatcher attributes the test nodes use."""

    def __init__(self, model, load_device):
        self.model = model
        self.load_device = load_device

    def loaded_size(self):
        return 7

    def model_size(self):
        return 9


class FakeEntry:
    def __init__(self, patcher):
        self.model = patcher


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
        released = node_pack.MemxReleaseCache().release("r")
        assert released["ui"]["memx_release"][0]["released"] == ["k"]
        gc.collect()
        assert module_ref() is None
    finally:
        node_pack.MemxLeakyCache._cache.clear()


def test_unloading_nodes_call_comfyui_the_way_third_party_packs_do(stub_model_management):
    mm = sys.modules["comfy.model_management"]
    assert unload_pack.MemxUnloadAllModels().run("v")["result"] == ("v",)
    assert unload_pack.MemxFreeAllMemory().run("v")["result"] == ("v",)
    assert mm.unloaded == ["all", (1e30, "cpu")]
    mm.current_loaded_models.extend([FakeEntry(FakePatcher(object(), "cpu")), FakeEntry(FakePatcher(3, "cpu"))])
    dropped = unload_pack.MemxDropLoadedModels().run("v")
    assert mm.current_loaded_models == []
    assert dropped["ui"]["memx_unload"][0] == {"node": "MemxDropLoadedModels", "before": ["object", "int"],
                                               "after": []}


def test_weight_probe_reports_storage_and_comfyui_accounting(stub_model_management):
    torch = pytest.importorskip("torch")
    module = node_pack.tiny_net_class()(8, 2)
    patcher = FakePatcher(module, torch.device("cpu"))
    sys.modules["comfy.model_management"].current_loaded_models.append(FakeEntry(patcher))
    out = node_pack.MemxWeightProbe().probe("image", patcher, "before")
    facts = out["ui"]["memx_probe"][0]
    assert out["result"] == ("image",)
    assert facts["label"] == "before" and facts["in_loaded_list"] is True
    assert (facts["loaded_size"], facts["model_size"]) == (7, 9)
    assert facts["weights"][0] == {"name": "layers.0.weight", "device": "cpu", "dtype": "torch.float32",
                                   "data_ptr": module.layers[0].weight.data_ptr(), "bytes": 8 * 8 * 4}


def test_tiny_model_weights_depend_only_on_the_loader_name():
    torch = pytest.importorskip("torch")
    net = node_pack.tiny_net_class()

    def weights(name):
        torch.manual_seed(node_pack.seed_from_text(name))
        return net(8, 2).layers[0].weight

    assert torch.equal(weights("a"), weights("a"))
    assert not torch.equal(weights("a"), weights("b"))
    assert node_pack.seed_from_text("a") == node_pack.seed_from_text("a") != node_pack.seed_from_text("b")


STARTUP_LINE = ("comfy_memx 0.3.0 active (launcher, leak mode strict, release off): patched load_models_gpu, "
                "LoadedModel.model_load, "
                "execution.get_output_data, comfy.utils.load_torch_file; skipped unload_model_and_clones, pin_memory "
                "(absent in this ComfyUI); comfy.pinned_memory.pin_memory (comfy.pinned_memory not imported)")


def test_startup_line_is_split_into_patched_and_skipped_sites():
    patched, skipped = split_startup_line(STARTUP_LINE)
    assert patched == ["load_models_gpu", "LoadedModel.model_load", "execution.get_output_data",
                       "comfy.utils.load_torch_file"]
    assert skipped == ["unload_model_and_clones", "pin_memory", "comfy.pinned_memory.pin_memory"]


def test_sites_are_looked_up_in_the_tree_source(tmp_path):
    (tmp_path / "comfy").mkdir()
    (tmp_path / "comfy" / "model_management.py").write_text(
        "class LoadedModel:\n    def model_load(self):\n        pass\n\ndef free_memory(a, b):\n    pass\n"
        "class Other:\n    def model_unload(self):\n        pass\n")
    (tmp_path / "execution.py").write_text("class PromptExecutor:\n    async def execute_async(self):\n        pass\n")
    assert site_in_tree(str(tmp_path), "free_memory") is True
    assert site_in_tree(str(tmp_path), "LoadedModel.model_load") is True
    assert site_in_tree(str(tmp_path), "LoadedModel.model_unload") is False
    assert site_in_tree(str(tmp_path), "unload_all_models") is False
    assert site_in_tree(str(tmp_path), "execution.PromptExecutor.execute_async") is True
    assert site_in_tree(str(tmp_path), "comfy.pinned_memory.pin_memory") is False
    assert site_in_tree(str(tmp_path), "nowhere.thing") is None


# ---------------------------------------------------------------------------------------------------------------
# Helpers for the real-server tests
# ---------------------------------------------------------------------------------------------------------------

def split_startup_line(line):
    """``(patched, skipped)`` site names of comfy_memx's startup line."""
    rest = line.split(": patched ", 1)[1]
    chunks = rest.split("; ")
    patched = [name.strip() for name in chunks[0].split(",") if name.strip()]
    skipped = []
    for chunk in chunks[1:]:
        chunk = re.sub(r"\s*\([^)]*\)\s*$", "", chunk)
        chunk = chunk[len("skipped "):] if chunk.startswith("skipped ") else chunk
        skipped += [name.strip() for name in chunk.split(",") if name.strip()]
    return patched, skipped


SITE_FILES = (("comfy.pinned_memory.", "comfy/pinned_memory.py"), ("comfy.utils.", "comfy/utils.py"),
              ("comfy.model_patcher.", "comfy/model_patcher.py"), ("execution.", "execution.py"),
              ("server.", "server.py"))


def site_in_tree(tree, site):
    """Whether the function or method a startup-line site names is defined in the tree's source (read as text,
    independently of comfy_memx's own detection); None for a name this helper cannot place."""
    path, name = "comfy/model_management.py", site
    for prefix, file in SITE_FILES:
        if site.startswith(prefix):
            path, name = file, site[len(prefix):]
            break
    else:
        if site.count(".") > 1 or (site.count(".") == 1 and not site[0].isupper()):
            return None
    source_path = os.path.join(tree, path)
    if not os.path.exists(source_path):
        return False
    source = Path(source_path).read_text(encoding="utf-8", errors="replace")
    if "." not in name:
        return re.search(rf"^(async )?def {re.escape(name)}\(", source, re.M) is not None
    cls, method = name.split(".", 1)
    match = re.search(rf"^class {re.escape(cls)}\b.*?(?=^\S)", source + "\n#end", re.M | re.S)
    return match is not None and re.search(rf"^\s+(async )?def {re.escape(method)}\(", match.group(0), re.M) is not None


def memx_lines(text):
    """comfy_memx's own lines of a piece of server log, ANSI colours removed."""
    return drive.lines_containing(text, "comfy_memx")


def unloads_of(events, reason=None):
    return [e for e in events if e.get("event") == "unload" and (reason is None or e.get("reason") == reason)]


def by_model(events):
    """``{model: [event, ...]}`` of the load/unload events given."""
    grouped = {}
    for event in events:
        grouped.setdefault(event.get("model"), []).append(event)
    return grouped


def tree_version(tree):
    """``__version__`` from the tree's comfyui_version.py (what /system_stats should say)."""
    text = Path(tree, "comfyui_version.py").read_text()
    return re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text).group(1)


# ---------------------------------------------------------------------------------------------------------------
# The sessions (each runs once per tree; see the module docstring)
# ---------------------------------------------------------------------------------------------------------------

def fetch_panel_script(session):
    """``GET /extensions`` (the scripts ComfyUI's frontend imports) and the panel's script as listed there: how the
    panel reaches the browser on this tree (the browser tests render it on the newest tree)."""
    listing = session.call("extensions", "GET", "/extensions")["body"]
    listed = [url for url in listing if url.endswith("/" + PANEL_SCRIPT)] if isinstance(listing, list) else []
    session.call("panel_script", "GET", listed[0] if listed else f"/extensions/comfy_memx/{PANEL_SCRIPT}")


def run_report_session(session):
    session.prompt("first", tiny_prompt("memx-basic", 1))
    session.prompt("reseeded", tiny_prompt("memx-basic", 2))
    for step in drive.scenario_steps("leak"):
        if step["kind"] == "prompt":
            session.prompt(step["name"], step["prompt"])
    session.comfy_free("comfy_free")
    session.prompt("after_comfy_free", tiny_prompt("memx-basic", 3))
    fetch_panel_script(session)


def run_strict_session(session):
    for step in drive.scenario_steps("leak"):
        if step["kind"] == "prompt":
            session.prompt(step["name"], step["prompt"])
    leak_b = drive.scenario_steps("leak")[1]["prompt"]["1"]["inputs"]["name"]
    session.prompt("seen_1", tiny_prompt(leak_b, 3))
    session.prompt("seen_2", tiny_prompt(leak_b, 4))
    session.call("models_after_leak", "GET", "/memx/models")
    session.memx_free("free_with_leak")
    session.prompt("release", release_prompt("r1"))
    session.memx_free("free_released")
    session.call("models_after_release", "GET", "/memx/models")

    # Two /memx/free while a prompt runs: the worker reads both requests' flags in one turn after it.
    session.prompt("load_1", tiny_prompt("memx-conc-1", 10))
    busy = session.submit("busy_1", busy_prompt("memx-conc-1", 10, 2.5, "s1"))
    running = session.wait_running(busy["prompt_id"])
    session.parallel("two_frees", lambda: session.memx_free("a", record=False),
                     lambda: session.memx_free("b", record=False))
    session.finish(busy)["running_when_freed"] = running
    session.prompt("after_two_1", tiny_prompt("memx-conc-2", 11))
    session.prompt("after_two_2", tiny_prompt("memx-conc-2", 12))

    # ComfyUI's own /free from another client at the same moment as ours.
    busy = session.submit("busy_2", busy_prompt("memx-conc-2", 12, 2.5, "s2"))
    running = session.wait_running(busy["prompt_id"])
    session.parallel("race", lambda: session.memx_free("ours", record=False),
                     lambda: session.comfy_free("theirs", {"unload_models": True}, record=False))
    session.finish(busy)["running_when_freed"] = running
    session.prompt("after_race_1", tiny_prompt("memx-conc-3", 13))
    session.prompt("after_race_2", tiny_prompt("memx-conc-3", 14))

    # A /memx/free that gives up before the worker reads its flags withdraws them: the model stays loaded.
    busy = session.submit("busy_3", busy_prompt("memx-conc-3", 14, 3.0, "s3"))
    running = session.wait_running(busy["prompt_id"])
    session.memx_free("give_up", timeout=0.5)
    session.finish(busy)["running_when_freed"] = running
    session.prompt("after_give_up_1", tiny_prompt("memx-conc-3", 15))
    session.prompt("after_give_up_2", tiny_prompt("memx-conc-3", 16))

    # ... but not another client's flag set while it waited: that client's unload happens after the prompt.
    busy = session.submit("busy_4", busy_prompt("memx-conc-3", 16, 3.0, "s4"))
    running = session.wait_running(busy["prompt_id"])

    def theirs_later():
        time.sleep(0.3)
        return session.comfy_free("theirs", {"unload_models": True}, record=False)

    session.parallel("give_up_other", lambda: session.memx_free("ours", timeout=1.0, record=False), theirs_later)
    session.finish(busy)["running_when_freed"] = running
    session.prompt("after_other_1", tiny_prompt("memx-conc-3", 17))
    session.prompt("after_other_2", tiny_prompt("memx-conc-3", 18))
    fetch_panel_script(session)


def run_t2i_session(session):
    session.prompt("t2i_1", drive.default_workflow(0))
    session.prompt("t2i_2", drive.default_workflow(1))
    session.call("models_t2i", "GET", "/memx/models")
    session.memx_free("free_t2i")
    session.call("models_after_free", "GET", "/memx/models")
    for index, unloader in enumerate(UNLOAD_CHAIN):
        session.prompt(f"unload_{index}", unloading_workflow(100 + index, unloader))
    session.call("models_after_unloads", "GET", "/memx/models")


SESSIONS = {
    "report": {"launcher": "env", "env": {}, "packs": (TEST_PACK,), "run": run_report_session},
    "strict": {"launcher": "module", "env": {"COMFY_MEMX_LEAK_MODE": "strict", "COMFY_MEMX_LEAK_FAIL": "1"},
               "packs": (TEST_PACK,), "run": run_strict_session},
    # with a pack that wraps comfy.sample.sample as ComfyUI-MultiGPU does: KSampler's load stays core's
    "t2i": {"launcher": "module", "env": {}, "packs": (TEST_PACK, UNLOAD_PACK, PATCHER_PACK), "run": run_t2i_session,
            "checkpoint": True},
}


# Which real trees a test runs on (docs/development.md, "Real ComfyUI trees and CI", has the table per test file).
# ``real_trees``: every tree, for what differs between them: the patch sites (0.3.64 has no comfy/pinned_memory.py,
# no unload_model_and_clones), the pin code (none in 0.3.64, per subset in 0.33.0), ComfyUI's own behaviour a test
# depends on (free_memory's signature and loop, unload_all_models, the output caches and what holds a model, the
# prompt worker's free flags, the server's middlewares).  ``oldest_and_newest_trees``: for a check of ComfyUI's
# load/unload/free path alone, which on CPU is the same in 0.27.0 as in 0.33.0 (they differ in the dynamic-VRAM pin
# tiers, which need CUDA, in debug logging and in the pinned-memory cap); 0.3.64's differs.  ``newest_tree_only``: for
# a check whose tree-dependent part another test makes on every tree (the SD1.5 sessions, the browser, the fleet
# end-to-end test, Inspire-Pack), so that the older trees would only repeat comfy_memx's own code.
def version_key(tree):
    """``tree``'s ComfyUI version as a tuple of ints, for ordering; () when the tree has no readable version."""
    try:
        return tuple(int(part) for part in re.findall(r"\d+", tree_version(tree)))
    except (OSError, AttributeError):
        return ()


def _tree_params(trees):
    return [pytest.param(tree, id=os.path.basename(os.path.normpath(tree))) for tree in trees] or [
        pytest.param("<unset>", id="no-tree")]


def _by_version():
    trees = configured_trees()
    return sorted(trees, key=lambda tree: (version_key(tree), trees.index(tree)))


real_trees = _tree_params(configured_trees())
newest_tree_only = _tree_params(_by_version()[-1:])
oldest_and_newest_trees = _tree_params(list(dict.fromkeys(_by_version()[:1] + _by_version()[-1:])))
# the sessions' trees: the SD1.5 session checks ComfyUI's load/unload/free path (see above)
SESSION_TREES = {"report": real_trees, "strict": real_trees, "t2i": oldest_and_newest_trees}
session_cases = [pytest.param(tree.values[0], name, id=f"{tree.id}-{name}")
                 for tree in real_trees for name in sorted(SESSIONS) if tree in SESSION_TREES[name]]
needs_real_comfyui = pytest.mark.skipif(
    not (configured_trees() and configured_python()),
    reason=f"set {TREES_ENV} (ComfyUI trees, os.pathsep-separated) and {PYTHON_ENV} (their interpreter) "
           "to run against real ComfyUI")


@pytest.fixture(scope="module")
def memx_importable_by_real_python(tmp_path_factory):
    """True when the real interpreter runs ``-m comfy_memx --version`` from outside the repository (installed)."""
    python = configured_python()
    if not python:
        return False
    probe = subprocess.run([python, "-m", "comfy_memx", "--version"], capture_output=True, timeout=60,
                           cwd=tmp_path_factory.mktemp("memx-probe"), env=drive.inherited_env())
    return probe.returncode == 0


def checkpoint_builder(path, **kind):
    """A callable ``get(tree)`` that builds the checkpoint at ``path`` (make_checkpoint.py with ``kind``) on first
    use and raises the first build's error again rather than building once per test."""
    built = {}

    def get(tree):
        if "path" not in built and "error" not in built:
            try:
                built["path"] = drive.ensure_checkpoint(configured_python(), tree, path, **kind)
            except Exception as error:
                built["error"] = f"building {path} failed: {type(error).__name__}: {error}"
        if "error" in built:
            raise RuntimeError(built["error"])
        return built["path"]

    return get


@pytest.fixture(scope="module")
def real_checkpoint():
    """The random-weight SD1.5 checkpoint, built on first use (see the module docstring): ``get(tree)``."""
    return checkpoint_builder(checkpoint_path())


@pytest.fixture(scope="session")
def small_checkpoint():
    """The small random-weight checkpoint of ``make_checkpoint.py --arch small`` (a one-level UNet of the SD1.5
    family, CLIP-L and TAESD: 265 MiB, about 20 s to build, about 300 MiB per model ComfyUI holds on CPU against
    SD1.5's 3.3 GiB), built once on first use at COMFY_MEMX_REAL_SMALL_CHECKPOINT or in the cache: ``get(tree)``.
    Every tree detects it as SD1.5, so the default workflow (``drive.CHECKPOINT_NAME`` in a base folder) runs on it
    unchanged; use it where a test needs ComfyUI's own checkpoint loader but not SD1.5's size."""
    return checkpoint_builder(small_checkpoint_path(), arch="small")


class FailedSession:
    """Stands for a session that could not even be set up (its error is what the tests report)."""

    def __init__(self, error, out):
        self.error = error
        self.log_path = os.path.join(out, "server.log")


@pytest.fixture(scope="module")
def real_session(tmp_path_factory, memx_importable_by_real_python, real_checkpoint):
    """``real_session(tree, name)`` -> the stopped :class:`drive.Session` of SESSIONS[name] on ``tree``; each runs
    once per module. A session whose set-up or steps raised keeps the error in ``session.error``."""
    done = {}

    def get(tree, name):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps -e .)")
        key = (tree, name)
        if key not in done:
            spec = SESSIONS[name]
            out = str(tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-{name}"))
            try:
                checkpoint = real_checkpoint(tree) if spec.get("checkpoint") else None
                session = drive.Session(tree, configured_python(), out, launcher=spec["launcher"], env=spec["env"],
                                        packs=spec["packs"], checkpoint=checkpoint)
            except Exception as error:
                done[key] = FailedSession(f"{type(error).__name__}: {error}", out)
                return done[key]
            done[key] = run_session(session, spec["run"])
        return done[key]

    return get


def run_session(session, run):
    """Start ``session``, ``run(session)``, stop it; returns it with ``error`` set when a step or the boot failed."""
    session.error = None
    try:
        if not session.start():
            session.error = "server did not answer /system_stats" + ("" if session.alive() else " (exited)")
        else:
            run(session)
    except Exception as error:  # kept for the tests to report; the server is stopped below
        session.error = f"{type(error).__name__}: {error}"
    finally:
        session.stop()
    return session


def ready(session):
    """Fail with where the logs are when the session did not run all its steps."""
    assert session.error is None, f"{session.error}; log {session.log_path}"
    return session


def where(session):
    return f"log {session.log_path}, events {session.events_path}"


def assert_prompts_ok(session, *names):
    for name in names:
        step = session.step(name)
        assert step["ok"], (name, step.get("error"), step.get("error_messages"), where(session))


# ---------------------------------------------------------------------------------------------------------------
# Every session: it booted, comfy_memx announced the sites of this tree, nothing failed, it stopped cleanly
# ---------------------------------------------------------------------------------------------------------------

@needs_real_comfyui
@pytest.mark.parametrize("tree,name", session_cases)
def test_session_ran_and_stopped_on_sigint(tree, name, real_session):
    session = ready(real_session(tree, name))
    assert session.comfyui_version == tree_version(tree), where(session)
    assert all(step.get("ok", True) for step in session.steps if step["kind"] == "prompt"), [
        (step["name"], step.get("error_messages")) for step in session.steps if not step.get("ok", True)]
    assert session.stop_method == "SIGINT", where(session)
    # --leak-fail makes the launcher exit 3 at shutdown when a rooted leak was found (the strict session's pack)
    assert session.exit_code == (3 if name == "strict" else 0), where(session)


@needs_real_comfyui
@pytest.mark.parametrize("tree,name", session_cases)
def test_startup_line_patches_every_site_the_tree_defines(tree, name, real_session):
    session = ready(real_session(tree, name))
    log = session.log_text()
    source = "launcher" if session.launcher == "module" else "env"
    mode = session.extra_env.get("COMFY_MEMX_LEAK_MODE", "report")
    lines = [line for line in memx_lines(log) if " active (" in line]
    assert len(lines) == 1 and f"active ({source}, leak mode {mode}, release off): patched" in lines[0], (
        lines, where(session))
    assert "Torch already imported" not in log
    patched, skipped = split_startup_line(lines[0])
    assert "load_models_gpu" in patched and "server.PromptServer.add_routes" in patched
    wrong = {site: ("patched" if site in patched else "skipped", site_in_tree(tree, site))
             for site in patched + skipped
             if site_in_tree(tree, site) is not None and site_in_tree(tree, site) != (site in patched)}
    assert not wrong, f"site patched although absent, or skipped although defined in {tree}: {wrong}"


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
@pytest.mark.parametrize("name", ["report", "strict"])
def test_comfyui_lists_the_panel_script_once_and_serves_it(tree, name, real_session):
    """COMFY_MEMX=1 (report) and the launcher (strict) add the panel's folder to ComfyUI's extension folders: this
    tree's ``GET /extensions`` lists the script once and serves comfy_memx's file."""
    from comfy_memx.surface.panel import WEB_DIR
    session = ready(real_session(tree, name))
    listing = session.step("extensions")
    assert listing["http_status"] == 200, (listing, where(session))
    assert [url for url in listing["body"] if url.endswith("/" + PANEL_SCRIPT)] == [
        f"/extensions/comfy_memx/{PANEL_SCRIPT}"], (listing["body"], where(session))
    script = session.step("panel_script")
    assert script["http_status"] == 200, (script, where(session))
    assert script["body"] == Path(WEB_DIR, PANEL_SCRIPT).read_text(encoding="utf-8"), where(session)


DOCTOR_PREFIX = {"model_management": "", "pinned_memory": "", "dynamic_pins": "comfy.pinned_memory.",
                 "execution": "execution.", "loader": "comfy.utils.", "model_patcher": "comfy.model_patcher.",
                 "server": "server."}


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_doctor_predicts_the_sites_the_running_server_patched(tree, real_session, tmp_path):
    # `doctor --comfyui` reads the tree's source without starting it; the server's startup line is what was patched.
    session = ready(real_session(tree, "report"))
    (line,) = [line for line in memx_lines(session.log_text()) if " active (" in line]
    patched, _ = split_startup_line(line)
    result = subprocess.run([configured_python(), "-m", "comfy_memx", "doctor", "--json", "--comfyui", tree],
                            capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=drive.inherited_env())
    assert result.returncode == 0, result.stderr[-3000:]
    sites = json.loads(result.stdout)["comfyui"]["sites"]
    predicted = {site["site"] if site["site"].startswith(DOCTOR_PREFIX[site["patch"]])
                 else DOCTOR_PREFIX[site["patch"]] + site["site"]  # older doctors named sites without their module
                 for site in sites if site["state"] == "would patch"}
    assert predicted == set(patched), (sorted(predicted - set(patched)), sorted(set(patched) - predicted))


@needs_real_comfyui
@pytest.mark.parametrize("tree,name", session_cases)
def test_no_traceback_no_internal_error_and_a_valid_event_log(tree, name, real_session):
    session = ready(real_session(tree, name))
    log = drive.strip_ansi(session.log_text())
    assert session.failure_tracebacks() == [], where(session)
    assert "comfy_memx: internal error" not in log, where(session)
    events = session.events()  # raises on a line that is not JSON
    assert events and all({"event", "time", "pid"} <= set(event) for event in events)


# ---------------------------------------------------------------------------------------------------------------
# report session: COMFY_MEMX=1, leak mode report
# ---------------------------------------------------------------------------------------------------------------

@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_tiny_prompts_run_and_reuse_comfyuis_cache(tree, real_session):
    session = ready(real_session(tree, "report"))
    assert_prompts_ok(session, "first", "reseeded")
    outputs = [session.step(name)["outputs"]["2"]["memx_sample"][0] for name in ("first", "reseeded")]
    assert [output["seed"] for output in outputs] == [1, 2]
    assert outputs[0]["checksum"] != outputs[1]["checksum"]
    first = session.step_events("first", "load")
    assert [(e["model"], e["owner"]["class_type"], e["owner"]["package"]) for e in first] == [
        ("MemxTinyNet", "MemxTinySampler", TEST_PACK)]
    assert session.step_events("reseeded", "load") == []  # same model, already resident: no bytes moved


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_nothing_is_reported_as_leaked_while_nothing_holds_a_model(tree, real_session):
    session = ready(real_session(tree, "report"))
    for name in ("first", "reseeded", "leaky"):
        log = session.step_log(name)
        assert drive.lines_containing(log, drive.LEAK_INFO_TEXT) == [], name
        assert drive.lines_containing(log, drive.LEAK_WARNING_TEXT) == [], name
        assert not [line for line in memx_lines(log) if "leaked model" in line], name
        assert session.step_events(name, "leak", "leak_seen") == [], name


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_report_mode_names_the_owner_after_comfyuis_leak_warning(tree, real_session):
    session = ready(real_session(tree, "report"))
    assert_prompts_ok(session, "leaky", "replace_loader")
    log = drive.strip_ansi(session.step_log("replace_loader")).splitlines()
    warnings = [i for i, line in enumerate(log) if drive.LEAK_WARNING_TEXT in line]
    assert warnings and log[warnings[0]].endswith(
        "WARNING, memory leak with model MemxTinyNet. Please make sure it is not being referenced from somewhere.")
    # The owner is the node whose load moved the bytes: MemxTinySampler (2) and MemxLeakyCache (3) both load the
    # model in the leaky prompt, in the order ComfyUI runs its two output nodes; the second load moves nothing.
    (load,) = session.step_events("leaky", "load")
    owner = load["owner"]
    assert (owner["node_id"], owner["class_type"]) in {("2", "MemxTinySampler"), ("3", "MemxLeakyCache")}, load
    following = log[warnings[0] + 1]
    # report mode names the holding package too (the forward probe: no heap search), then who loaded the model
    expected = (f"comfy_memx: leaked model MemxTinyNet ({load['model_id']}) is held by package {TEST_PACK} "
                f"({TEST_PACK}.MemxLeakyCache._cache['a']), loaded by node {owner['node_id']} "
                f"({owner['class_type']}), package {TEST_PACK}, prompt {session.step('leaky')['prompt_id']}")
    assert expected in following, log
    leaks = session.step_events("replace_loader", "leak")
    assert len(leaks) == 1 and leaks[0]["model_id"] == load["model_id"] and leaks[0]["stage"] == "rooted"
    assert leaks[0]["owner"] == owner and leaks[0]["holder_package"] == TEST_PACK
    assert [r["stage"] for r in leaks[0]["referrers"]] == ["probe"] and leaks[0]["search"]["scans"] == 0


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_comfyuis_own_free_is_charged_to_its_prompt_worker(tree, real_session):
    session = ready(real_session(tree, "report"))
    unloads = unloads_of(session.events_after("replace_loader"))
    assert unloads, where(session)
    assert {e["reason"] for e in unloads} == {"free_request"}
    for event in unloads:
        assert event["requested_by"]["kind"] == "comfyui" and event["requested_by"]["via"] == "prompt_worker", event


# ---------------------------------------------------------------------------------------------------------------
# strict session: the launcher, leak mode strict
# ---------------------------------------------------------------------------------------------------------------

HOLDER = f"{TEST_PACK}.MemxLeakyCache._cache['a']"


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_strict_mode_names_the_holder_chain(tree, real_session):
    session = ready(real_session(tree, "strict"))
    lines = memx_lines(session.step_log("replace_loader"))
    assert any(f"{HOLDER}  [package {TEST_PACK}, class_attribute]" in line for line in lines), lines
    leak = session.step_events("replace_loader", "leak")
    assert [r["path"] for r in leak[0]["referrers"]] == [HOLDER], leak
    assert leak[0]["search"]["complete"] is True
    [referrer] = leak[0]["referrers"]
    assert referrer["pattern"] == "class_cache" and "WeakValueDictionary" in referrer["suggestion"], referrer
    assert any(line.endswith("fix (class_cache): " + referrer["suggestion"]) for line in lines), lines


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_leaked_model_is_searched_once_and_later_sightings_are_counted(tree, real_session):
    session = ready(real_session(tree, "strict"))
    assert_prompts_ok(session, "leaky", "replace_loader", "seen_1", "seen_2")
    steps = ("replace_loader", "seen_1", "seen_2")
    for name in steps:  # ComfyUI warns in every one of these prompts ...
        assert drive.lines_containing(session.step_log(name), drive.LEAK_WARNING_TEXT), name
    leaks = [e for name in steps for e in session.step_events(name, "leak")]
    assert [(e["model_id"], e["sightings"]) for e in leaks] == [("MemxTinyNet#1", 1)], leaks  # ... one leak event
    seen = [(e["model_id"], e["sightings"], e["prompt_id"]) for name in steps[1:]
            for e in session.step_events(name, "leak_seen")]
    assert seen == [("MemxTinyNet#1", 2, session.step("seen_1")["prompt_id"]),
                    ("MemxTinyNet#1", 3, session.step("seen_2")["prompt_id"])]
    chains = [line for name in steps[1:] for line in memx_lines(session.step_log(name)) if HOLDER in line]
    assert chains == [], "the holder chain is logged with the first sighting only"


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_memx_models_shows_the_sightings_of_the_leak(tree, real_session):
    session = ready(real_session(tree, "strict"))
    answer = session.step("models_after_leak")
    assert answer["http_status"] == 200, answer
    rows = {row["model_id"]: row for row in answer["body"]}
    leaked = rows["MemxTinyNet#1"]
    assert leaked["state"] == "leaked" and leaked["owner"]["package"] == TEST_PACK
    assert leaked["leak"]["sightings"] == 3 and leaked["leak"]["searches"] == 1
    assert leaked["leak"]["prompt_id"] == session.step("replace_loader")["prompt_id"]
    assert leaked["leak"]["last_prompt"] == session.step("seen_2")["prompt_id"]
    assert [r["path"] for r in leaked["leak"]["referrers"]] == [HOLDER]


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_memx_free_names_the_holder_of_a_survivor_and_frees_it_once_released(tree, real_session):
    session = ready(real_session(tree, "strict"))
    receipt = session.step("free_with_leak")
    assert receipt["http_status"] == 200 and receipt["body"]["status"] == "done", receipt
    survivors = {s["model_id"]: s for s in receipt["body"]["survivors"]}
    assert set(survivors) == {"MemxTinyNet#1"}, survivors
    assert survivors["MemxTinyNet#1"]["reason"] == "leaked"
    assert [(h["path"], h["pattern"]) for h in survivors["MemxTinyNet#1"]["holders"]] == [(HOLDER, "class_cache")]
    assert_prompts_ok(session, "release")
    # Once the pack lets go, the module is gone at once (comfy_memx holds it by weakref only): the next receipt
    # has no survivor, and /memx/models no longer lists it.
    released = session.step("free_released")["body"]
    assert released["status"] == "done" and released["survivors"] == [], released
    assert "MemxTinyNet#1" not in {row["model_id"] for row in released["freed"] + released["still_loaded"]}
    models = session.step("models_after_release")["body"]
    assert "MemxTinyNet#1" not in {row["model_id"] for row in models}


def receipts_of(step):
    return [result["body"] for result in step["results"]]


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_two_memx_free_at_once_get_the_receipt_of_one_worker_run(tree, real_session):
    session = ready(real_session(tree, "strict"))
    step = session.step("two_frees")
    assert session.step("busy_1")["running_when_freed"], "the sleep prompt was not seen running"
    assert [result["http_status"] for result in step["results"]] == [200, 200], step
    first, second = receipts_of(step)
    for receipt in (first, second):
        assert receipt["status"] == "done" and receipt["worker"] == "done", receipt
        assert receipt["prompt_running_at_request"] is True, receipt
        assert receipt["run"] == {"unload_models": True, "free_memory": True, "requests": 2}, receipt
        assert receipt["still_loaded"] == [] and receipt["survivors"] == [], receipt
    assert first["freed"] == second["freed"], (first["freed"], second["freed"])
    (loaded,) = session.step_events("load_1", "load")
    freed = {row["model_id"]: row for row in first["freed"]}
    assert freed[loaded["model_id"]]["unloaded_bytes"] == loaded["bytes"] and freed[loaded["model_id"]]["released"]
    # the busy prompt's span runs from its submission to its end and holds both requests and the worker run
    unloads = unloads_of(session.step_events("busy_1"), "free_request")
    assert [e["model_id"] for e in unloads] == [loaded["model_id"]], unloads  # one run: unloaded once
    assert unloads[0]["requested_by"]["kind"] == "http" and unloads[0]["requested_by"]["route"] == "/memx/free"
    frees = session.step_events("busy_1", "free")
    assert len(frees) == 2 and all(e["run"]["requests"] == 2 for e in frees), frees


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_comfyuis_free_racing_ours_is_served_in_the_same_run(tree, real_session):
    session = ready(real_session(tree, "strict"))
    assert session.step("busy_2")["running_when_freed"], "the sleep prompt was not seen running"
    ours, theirs = session.step("race")["results"]
    assert theirs["http_status"] == 200 and ours["http_status"] == 200, (ours, theirs)
    receipt = ours["body"]
    assert receipt["status"] == "done" and receipt["prompt_running_at_request"] is True, receipt
    assert receipt["run"] == {"unload_models": True, "free_memory": True, "requests": 1}, receipt
    assert receipt["still_loaded"] == [] and receipt["survivors"] == [], receipt
    (loaded,) = session.step_events("after_two_1", "load")
    freed = {row["model_id"]: row for row in receipt["freed"]}
    assert freed[loaded["model_id"]]["unloaded_bytes"] == loaded["bytes"] and freed[loaded["model_id"]]["released"]
    unloads = unloads_of(session.step_events("busy_2"), "free_request")
    assert [e["model_id"] for e in unloads] == [loaded["model_id"]], unloads  # both requests, one unload


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
@pytest.mark.parametrize("after", ["two_frees", "race"])
def test_no_free_flag_is_left_set_after_the_receipts(tree, after, real_session):
    # The worker reads ComfyUI's flags after every prompt: a flag left set would unload (reason free_request) after
    # the next prompt. Two prompts later the worker has read its flags at least once more.
    session = ready(real_session(tree, "strict"))
    following = {"two_frees": ("busy_1", "after_two_1", "after_two_2"),
                 "race": ("busy_2", "after_race_1", "after_race_2")}[after]
    assert_prompts_ok(session, *following)
    end = session.step(following[-1])["event_span"][1]
    late = unloads_of(session.events(session.step(after)["event_span"][1], end), "free_request")
    assert late == [], late
    loads = session.step_events(following[1], "load")
    assert loads, "the prompt after the receipt loaded a model"
    assert session.step_events(following[2], "load") == [], "that model stayed loaded for the next prompt"


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_memx_free_that_gives_up_withdraws_its_flags(tree, real_session):
    session = ready(real_session(tree, "strict"))
    assert session.step("busy_3")["running_when_freed"], "the sleep prompt was not seen running"
    answer = session.step("give_up")
    assert answer["http_status"] == 202 and answer["body"]["status"] == "pending", answer
    assert answer["body"]["worker"] == "withdrawn", answer
    assert_prompts_ok(session, "busy_3", "after_give_up_1", "after_give_up_2")
    start = session.step("busy_3")["event_span"][0]
    end = session.step("after_give_up_2")["event_span"][1]
    assert unloads_of(session.events(start, end)) == []
    # the model of after_race_1 stayed loaded through the busy prompt and the two next ones
    assert session.step_events("after_race_1", "load")
    assert [e for e in session.events(start, end) if e["event"] == "load"] == []


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_withdrawn_request_leaves_another_clients_flag_set(tree, real_session):
    session = ready(real_session(tree, "strict"))
    assert session.step("busy_4")["running_when_freed"], "the sleep prompt was not seen running"
    ours, theirs = session.step("give_up_other")["results"]
    assert ours["http_status"] == 202 and ours["body"]["worker"] == "withdrawn", ours
    assert theirs["http_status"] == 200 and ours["started"] < theirs["started"] < ours["ended"], (ours, theirs)
    (loaded,) = session.step_events("after_race_1", "load")
    unloads = unloads_of(session.step_events("busy_4"))
    assert [(e["model_id"], e["reason"]) for e in unloads] == [(loaded["model_id"], "free_request")], unloads
    assert unloads[0]["requested_by"]["kind"] == "comfyui" and unloads[0]["requested_by"]["via"] == "prompt_worker"
    # an unload only (their body): ComfyUI's cache keeps the model, and the next prompt loads it again
    (reload,) = session.step_events("after_other_1", "load")
    assert reload["model_id"] == loaded["model_id"] and reload["reload"]["reason"] == "free_request", reload
    assert session.step_events("after_other_2", "load", "unload") == []


# ---------------------------------------------------------------------------------------------------------------
# t2i session: ComfyUI's default workflow on the random-weight SD1.5 checkpoint, then the unloading nodes
# ---------------------------------------------------------------------------------------------------------------

SD_MODELS = {"SD1ClipModel", "BaseModel", "AutoencoderKL"}
# Who moves each model's bytes under --cpu. The CLIP is loaded by CheckpointLoaderSimple itself: comfy.sd.CLIP's
# constructor calls load_models_gpu when the text encoder's initial device is its load device, which it is with
# --cpu (0.3.64, 0.27.0, 0.33.0); CLIPTextEncode then finds it resident and moves nothing.
EXPECTED_LOADERS = {"SD1ClipModel": ("4", "CheckpointLoaderSimple"), "BaseModel": ("3", "KSampler"),
                    "AutoencoderKL": ("8", "VAEDecode")}


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_default_workflow_loads_are_attributed_to_the_core_nodes(tree, real_session):
    session = ready(real_session(tree, "t2i"))
    assert_prompts_ok(session, "t2i_1", "t2i_2")
    loads = session.step_events("t2i_1", "load")
    assert sorted(e["model"] for e in loads) == sorted(SD_MODELS), loads
    prompt_id = session.step("t2i_1")["prompt_id"]
    for event in loads:
        node_id, class_type = EXPECTED_LOADERS[event["model"]]
        via = "memx_multigpu_like" if class_type == "KSampler" else None   # its comfy.sample.sample wrapper
        assert event["owner"] == {"prompt_id": prompt_id, "node_id": node_id, "class_type": class_type,
                                  "package": "core", "via": via}, event
        assert event["device"] == "cpu" and event["bytes"] == event["model_bytes"] > 0, event
        assert event["reload"] is None
    files = session.step_events("t2i_1", "file_load")
    assert [(e["file"], e["owner"]["class_type"], e["owner"]["package"]) for e in files] == [
        (drive.CHECKPOINT_NAME, "CheckpointLoaderSimple", "core")]
    assert files[0]["bytes"] == os.path.getsize(os.path.realpath(checkpoint_path()))
    assert session.step_events("t2i_2", "load", "file_load") == []  # all resident, ComfyUI's cache keeps them
    rows = {row["model"]: row for row in session.step("models_t2i")["body"]}
    assert set(rows) == SD_MODELS
    for model, (node_id, class_type) in EXPECTED_LOADERS.items():
        owner = rows[model]["owner"]
        assert (owner["node_id"], owner["class_type"], owner["package"]) == (node_id, class_type, "core")
        assert rows[model]["state"] == "loaded" and rows[model]["loads"] == 1


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_default_workflow_reports_no_leak(tree, real_session):
    session = ready(real_session(tree, "t2i"))
    log = session.log_text()
    assert drive.lines_containing(log, drive.LEAK_INFO_TEXT) == []
    assert drive.lines_containing(log, drive.LEAK_WARNING_TEXT) == []
    assert not [line for line in memx_lines(log) if "leaked model" in line]
    assert [e for e in session.events() if e["event"] in ("leak", "leak_seen")] == []


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_memx_free_frees_unet_clip_and_vae(tree, real_session):
    session = ready(real_session(tree, "t2i"))
    step = session.step("free_t2i")
    receipt = step["body"]
    assert step["http_status"] == 200 and receipt["status"] == "done", receipt
    freed = {row["model"]: row for row in receipt["freed"]}
    assert set(freed) == SD_MODELS, receipt["freed"]
    for model, row in freed.items():
        assert row["released"] is True and row["unloaded_bytes"] == row["bytes"] > 0, row
    assert receipt["still_loaded"] == [] and receipt["survivors"] == [], receipt
    assert receipt["released_bytes"] == sum(row["bytes"] for row in freed.values())
    assert session.step("models_after_free")["body"] == []  # nothing kept alive, by ComfyUI or comfy_memx


def probes(session, index):
    outputs = session.step(f"unload_{index}")["outputs"]
    return outputs["10"]["memx_probe"][0], outputs["12"]["memx_probe"][0]


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_cpu_unload_and_reload_move_no_weights(tree, real_session):
    # What --cpu really does, read by the probe node and not by comfy_memx: ComfyUI's load and unload only change
    # its accounting (loaded_size, current_loaded_models); the UNet's weights stay in the same storage on the CPU.
    session = ready(real_session(tree, "t2i"))
    assert_prompts_ok(session, *(f"unload_{i}" for i in range(len(UNLOAD_CHAIN))))
    storage = set()
    for index, unloader in enumerate(UNLOAD_CHAIN):
        before, after = probes(session, index)
        assert before["model"] == "BaseModel" and before["in_loaded_list"] is True
        assert before["loaded_size"] == before["model_size"] > 0
        assert after["in_loaded_list"] is False
        # dropping an entry leaves ComfyUI's accounting as it was; the two unloads clear it
        assert after["loaded_size"] == (before["model_size"] if unloader == "MemxDropLoadedModels" else 0)
        for probe in (before, after):
            storage.add(tuple((w["name"], w["device"], w["data_ptr"]) for w in probe["weights"]))
    assert len(storage) == 1 and all(device == "cpu" for _, device, _ in next(iter(storage))), storage


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_event_bytes_are_comfyuis_accounting_of_the_unet(tree, real_session):
    # The events' bytes follow ComfyUI's accounting as the probes read it: the full model at every load after an
    # unload and at every unload, nothing for a dropped entry, and no load at all after one (still accounted).
    session = ready(real_session(tree, "t2i"))
    for index, unloader in enumerate(UNLOAD_CHAIN):
        before, after = probes(session, index)
        events = by_model(session.step_events(f"unload_{index}", "load", "unload"))["BaseModel"]
        loads = [e for e in events if e["event"] == "load"]
        unloads = [e for e in events if e["event"] == "unload"]
        if index > 0 and UNLOAD_CHAIN[index - 1] == "MemxDropLoadedModels":
            assert loads == [], loads
        else:
            assert [e["bytes"] for e in loads] == [before["loaded_size"]], loads
        assert [e["bytes"] for e in unloads] == [before["loaded_size"] - after["loaded_size"]], unloads


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_every_unload_names_the_node_that_asked_for_it(tree, real_session):
    session = ready(real_session(tree, "t2i"))
    reasons = {"MemxUnloadAllModels": "unload_all", "MemxFreeAllMemory": "memory_pressure",
               "MemxDropLoadedModels": "dropped"}
    for index, unloader in enumerate(UNLOAD_CHAIN):
        name = f"unload_{index}"
        unloads = unloads_of(session.step_events(name))
        expected = SD_MODELS if index == 0 else SD_MODELS - {"SD1ClipModel"}  # the CLIP is not needed again
        assert {e["model"] for e in unloads} == expected, (name, unloads)
        for event in unloads:
            assert event["reason"] == reasons[unloader], event
            assert event["requested_by"] == {"kind": "node", "prompt_id": session.step(name)["prompt_id"],
                                             "node_id": UNLOADER_NODE, "class_type": unloader,
                                             "package": UNLOAD_PACK}, event
            if unloader == "MemxDropLoadedModels":
                assert event["bytes"] == 0, event  # removed from ComfyUI's list, nothing moved


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_reloads_are_charged_to_the_node_that_unloaded(tree, real_session):
    session = ready(real_session(tree, "t2i"))
    assert all(e["reload"] is None for e in session.step_events("unload_0", "load"))
    for index in range(1, len(UNLOAD_CHAIN)):
        loads = session.step_events(f"unload_{index}", "load")
        previous = UNLOAD_CHAIN[index - 1]
        if previous == "MemxDropLoadedModels":
            assert loads == [], loads  # the dropped weights are still accounted as loaded: nothing to reload
            continue
        assert {e["model"] for e in loads} == {"BaseModel", "AutoencoderKL"}, loads
        for event in loads:
            reload = event["reload"]
            assert reload is not None and reload["cause"] == f"{UNLOAD_PACK}/{previous}", event
            assert reload["package"] == UNLOAD_PACK and reload["bytes"] == event["bytes"], reload
            assert reload["requested_by"]["prompt_id"] == session.step(f"unload_{index - 1}")["prompt_id"]
    rows = {row["model"]: row for row in session.step("models_after_unloads")["body"]}
    unet = rows["BaseModel"]
    causes = {cause["cause"]: cause["reloads"] for cause in unet["reload_causes"]}
    assert causes == {f"{UNLOAD_PACK}/MemxUnloadAllModels": 2, f"{UNLOAD_PACK}/MemxFreeAllMemory": 1}, unet
    assert unet["reloads"] == 3 and unet["reload_bytes"] == 3 * unet["bytes"]


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_thrash_is_warned_once_three_prompts_in_a_row_reloaded(tree, real_session):
    session = ready(real_session(tree, "t2i"))
    thrash_at = 3  # prompts 1, 2 and 3 reloaded the UNet and the VAE (COMFY_MEMX_THRASH_PROMPTS default 3)
    for index in range(len(UNLOAD_CHAIN)):
        lines = [line for line in memx_lines(session.step_log(f"unload_{index}")) if "thrash" in line]
        events = session.step_events(f"unload_{index}", "thrash")
        if index != thrash_at:
            assert lines == [] and events == [], (index, lines)
            continue
        assert sorted(e["model"] for e in events) == ["AutoencoderKL", "BaseModel"], events
        unet = [line for line in lines if "BaseModel" in line]
        assert len(lines) == 2 and len(unet) == 1, lines
        assert "was reloaded in each of the last 3 prompts" in unet[0]
        assert unet[0].endswith(f"the last unload was asked for by {UNLOAD_PACK}/MemxUnloadAllModels"), unet
        prompts = [session.step(f"unload_{i}")["prompt_id"] for i in (1, 2, 3)]
        assert all(e["prompts"] == prompts and e["cause"] == f"{UNLOAD_PACK}/MemxUnloadAllModels" for e in events)


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_same_device_events_claim_no_transfer_rate(tree, real_session):
    """With --cpu the load device is the offload device: a load or unload only changes ComfyUI's accounting."""
    session = ready(real_session(tree, "t2i"))
    events = [e for e in session.events() if e["event"] in ("load", "unload") and e["model"] in SD_MODELS]
    assert events and [(e["event"], e["model"], e["copied"], e.get("reason"), e.get("requested_by")) for e in events if e["copied"] is not False] == []
    claimed = [(e["event"], e["model"], e["bytes"], e["gb_per_s"]) for e in events if e["bytes"] and e["gb_per_s"]]
    assert claimed == [], claimed


# ---------------------------------------------------------------------------------------------------------------
# Handing the GPU over: the idle unload and the hand-off request/receipt path between two real servers on one host
# ---------------------------------------------------------------------------------------------------------------

def wait_for_event(session, kind):
    """The first ``kind`` event of the session's log, waiting while the server lives and logs (``waits``)."""
    return waits.wait_until(lambda: next((e for e in session.events() if e["event"] == kind), None), session.alive,
                            waits.log_size(session.log_path), f"a {kind} event", poll_s=0.25)


@needs_real_comfyui
@pytest.mark.parametrize("tree", oldest_and_newest_trees)
def test_two_real_servers_hand_over_and_an_idle_one_unloads(tree, memx_importable_by_real_python, tmp_path):
    """Two servers of one tree register in one host registry (their own XDG_RUNTIME_DIR here); the requester's
    /memx/handoff/request makes the idle giver unload through its worker, both write handoff events; then the
    requester, idle for 2 s with a model loaded, unloads by itself (COMFY_MEMX_IDLE_UNLOAD)."""
    if not memx_importable_by_real_python:
        pytest.skip(f"comfy_memx is not installed for {configured_python()} (pip install --no-deps -e .)")
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    shared = {"COMFY_MEMX_HANDOFF": "host", "XDG_RUNTIME_DIR": str(runtime)}
    giver = drive.Session(tree, configured_python(), str(tmp_path / "giver"), launcher="module", env=shared)
    asker = drive.Session(tree, configured_python(), str(tmp_path / "asker"), launcher="module",
                          env={**shared, "COMFY_MEMX_IDLE_UNLOAD": "2"})
    try:
        booted = drive.in_parallel(giver.start, asker.start)
        assert booted == [True, True], (booted, where(giver), where(asker))
        loaded = giver.prompt("load", {"1": drive.loader_node("memx-handoff"), "2": drive.sampler_node("1", 1)})
        assert loaded["ok"], (loaded, where(giver))
        answer = asker.call("ask", "POST", "/memx/handoff/request?bytes=1000000")
        assert answer["http_status"] == 200, (answer, where(asker))
        body = answer["body"]
        [given] = body["givers"]
        assert given["pid"] == giver.server.process.pid and given["freed"] == ["MemxTinyNet#1"], body
        assert given["freed_bytes"] > 0 and body["freed_bytes"] == given["freed_bytes"], body
        giver_side = wait_for_event(giver, "handoff")
        assert giver_side["role"] == "giver" and giver_side["to"] == asker.server.process.pid, giver_side
        assert giver_side["freed"] == ["MemxTinyNet#1"] and giver_side["status"] == "done", giver_side
        unloads = [e for e in giver.events() if e["event"] == "unload"]
        assert [u["requested_by"]["via"] for u in unloads] == ["handoff"], unloads
        assert [e["role"] for e in asker.events() if e["event"] == "handoff"] == ["requester"]

        mine = asker.prompt("load", {"1": drive.loader_node("memx-idle"), "2": drive.sampler_node("1", 1)})
        assert mine["ok"], (mine, where(asker))
        idle = wait_for_event(asker, "idle_unload")
        assert idle is not None, where(asker)
        assert idle["status"] == "done" and idle["freed"] == ["MemxTinyNet#1"] and idle["idle_s"] == 2, idle
        assert any("the queue was idle for 2 s: the worker unloaded 1 model(s)" in line
                   for line in memx_lines(asker.log_text())), where(asker)
        time.sleep(3)   # once per idle period: nothing more until the next prompt
        assert [e["event"] for e in asker.events()].count("idle_unload") == 1
    finally:
        giver.stop()
        asker.stop()
    for session in (giver, asker):
        text = session.log_text()
        assert session.failure_tracebacks() == [] and "comfy_memx: internal error" not in text, where(session)


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_small_checkpoint_samples_in_each_tree(tree, small_checkpoint):
    """The small checkpoint (built once, by the first tree) is what every tree's own loader takes:
    CheckpointLoaderSimple detects it as SD1.5 and builds a model, CLIP-L and TAESD, and CLIPTextEncode, one KSampler step at 64x64 and
    VAEDecode run on CPU (``make_checkpoint.py --verify-only`` in the tree)."""
    path = small_checkpoint(tree)
    result = subprocess.run([configured_python(), drive.MAKE_CHECKPOINT, "--verify-only", "--arch", "small", "--tree",
                             tree, "--out", path], capture_output=True, text=True, timeout=600,
                            env=drive.inherited_env(), cwd=os.path.dirname(path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["verified"] and summary["image_shape"] == [1, 64, 64, 3], summary
    assert "BaseModel / SD1ClipModel / TAESD" in result.stderr, result.stderr[-2000:]
