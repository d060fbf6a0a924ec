"""One layout for every install kind: what the wheel holds, what the package imports, where the suite runs.

Users install a wheel (``pip install .``, a Dockerfile) or run from a checkout; the tests must see what they see.
"""

import ast
import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import comfy_memx
from comfy_memx.core import discovery
from comfy_memx.core.errors import SetupError

ROOT = Path(__file__).resolve().parents[2]
INSTALL_KIND = os.environ.get("MEMX_TEST_INSTALL")  # set by .ci/run: "wheel" or "editable"


def source_modules():
    """``comfy_memx/...py`` names of the source tree: the package and ``patches/`` (packaged as comfy_memx.patches)."""
    names = set()
    for folder, prefix in ((ROOT / "comfy_memx", "comfy_memx/"), (ROOT / "patches", "comfy_memx/patches/")):
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder).as_posix()
            if "__pycache__" not in relative and not relative.startswith("patches/"):
                names.add(prefix + relative)
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(ROOT)], capture_output=True, text=True, timeout=300,
                           cwd=str(tmp_path_factory.mktemp("build-cwd")))
    assert build.returncode == 0, build.stderr[-3000:]
    [path] = out.glob("comfy_memx-*.whl")
    return path


def test_the_wheel_holds_every_module_of_the_source_tree_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {name for name in names if name.endswith(".py")}
    assert shipped == source_modules()
    assert "comfy_memx.pth" in names
    assert {"comfy_memx/fleet/alerts.yml", "comfy_memx/fleet/dashboard.json"} <= names  # data files (fleets)
    web = {f"comfy_memx/web/{path.name}" for path in (ROOT / "comfy_memx" / "web").iterdir() if path.is_file()}
    assert {"comfy_memx/web/memx_panel.js", "comfy_memx/web/memx_core.js", "comfy_memx/web/page.html"} <= web <= names
    assert not any(name.startswith(("tests/", "patches/", "bench/", "build_backend/")) for name in names)


def tracked_files(folder):
    """The files of ``folder`` (relative to the checkout) that git tracks, or every file in it outside a checkout."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", folder], capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout:
        return set(listed.stdout.split())
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / folder).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def test_the_wheel_holds_every_data_file_of_the_package(wheel):
    """Stage 2 of .ci/run runs only the tests a wheel can break (.ci/wheel-tests): that every other file of the
    package reaches the wheel is checked here, file by file (the demo world's ``custom_nodes/.keep`` only keeps its
    empty folder in git)."""
    data = {name for name in tracked_files("comfy_memx") if not name.endswith(".py")}
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("comfy_memx/")
               and not name.endswith(".py")}
    assert shipped == data - {"comfy_memx/cli/demo_world/custom_nodes/.keep"}


# Each module of comfy_memx that finds files by its own location (``__file__``) and what runs it against the wheel in
# .ci/run: a test file of .ci/wheel-tests, "demo" (stage 2 runs the demo) or "node pack" (the node-pack block, from a
# clone in custom_nodes/).  The checkout's pointer comfy_memx/patches/__init__.py is never in a wheel.
OWN_LOCATION_READERS = {
    "comfy_memx/cli/demo.py": "demo",
    "comfy_memx/cli/demo_world/folder_paths.py": "demo",
    "comfy_memx/cli/demo_world/stand_in_version.py": "demo",
    "comfy_memx/core/comfyui.py": "tests/unit/test_package_of_file.py",
    "comfy_memx/core/discovery.py": "tests/patches/test_patch_contract.py",
    "comfy_memx/fleet/__init__.py": "tests/unit/test_fleet_files.py",
    "comfy_memx/fleet/rules.py": "tests/unit/test_fleet_rules.py",
    "comfy_memx/fleet/runbooks.py": "tests/unit/test_fleet_rules.py",
    "comfy_memx/nodepack.py": "node pack",
    "comfy_memx/patches/__init__.py": "never in a wheel",
    "comfy_memx/surface/panel.py": "tests/patches/test_panel_routes.py",
}


def reads_own_location(path):
    """True when the module at ``path`` uses ``__file__`` (its own, or a module's attribute), not the string."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(node, ast.Name) and node.id == "__file__" or
               isinstance(node, ast.Attribute) and node.attr == "__file__" for node in ast.walk(tree))


