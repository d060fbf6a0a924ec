"""comfy_memx installed as a node pack in real ComfyUI (opt-in, like the other real-ComfyUI tests).

The repository is put into ``custom_nodes/`` the ways users get it there: a plain ``git clone`` of the checkout, a
``git -c core.symlinks=false clone`` (Git's default on Windows) and a ``git archive`` extract (a zip download),
one kind per tree.  ComfyUI is started with its plain ``python main.py --cpu`` in ComfyUI's environment
(``COMFY_MEMX_REAL_PLAIN_PYTHON``, default ``COMFY_MEMX_REAL_PYTHON``): comfy_memx must be active from the pack
(``GET /memx/status``), its startup line must say it was a late activation, and a prompt's model load must be in
``GET /memx/models`` with its node's package.  On the archive case comfy_memx sits in a second custom-nodes folder
(``--extra-model-paths-config``) so that ComfyUI loads ``memx_early_binder`` first, deterministically: the line must
name it as holding the unwrapped ``load_models_gpu`` (and, on every tree, ComfyUI's own ``comfy.clip_vision`` as
holding ``comfy.utils.load_torch_file``).  Then, in an environment where comfy_memx is installed
(``COMFY_MEMX_REAL_PYTHON``), the pack combined with the launcher, with ``COMFY_MEMX=1`` and with both, on the newest
tree: one activation each, by the earlier entry point.

The committed tree (HEAD) is what gets cloned or archived; one server per case, a tiny model per prompt.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.harness import drive
from comfy_memx import __version__

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
REAL_COMFY_DIR = ROOT / "tests" / "real_comfy"
TREES = [path for path in os.environ.get("COMFY_MEMX_REAL_COMFYUI", "").split(os.pathsep) if path]
PYTHON = os.environ.get("COMFY_MEMX_REAL_PYTHON") or None
PLAIN_PYTHON = os.environ.get("COMFY_MEMX_REAL_PLAIN_PYTHON") or PYTHON
KINDS = ("clone", "symlinks-false-clone", "archive")
BINDER = str(REAL_COMFY_DIR / "memx_early_binder")
STARTUP = f"comfy_memx {__version__} active ("


def _cases():
    """(tree, kind) pairs: the kinds spread over the trees, every kind at least once."""
    if not TREES:
        return []
    cases = [(tree, KINDS[i % len(KINDS)]) for i, tree in enumerate(TREES)]
    cases += [(TREES[-1], kind) for kind in KINDS[len(TREES):]]
    return cases


def _skip_reason():
    if not TREES or not PLAIN_PYTHON:
        return "set COMFY_MEMX_REAL_COMFYUI and COMFY_MEMX_REAL_PYTHON (see tests/test_real_comfyui.py)"
    if shutil.which("git") is None or subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                                     capture_output=True).returncode != 0:
        return "needs git and a checkout with commits"
    return None


if _skip_reason():
    pytestmark = [pytest.mark.real, pytest.mark.skip(reason=_skip_reason())]


def put_pack(kind, folder):
    """The committed tree at ``folder`` as ``kind`` gets it there."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    if kind == "archive":
        folder.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "HEAD"], capture_output=True,
                                 check=True, timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True, timeout=120)
    else:
        config = ["-c", "core.symlinks=false"] if kind == "symlinks-false-clone" else []
        subprocess.run(["git", *config, "clone", "-q", str(ROOT), str(folder)], check=True, timeout=120)
    assert [p.name for p in (folder / "comfy_memx" / "patches").iterdir()] == ["__init__.py"]   # the pointer only
    return folder


def installed_comfy_memx(python):
    """Where ``python`` would import comfy_memx from outside any pack (None: not installed there)."""
    out = subprocess.run([python, "-c", "import importlib.util as u, os; s = u.find_spec('comfy_memx'); "
                          "print(os.path.dirname(s.origin) if s and s.origin else '')"],
                         capture_output=True, text=True, timeout=60, cwd="/", env=drive.inherited_env())
    return out.stdout.strip() or None


