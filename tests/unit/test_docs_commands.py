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
    """The README and the install page say the suite's time that docs/development.md measured, in the same figures."""
    development = " ".join((ROOT / "docs" / "development.md").read_text(encoding="utf-8").split())
    measured = re.search(r"takes about (\d+) minutes on 2 cores and (\d+) under load", development)
    assert measured, "docs/development.md gives no measured suite time"
    for page in ("README.md", "docs/install.md"):
        said = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        stated = re.search(r"about (\d+) minutes on 2 cores, (\d+) under load", said)
        assert stated and stated.groups() == measured.groups(), (page, stated and stated.groups(), measured.groups())


def test_every_commands_help_is_plain_text(capsys):
    """``--help`` prints to a terminal: no reStructuredText backticks from the docstrings it is made of."""
    for name, module in COMMANDS.items():
        with pytest.raises(SystemExit):
            importlib.import_module(module).main(["--help"])
        shown = capsys.readouterr().out
        assert f"python -m comfy_memx {name}" in shown and "``" not in shown, (name, shown)


#: settings whose effect only the launcher has (it checks them when ComfyUI exits): a command using one has no
#: ``COMFY_MEMX=1`` or node-pack form
LAUNCHER_ONLY = {"COMFY_MEMX_LEAK_FAIL"}


def code_blocks(text):
    """The fenced code blocks of a page, each as a list of lines with ``\\`` continuations joined."""
    blocks, block = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if block is not None:
                blocks.append(block)
            block = None if block is not None else []
        elif block is not None:
            if block and block[-1].endswith("\\"):
                block[-1] = block[-1][:-1].rstrip() + " " + line.strip()
            else:
                block.append(line)
    return blocks


def start_settings(line):
    """``(form, {COMFY_MEMX_* setting: value})`` of a ComfyUI start command: ``launcher`` (``python -m comfy_memx
    ... main.py``: its leading variables and its options), ``env`` (``COMFY_MEMX=1 ... python main.py``), ``pack``
    (``... python main.py`` with settings and no ``COMFY_MEMX=1``); None for any other line or a synopsis."""
    from comfy_memx.core.config import SETTINGS
    words = line.split("#", 1)[0].split()
    if "[" in line or not any(word.endswith("main.py") for word in words):
        return None
    settings, at = {}, 0
    while at < len(words) and re.fullmatch(r"COMFY_MEMX\w*=\S*", words[at]):
        name, _, value = words[at].partition("=")
        settings[name] = value
        at += 1
    rest = words[at:]
    if rest[:3] == ["python", "-m", "comfy_memx"]:
        flags = {setting.flag: setting.env for setting in SETTINGS}
        options = rest[3:next(i for i, word in enumerate(rest) if word.endswith("main.py"))]
        for flag, value in zip(options[::2], options[1::2]):
            settings[flags[flag]] = value
        return "launcher", settings
    if rest[:2] != ["python", "main.py"]:
        return None
    if settings.pop("COMFY_MEMX", None) == "1":
        return "env", settings
    return ("pack", settings) if settings else None


def test_every_start_command_with_settings_is_shown_in_all_three_forms():
    """A launcher command with settings in the README or docs comes, in the same code block, with its ``COMFY_MEMX=1``
    form and its node-pack form (ComfyUI's plain start command) carrying the same settings: a user of each install
    kind finds the command that works for theirs."""
    missing, seen = [], 0
    for path, text in doc_texts().items():
        for block in code_blocks(text):
            forms = [found for found in map(start_settings, block) if found]
            for form, settings in forms:
                if form != "launcher" or not settings or LAUNCHER_ONLY & set(settings):
                    continue
                seen += 1
                for other in ("env", "pack"):
                    if (other, settings) not in forms:
                        missing.append(f"{path}: no {other} form of the launcher command with {settings}")
    assert seen >= 4, "no launcher command with settings found: the parser no longer reads the docs"
    assert missing == [], "\n".join(missing)


def test_start_settings_reads_each_form():
    launcher = "COMFY_MEMX_RELEASE=ask python -m comfy_memx --leak-mode strict ComfyUI/main.py --listen 0.0.0.0"
    assert start_settings(launcher) == ("launcher", {"COMFY_MEMX_RELEASE": "ask", "COMFY_MEMX_LEAK_MODE": "strict"})
    assert start_settings("COMFY_MEMX=1 COMFY_MEMX_RELEASE=ask python main.py  # x") == (
        "env", {"COMFY_MEMX_RELEASE": "ask"})
    assert start_settings("COMFY_MEMX_RELEASE=ask python main.py") == ("pack", {"COMFY_MEMX_RELEASE": "ask"})
    assert start_settings("python -m comfy_memx [memx options] [--] path/to/ComfyUI/main.py") is None
    assert start_settings("python -m comfy_memx free --url http://127.0.0.1:8188") is None