def test_every_module_that_reads_its_own_location_is_run_against_the_wheel():
    readers = {path.relative_to(ROOT).as_posix() for folder in ("comfy_memx", "patches")
               for path in (ROOT / folder).rglob("*.py") if "__pycache__" not in path.parts and reads_own_location(path)}
    assert readers == set(OWN_LOCATION_READERS), ("a module that finds files by its own location behaves differently "
                                                  "installed: name the test of .ci/wheel-tests that runs it",
                                                  readers ^ set(OWN_LOCATION_READERS))
    listed = {line.strip() for line in (ROOT / ".ci" / "wheel-tests").read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#")}
    assert all((ROOT / test).is_file() for test in listed), listed
    tests = {where for where in OWN_LOCATION_READERS.values() if where.startswith("tests/")}
    assert tests <= listed, tests - listed


def test_the_wheels_patches_package_is_the_top_level_patches_folder(wheel):
    """comfy_memx.patches is built from patches/ alone: the checkout's pointer (comfy_memx/patches/__init__.py)
    never ships."""
    archive = zipfile.ZipFile(wheel)
    assert archive.read("comfy_memx/patches/__init__.py") == (ROOT / "patches" / "__init__.py").read_bytes()
    module = "model_management.py"
    assert archive.read(f"comfy_memx/patches/{module}") == (ROOT / "patches" / module).read_bytes()
    assert archive.read("comfy_memx.pth") == (ROOT / "comfy_memx.pth").read_bytes()


def test_the_wheels_record_lists_every_file_with_its_hash(wheel):
    """The build backend writes the wheel again to add comfy_memx.pth: its RECORD must still be exact (the wheel
    format's list of files, which pip installs and uninstalls by)."""
    archive = zipfile.ZipFile(wheel)
    [record_name] = [name for name in archive.namelist() if name.endswith(".dist-info/RECORD")]
    rows = {row[0]: row[1:] for row in csv.reader(io.StringIO(archive.read(record_name).decode("utf-8")))}
    assert set(rows) == set(archive.namelist())
    for name, (digest, size) in rows.items():
        if name == record_name:
            assert digest == size == ""
            continue
        data = archive.read(name)
        expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert (digest, size) == (f"sha256={expected}", str(len(data))), name


def test_the_tree_holds_no_symlink_and_the_checkout_imports_its_patches_from_patches():
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-s"], capture_output=True, text=True)
    if tracked.returncode == 0:
        assert [line for line in tracked.stdout.splitlines() if line.startswith("120000")] == []
        checkout_package = subprocess.run(["git", "-C", str(ROOT), "ls-files", "comfy_memx/patches"],
                                          capture_output=True, text=True).stdout.split()
        assert checkout_package == ["comfy_memx/patches/__init__.py"]   # the pointer, never a patch module
    import comfy_memx.patches.model_management
    if INSTALL_KIND != "wheel":
        assert Path(comfy_memx.patches.__file__).resolve() == ROOT / "comfy_memx" / "patches" / "__init__.py"
        assert Path(comfy_memx.patches.model_management.__file__).resolve() == ROOT / "patches" / "model_management.py"
    assert set(discovery.patch_names()) == {p.stem for p in (ROOT / "patches").glob("[!_]*.py")}


def test_the_two_package_files_of_comfy_memx_patches_run_no_code_of_their_own():
    """A checkout imports comfy_memx/patches/__init__.py, a wheel patches/__init__.py as comfy_memx.patches: the
    second holds only its docstring, so nothing differs between the two but the checkout's path."""
    body = ast.parse((ROOT / "patches" / "__init__.py").read_text(encoding="utf-8")).body
    assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)


