"""The node-pack entry (the repository's root ``__init__.py``) loaded the way ComfyUI loads a custom node, in fresh
interpreters with nothing installed (``python -S``): which comfy_memx it imports, that it activates once, and that
it leaves ``sys.path`` as it found it.  The real-ComfyUI tests (tests/real/test_node_pack.py) do the same in
real servers."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from comfy_memx import __version__

ROOT = Path(__file__).resolve().parents[2]
PACK_FILES = ("__init__.py", "comfy_memx", "patches", "pyproject.toml")

# A loader shaped like ComfyUI's (nodes.load_custom_node): module_from_spec, register in sys.modules, exec.
LOADER = textwrap.dedent('''
    import importlib.util, json, logging, os, sys, types
    logging.basicConfig(level=logging.INFO, format="LOG %(message)s", stream=sys.stdout)
    pack, register_as, before, times = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    sys.modules["nodes"] = types.ModuleType("nodes")      # ComfyUI's node loader is imported
    sys.modules["server"] = types.ModuleType("server")    # a patch target ComfyUI imported: a late activation
    path_before = list(sys.path)
    if before == "env":
        import comfy_memx._startup
    elif before == "launcher":
        from comfy_memx.core.bootstrap import bootstrap
        bootstrap("launcher")
    for _ in range(times):
        name = pack.replace(".", "_x_") if register_as == "path" else os.path.basename(pack)
        spec = importlib.util.spec_from_file_location(name, os.path.join(pack, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    import comfy_memx, comfy_memx.patches.model_management
    from comfy_memx.core.state import STATE
    print("RESULT " + json.dumps({
        "source": STATE.source, "package": os.path.dirname(comfy_memx.__file__),
        "patches": os.path.dirname(comfy_memx.patches.model_management.__file__),
        "sys_path_unchanged": sys.path == path_before, "top_level_patches": "patches" in sys.modules,
        "mappings": module.NODE_CLASS_MAPPINGS, "web": module.WEB_DIRECTORY,
        "real_package_registered": hasattr(sys.modules["comfy_memx"], "status")}))
''')


def make_pack(parent, name):
    """A copy of the checkout's pack files as ``parent/<name>`` (what a clone or a zip leaves there)."""
    pack = parent / name
    pack.mkdir(parents=True)
    for entry in PACK_FILES:
        source = ROOT / entry
        if source.is_dir():
            shutil.copytree(source, pack / entry, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, pack / entry)
    return pack