def serve(tmp_path, tree, python, launcher="plain", kind="clone", folder="comfy_memx", extra_dir=False, env=None):
    """Start ComfyUI with the pack installed; run one tiny-model prompt; return what the test reads."""
    staging = put_pack(kind, tmp_path / "staging" / folder)
    packs = [drive.NODE_PACK_NAME]
    comfy_args = ["--cpu"]
    if extra_dir:
        packs.append(BINDER)
        extra = tmp_path / "extra"
        shutil.copytree(staging, extra / "custom_nodes" / folder)
        config = tmp_path / "extra_paths.yaml"
        config.write_text(f"memx_extra:\n  base_path: {extra}\n  custom_nodes: custom_nodes\n")
        comfy_args += ["--extra-model-paths-config", str(config)]
        pack_dir = extra / "custom_nodes" / folder
    else:
        packs.append(str(staging))
    session = drive.Session(tree, python, tmp_path / "server", launcher=launcher, env=env, comfy_args=comfy_args,
                            packs=tuple(packs))
    if not extra_dir:
        pack_dir = Path(session.base) / "custom_nodes" / folder
    try:
        assert session.start(), session.log_text()[-4000:]
        status = session.call("status", "GET", "/memx/status")
        prompt = session.prompt("load", drive.scenario_steps("basic")[0]["prompt"])
        models = session.call("models", "GET", "/memx/models")
    finally:
        session.stop()
    log = "\n".join(drive.strip_ansi(line) for line in session.log_text().splitlines())
    return {"status": status, "prompt": prompt, "models": models, "log": log, "pack_dir": pack_dir}


def assert_model_load_recorded(result):
    assert result["prompt"]["ok"], result["prompt"]
    assert result["models"]["http_status"] == 200
    rows = [row for row in result["models"]["body"] if row["model"] == "MemxTinyNet"]
    assert rows and rows[0]["loads"] >= 1 and rows[0]["owner"]["package"] == drive.NODE_PACK_NAME, rows


def startup_lines(log):
    return [line[line.index(STARTUP):] for line in log.splitlines() if STARTUP in line]


@pytest.mark.parametrize("tree,kind", _cases(), ids=[f"{Path(t).name}-{k}" for t, k in _cases()])
def test_the_pack_activates_comfy_memx_late_in_plain_comfyui(tmp_path, tree, kind):
    folder = {"clone": "comfy_memx", "symlinks-false-clone": "ComfyUI-memx", "archive": "comfy_memx-main"}[kind]
    result = serve(tmp_path, tree, PLAIN_PYTHON, kind=kind, folder=folder, extra_dir=kind == "archive")
    log, pack_dir = result["log"], result["pack_dir"]
    assert result["status"]["http_status"] == 200, log[-4000:]
    assert result["status"]["body"]["source"] == "node pack"
    [line] = startup_lines(log)
    assert line.startswith(f"{STARTUP}node pack, leak mode report, release off): patched load_models_gpu")
    assert "; late activation (comfy.model_management" in line and "imported before comfy_memx)" in line
    # ComfyUI's own comfy.clip_vision does `from comfy.utils import load_torch_file` (0.3.64 to 0.33.0)
    assert "; unreachable (imported by name before comfy_memx, those calls bypass it): " in line
    assert re.search(r"comfy\.utils\.load_torch_file held by [^;]*comfy\.clip_vision", line), line
    if kind == "archive":
        assert "load_models_gpu held by custom node memx_early_binder" in line, line
    [said] = [l for l in log.splitlines() if f"comfy_memx node pack (custom_nodes/{folder})" in l]
    assert f"activating the pack folder's own comfy_memx {__version__} ({pack_dir / 'comfy_memx'})" in said
    installed = installed_comfy_memx(PLAIN_PYTHON)
    if installed:   # (CI's ComfyUI environment has the wheel too) the pack's copy is active, the other one named
        assert f"the comfy_memx at {installed} is not used in this process" in said
    else:
        assert "is not used in this process" not in said
    assert "Unable to parse pyproject.toml" not in log     # ComfyUI's own parser reads [project] / [tool.comfy]
    assert "Cannot import" not in log
    assert_model_load_recorded(result)


COMBINATIONS = {"launcher": ("module", {}), "env": ("env", {}), "launcher and env": ("module", {"COMFY_MEMX": "1"})}


@pytest.mark.skipif(not PYTHON or not TREES or not installed_comfy_memx(PYTHON),
                    reason="COMFY_MEMX_REAL_PYTHON must have comfy_memx installed for the launcher and COMFY_MEMX=1")
@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_the_pack_with_the_launcher_or_the_env_flag_activates_once(tmp_path, combination):
    launcher, env = COMBINATIONS[combination]
    result = serve(tmp_path, TREES[-1], PYTHON, launcher=launcher, env=env)
    log = result["log"]
    expected = "launcher" if combination == "launcher" else "env"   # the .pth line runs before the launcher
    assert result["status"]["body"]["source"] == expected, log[-4000:]
    [line] = startup_lines(log)
    assert line.startswith(f"{STARTUP}{expected}, leak mode report, release off)") and "late activation" not in line
    [said] = [l for l in log.splitlines() if "comfy_memx node pack (custom_nodes/comfy_memx)" in l]
    assert f"already active ({expected}); not activating it again" in said
    assert f"imported before the pack ({installed_comfy_memx(PYTHON)})" in said
    assert_model_load_recorded(result)
