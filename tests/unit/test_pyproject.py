"""pyproject.toml: one version (the literal the node registry needs equals comfy_memx/_version.py), the registry's
fields as docs.comfy.org/registry/specifications describes them, the build (setuptools, unpinned, through the
in-tree backend), and a requirements.txt (what ComfyUI-Manager pip-installs into ComfyUI's environment) that never
pulls torch or anything ComfyUI already has."""

import re
from pathlib import Path

import pytest

from comfy_memx import __version__

tomllib = pytest.importorskip("tomllib")
ROOT = Path(__file__).resolve().parents[2]
# ComfyUI's own requirements.txt (0.3.64, 0.27.0, 0.33.0) has these; requirements.txt must not repeat them
COMFYUI_HAS = {"torch", "torchvision", "torchaudio", "torchsde", "safetensors", "psutil", "aiohttp", "numpy"}


@pytest.fixture(scope="module")
def project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_version_literal_is_the_packages_version_and_semantic(project):
    assert project["project"]["version"] == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_the_node_id_follows_the_registrys_rules(project):
    name = project["project"]["name"]
    assert len(name) < 100 and re.fullmatch(r"[A-Za-z][A-Za-z0-9]*([-_.][A-Za-z0-9]+)*", name)
    assert "comfyui" not in name.lower()


def test_the_registry_table_has_its_fields_and_no_second_web_folder(project):
    comfy = project["tool"]["comfy"]
    assert {"PublisherId", "DisplayName", "Icon", "includes"} <= set(comfy)
    assert comfy["DisplayName"] and isinstance(comfy["includes"], list)
    assert "web" not in comfy   # the pack's WEB_DIRECTORY serves the panel; a `web` key would load it twice


def test_the_build_uses_setuptools_with_a_lower_bound_only_through_the_in_tree_backend(project):
    """No upper pin: the backend uses setuptools' public hooks and table only (setup.py passes nothing, no command
    subclass)."""
    build = project["build-system"]
    [requirement] = build["requires"]
    assert re.fullmatch(r"setuptools>=\d+(\.\d+)*", requirement)
    [folder] = build["backend-path"]
    assert (ROOT / folder / (build["build-backend"] + ".py")).is_file()
    setup_calls = re.findall(r"^setup\((.*)\)\s*$", (ROOT / "setup.py").read_text(), flags=re.M)
    assert setup_calls == [""]   # the table is the one source: setup() gets no argument
    assert project["tool"]["setuptools"]["package-dir"] == {"comfy_memx.patches": "patches"}


def test_requirements_txt_lists_nothing_comfyui_has_and_never_torch():
    lines = [line.split("#", 1)[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    names = {re.split(r"[<>=!~\[; ]", line, 1)[0].lower().replace("_", "-") for line in lines if line}
    assert not names & COMFYUI_HAS and not any(name.startswith("torch") for name in names)