def load(pack, register_as="path", before="none", times=1, pythonpath=None, extra_env=None):
    """Run LOADER on ``pack``; returns (its RESULT, its log lines)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMFY_MEMX", "PYTHONPATH"))}
    env.update(extra_env or {})
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    if before == "env":
        env["COMFY_MEMX"] = "1"
    out = subprocess.run([sys.executable, "-S", "-c", LOADER, str(pack), register_as, before, str(times)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=str(pack.parent.parent))
    assert out.returncode == 0, out.stdout + out.stderr
    [result] = [line[7:] for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    logs = [line[4:] for line in out.stdout.splitlines() if line.startswith("LOG ")]
    return json.loads(result), logs


def activations(logs):
    """The startup lines (one per activation)."""
    return [line for line in logs if line.startswith(f"comfy_memx {__version__} active (")]


@pytest.mark.parametrize("folder", ["comfy_memx", "comfy_memx-main", "ComfyUI-memx"])
@pytest.mark.parametrize("register_as", ["path", "folder name"])
def test_the_pack_activates_its_own_comfy_memx_late_once(tmp_path, folder, register_as):
    pack = make_pack(tmp_path / "custom_nodes", folder)
    result, logs = load(pack, register_as)
    assert result["source"] == "node pack" and result["real_package_registered"]
    assert result["package"] == str(pack / "comfy_memx") and result["patches"] == str(pack / "patches")
    assert result["sys_path_unchanged"] and not result["top_level_patches"]
    assert result["mappings"] == {} and result["web"] == "./comfy_memx/web"
    [line] = activations(logs)
    assert "active (node pack" in line and "late activation (server imported before comfy_memx)" in line
    assert any("activating the pack folder's own comfy_memx" in line and str(pack / "comfy_memx") in line
               for line in logs)


@pytest.mark.parametrize("before", ["env", "launcher"])
def test_an_installed_comfy_memx_already_active_is_kept_and_not_activated_again(tmp_path, before):
    site = tmp_path / "site"
    # laid out as a wheel installs it: patches/ as comfy_memx/patches/, the checkout's pointer left out
    shutil.copytree(ROOT / "comfy_memx", site / "comfy_memx", ignore=shutil.ignore_patterns("__pycache__", "patches"))
    shutil.copytree(ROOT / "patches", site / "comfy_memx" / "patches", ignore=shutil.ignore_patterns("__pycache__"))
    pack = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    result, logs = load(pack, before=before, pythonpath=site)
    assert result["source"] == before and result["package"] == str(site / "comfy_memx")
    assert len(activations(logs)) == 1
    [said] = [line for line in logs if "node pack" in line]
    assert f"already active ({before}); not activating it again" in said
    assert f"imported before the pack ({site / 'comfy_memx'}), not the pack folder's copy" in said


def test_two_copies_of_the_pack_activate_once(tmp_path):
    first = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    make_pack(tmp_path / "custom_nodes", "comfy_memx-main")
    result, logs = load(first, times=2)
    assert result["source"] == "node pack" and len(activations(logs)) == 1
    assert sum("already active (node pack)" in line for line in logs) == 1


def test_a_pip_installed_copy_that_is_not_imported_yet_is_named_and_the_packs_own_is_used(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "comfy_memx", site / "comfy_memx", ignore=shutil.ignore_patterns("__pycache__"))
    pack = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    result, logs = load(pack, pythonpath=site)
    assert result["package"] == str(pack / "comfy_memx") and result["source"] == "node pack"
    [said] = [line for line in logs if "activating" in line]
    assert f"the comfy_memx at {site / 'comfy_memx'} is not used in this process" in said


def test_outside_comfyui_the_pack_activates_nothing(tmp_path):
    pack = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    code = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('pack', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(sorted(n for n in sys.modules if n.startswith('comfy_memx')))")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(pack / "__init__.py")], capture_output=True,
                         text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_bad_setting_leaves_comfyui_loading_the_pack_and_unpatched(tmp_path):
    pack = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    result, logs = load(pack, extra_env={"COMFY_MEMX_LEAK_MODE": "loud"})
    assert result["source"] is None and result["mappings"] == {}
    [error] = [line for line in logs if "NOT active" in line]
    assert "COMFY_MEMX_LEAK_MODE" in error and activations(logs) == []


def test_a_bad_setting_under_the_pack_names_the_variable_not_a_launcher_option(tmp_path):
    pack = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    result, logs = load(pack, extra_env={"COMFY_MEMX_PIN_LIMIT": "lots"})
    [error] = [line for line in logs if "NOT active" in line]
    assert "COMFY_MEMX_PIN_LIMIT='lots' is not valid" in error and "launcher" not in error, error


def test_with_comfy_memx_1_and_the_pack_a_bad_setting_is_reported_once(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(ROOT / "comfy_memx", site / "comfy_memx", ignore=shutil.ignore_patterns("__pycache__", "patches"))
    shutil.copytree(ROOT / "patches", site / "comfy_memx" / "patches", ignore=shutil.ignore_patterns("__pycache__"))
    pack = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    result, logs = load(pack, before="env", pythonpath=site,
                        extra_env={"COMFY_MEMX_PIN_LIMIT": "lots", "COMFY_MEMX_PINLIMIT": "1"})
    assert result["source"] is None
    errors = [line for line in logs if "NOT active" in line]
    assert len(errors) == 1 and "COMFY_MEMX_PIN_LIMIT='lots'" in errors[0] and "launcher" not in errors[0], logs
    assert sum("unknown setting COMFY_MEMX_PINLIMIT" in line for line in logs) == 1, logs


@pytest.mark.parametrize("before", ["env", "launcher"])
def test_an_installed_comfy_memx_of_another_version_is_named_with_a_warning(tmp_path, before):
    """The launcher or COMFY_MEMX=1 runs the pip-installed copy; when it is not the pack folder's version, the pack
    says so as a warning, with what to do (the same version is no warning: the same code runs)."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "comfy_memx", site / "comfy_memx", ignore=shutil.ignore_patterns("__pycache__", "patches"))
    shutil.copytree(ROOT / "patches", site / "comfy_memx" / "patches", ignore=shutil.ignore_patterns("__pycache__"))
    (site / "comfy_memx" / "_version.py").write_text('__version__ = "0.1.9"\n', encoding="utf-8")
    pack = make_pack(tmp_path / "custom_nodes", "comfy_memx")
    result, logs = load(pack, before=before, pythonpath=site)
    assert result["source"] == before and result["package"] == str(site / "comfy_memx")
    [warned] = [line for line in logs if "runs in this process, not this pack folder's" in line]
    assert (f"comfy_memx 0.1.9 from {site / 'comfy_memx'} runs in this process, not this pack folder's comfy_memx "
            f"{__version__}: upgrade that install (pip install --no-deps {pack})") in warned, warned
    same, same_logs = load(make_pack(tmp_path / "other" / "custom_nodes", "comfy_memx"), before=before,
                           pythonpath=ROOT)
    assert not [line for line in same_logs if "runs in this process, not this pack folder's" in line], same_logs
