"""What the README and docs tell a new user to type, checked: the node-pack user's command for the CLIs runs from a
pack folder with nothing installed, grep examples of ComfyUI logs show no colour codes, and the suite's time is the
one docs/development.md measured."""

import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from comfy_memx.cli.launcher import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PACK_FILES = ("__init__.py", "__main__.py", "comfy_memx", "patches", "pyproject.toml")


def doc_texts():
    """``{path: text}`` of the README and every page in docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return {str(page.relative_to(ROOT)): page.read_text(encoding="utf-8") for page in pages}


def test_the_readme_tells_a_node_pack_user_how_to_run_the_clis_and_that_command_works(tmp_path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    node_pack = readme.split("## Install it as a node pack")[1].split("\n## ")[0]
    [command] = re.findall(r"^cd ComfyUI/custom_nodes/comfy_memx && (python3 -m comfy_memx free .*)$", node_pack,
                           re.MULTILINE)
    pack = tmp_path / "ComfyUI" / "custom_nodes" / "comfy_memx"
    pack.mkdir(parents=True)
    for name in PACK_FILES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, pack / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, pack / name)
    # nothing installed (-S: no site-packages), nobody listening: the CLI runs and says it cannot reach the server
    argv = [sys.executable, "-S", *command.split()[1:-1], "http://127.0.0.1:9"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("COMFY_MEMX")}
    done = subprocess.run(argv, cwd=str(pack), capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2 and "comfy_memx free: cannot reach http://127.0.0.1:9" in done.stderr, done


def test_grep_examples_of_comfyui_logs_take_the_colour_codes_out():
    """ComfyUI 0.27 and newer colour each log line's level tag, in files too: a grep of a log shows them unless the
    example strips them, and no example output shows an escape code."""
    greps = []
    for path, text in doc_texts().items():
        assert "\x1b" not in text and "[0m" not in text, path
        greps += [(path, line) for line in text.splitlines() if re.search(r"\bgrep\b.*\.log\b", line)]
    assert greps, "no grep example of a log file found"
    for path, line in greps:
        assert "sed 's/\\x1b\\[[0-9;]*m//g'" in line, (path, line)


def test_the_readme_gives_the_suites_time_that_development_measured():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    development = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    said = " ".join(readme.split())
    assert "about 6 minutes on 2 idle cores, 15 under load" in said, "the README's suite time"
    assert "about 6 minutes on 2 idle cores and 15 under load" in " ".join(development.split())
    assert "11 when the machine is busy" not in said


def test_every_commands_help_is_plain_text(capsys):
    """``--help`` prints to a terminal: no reStructuredText backticks from the docstrings it is made of."""
    for name, module in COMMANDS.items():
        with pytest.raises(SystemExit):
            importlib.import_module(module).main(["--help"])
        shown = capsys.readouterr().out
        assert f"python -m comfy_memx {name}" in shown and "``" not in shown, (name, shown)