def test_the_suite_runs_against_the_install_kind_ci_asked_for():
    here = Path(comfy_memx.__file__).resolve()
    if INSTALL_KIND == "wheel":
        assert ROOT not in here.parents and "site-packages" in here.parts, here
    elif INSTALL_KIND == "editable":
        assert here.parent == ROOT / "comfy_memx", here
    else:
        pytest.skip("MEMX_TEST_INSTALL is not set (.ci/run sets it for the editable and the wheel runs)")


def test_zero_patch_modules_is_an_error_naming_the_cause():
    with pytest.raises(SetupError, match="holds no patch module|is missing"):
        discovery.require_patches(())
    discovery.require_patches(("model_management",))


@pytest.fixture
def package_without_patches(tmp_path):
    """A copy of the installed package whose ``patches`` folder lost its modules (a broken install)."""
    copy = tmp_path / "site" / "comfy_memx"
    shutil.copytree(Path(comfy_memx.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__", "patches"))
    (copy / "patches").mkdir()
    (copy / "patches" / "__init__.py").write_text('"""the patch modules were lost"""\n')
    return copy.parent


def _run(args, site, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
    clean.update(env, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, env=clean,
                          cwd=str(site))


def test_the_launcher_exits_2_when_no_patch_module_is_installed(package_without_patches, tmp_path):
    script = tmp_path / "main.py"
    script.write_text("print('ComfyUI ran')\n")
    out = _run(["-m", "comfy_memx", str(script)], package_without_patches)
    assert out.returncode == 2 and "ComfyUI ran" not in out.stdout
    assert "holds no patch module" in out.stderr and "incomplete" in out.stderr


def test_the_env_flag_logs_one_error_and_runs_comfyui_unpatched_when_no_patch_module_is_installed(
        package_without_patches, tmp_path):
    out = _run(["-c", "import comfy_memx._startup; print('ComfyUI ran')"], package_without_patches, COMFY_MEMX="1")
    assert out.returncode == 0 and "ComfyUI ran" in out.stdout
    errors = [line for line in out.stderr.splitlines() if "comfy_memx" in line]
    assert len(errors) == 1 and "holds no patch module" in errors[0] and "NOT active" in errors[0]


@pytest.mark.parametrize("value", ["maybe", "2"])
def test_a_comfy_memx_value_neither_true_nor_false_is_reported_only_in_comfyuis_process(tmp_path, value):
    """The .pth line runs in every process of the environment: pip or a notebook must not print comfy_memx's error;
    ComfyUI's ``main.py`` reports it once and runs unpatched."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFY_MEMX")}
    env["COMFY_MEMX"] = value
    other = subprocess.run([sys.executable, "-c", "import comfy_memx._startup; print('other ran')"],
                           capture_output=True, text=True, timeout=120, env=env, cwd=str(tmp_path))
    assert other.returncode == 0 and "other ran" in other.stdout
    assert "comfy_memx" not in other.stderr, other.stderr
    comfyui = tmp_path / "ComfyUI"
    (comfyui / "comfy").mkdir(parents=True)
    (comfyui / "main.py").write_text("import comfy_memx._startup\nfrom comfy_memx.core.state import STATE\n"
                                     "print('ComfyUI ran', STATE.source)\n")
    ran = subprocess.run([sys.executable, str(comfyui / "main.py")], capture_output=True, text=True, timeout=120,
                         env=env, cwd=str(comfyui))
    assert ran.returncode == 0 and "ComfyUI ran None" in ran.stdout, ran.stdout + ran.stderr
    errors = [line for line in ran.stderr.splitlines() if "comfy_memx" in line]
    assert len(errors) == 1 and f"COMFY_MEMX='{value}' is not valid" in errors[0] and "NOT active" in errors[0]
