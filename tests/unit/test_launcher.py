"""The launcher in subprocesses: ComfyUI must see exactly what plain `python main.py ...` would give it."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ECHO = Path(__file__).parents[1] / "scripts" / "echo_argv.py"


def run(args, cwd=None, env=None):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd or tempfile.gettempdir(),
                          env=full_env, timeout=60)


def test_script_sees_the_same_as_under_plain_python(tmp_path):
    args = [str(ECHO), "a", "--port", "8188", "--cpu"]
    plain = run(args, cwd=tmp_path)
    launched = run(["-m", "comfy_memx", *args], cwd=tmp_path)
    assert launched.returncode == plain.returncode == 0
    assert launched.stdout == plain.stdout
    assert launched.stderr == plain.stderr
    seen = json.loads(launched.stdout)
    assert seen["argv"] == ["a", "--port", "8188", "--cpu"]
    assert seen["name"] == "__main__" and seen["argv0"] == "echo_argv.py"
    assert seen["path0"] == str(ECHO.parent)
    assert seen["heavy"] == []


def test_memx_options_never_reach_the_script(tmp_path):
    out = run(["-m", "comfy_memx", "--leak-mode", "strict", f"--events={tmp_path / 'e.jsonl'}", "--",
               str(ECHO), "--leak-mode", "x"])
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["argv"] == ["--leak-mode", "x"]


@pytest.mark.parametrize("code", ["0", "7"])
def test_exit_status_is_preserved(code):
    assert run(["-m", "comfy_memx", str(ECHO), "--exit", code]).returncode == int(code)


def test_missing_script_fails_with_status_2():
    out = run(["-m", "comfy_memx", "no/such/main.py", "--cpu"])
    assert out.returncode == 2 and "no such file" in out.stderr and out.stdout == ""


def test_non_python_script_fails_with_status_2(tmp_path):
    binary = tmp_path / "main.py"
    binary.write_bytes(b"\x7fELF\x00\x01\x02 not python")
    out = run(["-m", "comfy_memx", str(binary)])
    assert out.returncode == 2 and "not a Python script" in out.stderr


def test_bad_setting_fails_before_the_script_runs():
    out = run(["-m", "comfy_memx", "--leak-mode", "loud", str(ECHO)])
    assert out.returncode == 2 and out.stdout == ""
    assert "COMFY_MEMX_LEAK_MODE='loud'" in out.stderr and "off, report, strict" in out.stderr


def test_a_typo_is_warned_about_even_when_another_setting_is_bad():
    out = run(["-m", "comfy_memx", "--leak-mode", "loud", str(ECHO)], env={"COMFY_MEMX_EVENT": "/tmp/x.jsonl"})
    assert out.returncode == 2 and "COMFY_MEMX_LEAK_MODE='loud'" in out.stderr
    assert "unknown setting COMFY_MEMX_EVENT ignored" in out.stderr


def test_bad_setting_from_environment_fails_too():
    out = run(["-m", "comfy_memx", str(ECHO)], env={"COMFY_MEMX_DISABLE": "nope"})
    assert out.returncode == 2 and "COMFY_MEMX_DISABLE" in out.stderr


def test_unknown_option_and_missing_value():
    unknown = run(["-m", "comfy_memx", "--cpu", str(ECHO)])
    assert unknown.returncode == 2 and "unknown option --cpu" in unknown.stderr
    missing = run(["-m", "comfy_memx", "--leak-mode"])
    assert missing.returncode == 2 and "needs a value" in missing.stderr


def test_help_lists_every_option():
    out = run(["-m", "comfy_memx", "--help"])
    assert out.returncode == 0
    for flag in ("--leak-mode", "--events", "--disable", "--leak-budget"):
        assert flag in out.stdout
