"""Activation end to end: the launcher and COMFY_MEMX=1 on the stand-in main.py, and the .pth in fresh venvs."""

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from fake_comfy.loader import shape_root
from comfy_memx import __version__

ROOT = Path(__file__).parents[2]
PROBE = ("import sys; print('memx' if 'comfy_memx' in sys.modules else 'none', "
         "sorted(m for m in ('torch', 'logging', 'comfy_memx.core.bootstrap') if m in sys.modules))")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
    env.update(extra)
    return env


def run(args, **env):
    return subprocess.run(args, capture_output=True, text=True, env=clean_env(**env), timeout=120, cwd="/")


@pytest.mark.parametrize("version", ["0.3.64", "0.27.0"])
def test_launcher_runs_the_stand_in_main_with_its_flags(version):
    main = os.path.join(shape_root(version), "main.py")
    out = run([sys.executable, "-m", "comfy_memx", "--leak-mode", "strict", main, "--cpu", "--quick-test-for-ci"])
    assert out.returncode == 0, out.stderr
    log = out.stdout + out.stderr
    assert "Set vram state to: DISABLED" in log            # ComfyUI's --cpu was honoured
    assert "Torch already imported" not in log
    assert f"comfy_memx {__version__} active (launcher, leak mode strict, release off): patched load_models_gpu" in log
    assert log.count(f"comfy_memx {__version__} active") == 1


@pytest.mark.parametrize("args,env,said", [
    (["--release", "auto", "--release-packages", "my_unet_pack,memx_style_mixer"], {},
     "release auto for my_unet_pack, memx_style_mixer"),
    ([], {"COMFY_MEMX_RELEASE": "auto", "COMFY_MEMX_RELEASE_PACKAGES": "*"}, "release auto for every pack"),
    (["--release", "ask"], {}, "release ask")])
def test_the_startup_line_says_the_release_setting_and_its_packages(args, env, said):
    main = os.path.join(shape_root("0.27.0"), "main.py")
    out = run([sys.executable, "-m", "comfy_memx", *args, main, "--cpu", "--quick-test-for-ci"], **env)
    assert out.returncode == 0, out.stderr
    assert f"comfy_memx {__version__} active (launcher, leak mode report, {said}): patched" in out.stdout + out.stderr


def test_comfyui_rejects_its_own_bad_flag_not_ours():
    main = os.path.join(shape_root("0.27.0"), "main.py")
    out = run([sys.executable, "-m", "comfy_memx", main, "--no-such-comfy-flag"])
    assert out.returncode == 2 and "--no-such-comfy-flag" in out.stderr


@pytest.mark.parametrize("version", ["0.3.64", "0.27.0"])
def test_env_flag_activates_with_the_normal_start_command(version):
    main = os.path.join(shape_root(version), "main.py")
    on = run([sys.executable, main, "--cpu", "--quick-test-for-ci"], COMFY_MEMX="1")
    assert on.returncode == 0 and f"comfy_memx {__version__} active (env, leak mode report, release off)" in on.stdout + on.stderr
    off = run([sys.executable, main, "--cpu", "--quick-test-for-ci"], COMFY_MEMX="0")
    assert off.returncode == 0 and "comfy_memx" not in off.stdout + off.stderr


def test_env_flag_with_a_bad_setting_leaves_comfyui_unpatched():
    main = os.path.join(shape_root("0.27.0"), "main.py")
    out = run([sys.executable, main, "--cpu", "--quick-test-for-ci"], COMFY_MEMX="1", COMFY_MEMX_LEAK_MODE="loud")
    assert out.returncode == 0
    log = out.stdout + out.stderr
    assert "COMFY_MEMX_LEAK_MODE='loud' is not valid" in log and "ComfyUI runs unpatched" in log
    assert "active (env" not in log


@pytest.mark.parametrize("editable", [False, True], ids=["pip install .", "pip install -e ."])
def test_startup_hook_in_a_fresh_virtual_environment(tmp_path, editable):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    install = [python, "-m", "pip", "install", "-q", "--no-deps"]
    done = subprocess.run(install + (["-e", str(ROOT)] if editable else [str(ROOT)]), capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    unset = run([python, "-c", PROBE])
    assert unset.stdout.split()[0] == "none" and "torch" not in unset.stdout
    on = run([python, "-c", PROBE + "; from comfy_memx.core.state import STATE; from comfy_memx.core import importhook; "
              "print(STATE.source, importhook.pending())"], COMFY_MEMX="1")
    assert on.returncode == 0, on.stderr
    assert on.stdout.startswith("memx") and "'torch'" not in on.stdout
    assert on.stdout.split("\n")[1].startswith("env [")
    assert "'comfy.model_management'" in on.stdout and "'execution'" in on.stdout
