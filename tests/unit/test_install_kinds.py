"""Every install kind gives the same complete package, built from sources that have no symlink support.

The sources are the committed tree (HEAD) as a ``git -c core.symlinks=false clone`` (Git's default on Windows) and
as a ``git archive`` extract (what a zip download holds).  From each: the wheel holds every module of the source tree
and ``comfy_memx.pth``; ``pip install .`` (into a target folder), the wheel, ``pip install -e .`` in both of
setuptools' editable modes (into a prefix, its .pth files processed) and the bare checkout on ``sys.path`` all import
``comfy_memx.patches.*`` from the right folder, find every patch module, and never import a top-level ``patches``.
Builds run under pip's build isolation (pyproject's ``[build-system]``: the newest setuptools the index has, as
users get it).  Each import runs in ``python -S`` so that the environment running the tests (which has its own
comfy_memx) is not seen.
"""

import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, os, site, sys
for folder in sys.argv[1:]:
    site.addsitedir(folder)
import comfy_memx.patches.model_management, comfy_memx.patches.server
from comfy_memx.core import discovery
mappings = [getattr(sys.modules.get(getattr(f, "__module__", "")), "MAPPING", None) for f in sys.meta_path]
editable = [m.get("comfy_memx.patches") for m in mappings if isinstance(m, dict)]
print(json.dumps({"package": os.path.dirname(comfy_memx.__file__), "editable_mapping": editable,
                  "patches": os.path.dirname(comfy_memx.patches.server.__file__),
                  "patches_source": os.path.dirname(os.path.realpath(comfy_memx.patches.server.__file__)),
                  "patches_init": os.path.realpath(comfy_memx.patches.__file__),
                  "names": sorted(discovery.patch_names()), "top_level_patches": "patches" in sys.modules}))
"""


def _git(*args, **kwargs):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, timeout=120, **kwargs)


def _committed_tree_available():
    if shutil.which("git") is None:
        return False
    return _git("rev-parse", "--verify", "HEAD").returncode == 0


pytestmark = pytest.mark.skipif(not _committed_tree_available(), reason="needs git and a checkout with commits")


@pytest.fixture(scope="module", params=["symlinks-false-clone", "git-archive"])
def source(request, tmp_path_factory):
    """The committed tree as a clone without symlink support, or as an archive extract."""
    target = tmp_path_factory.mktemp(request.param) / "comfy_memx-main"
    if request.param == "symlinks-false-clone":
        out = subprocess.run(["git", "-c", "core.symlinks=false", "clone", "-q", str(ROOT), str(target)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
    else:
        archive = _git("archive", "--format=tar", "HEAD")
        assert archive.returncode == 0, archive.stderr
        target.mkdir()
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(target)
    return target


def only_once(source, why):
    """Skip on the clone: a build whose result cannot depend on how the files got there runs on the archive only."""
    if source.parent.name.startswith("symlinks-false-clone"):
        pytest.skip(f"built from the git-archive extract only ({why})")


def patch_module_names(source):
    return sorted(p.stem for p in (source / "patches").glob("[!_]*.py"))


def source_modules(source):
    """``comfy_memx/...py`` names a complete package has: comfy_memx/ itself and patches/ as comfy_memx/patches/."""
    names = set()
    for folder, prefix in ((source / "comfy_memx", "comfy_memx/"), (source / "patches", "comfy_memx/patches/")):
        names.update(prefix + p.relative_to(folder).as_posix() for p in folder.rglob("*.py")
                     if "__pycache__" not in p.parts)
    return names


def pip(*args, cwd):
    out = subprocess.run([sys.executable, "-m", "pip", "-q", *args], capture_output=True, text=True, timeout=300,
                         cwd=str(cwd))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]


def running_environments_comfy_memx():
    """Where the environment running the tests has comfy_memx installed (None: not installed)."""
    out = subprocess.run([sys.executable, "-m", "pip", "show", "-f", "comfy_memx"], capture_output=True, text=True,
                         timeout=120)
    return out.stdout if out.returncode == 0 else None


def probe(*site_dirs, pythonpath=None, cwd):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMFY_MEMX", "PYTHONPATH"))}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run([sys.executable, "-S", "-c", PROBE, *map(str, site_dirs)], capture_output=True, text=True,
                         timeout=120, env=env, cwd=str(cwd))
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_the_source_has_no_symlink_and_no_patch_module_inside_comfy_memx(source):
    assert [p for p in source.rglob("*") if p.is_symlink()] == []
    assert sorted(p.name for p in (source / "comfy_memx" / "patches").iterdir()) == ["__init__.py"]


@pytest.fixture(scope="module")
def wheel(source):
    """The wheel built from ``source`` (once per source), after an earlier build left a module the sources no longer
    have in setuptools' build folder: the backend empties it, so the wheel holds only the sources' modules."""
    stale = source / "build" / "lib" / "comfy_memx" / "moved_away.py"
    stale.parent.mkdir(parents=True)
    stale.write_text('"""a module an earlier build copied; the sources no longer have it"""\n')
    dist = source.parent / "dist"
    pip("wheel", "--no-deps", "-w", str(dist), str(source), cwd=source.parent)
    [built] = dist.glob("comfy_memx-*.whl")
    return built


def test_the_wheel_built_from_it_holds_the_whole_package_and_the_startup_line(source, wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n for n in names if n.endswith(".py")} == source_modules(source)
    assert "comfy_memx.pth" in names


def test_the_sdist_builds_a_wheel_that_holds_the_whole_package_and_the_startup_line(source, tmp_path):
    """An sdist (what an index serves beside the wheel) through the in-tree backend, then the wheel pip builds
    from it: the same files as the wheel built from the sources."""
    only_once(source, "the sdist lists files, the same in both sources")
    build = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, 'build_backend'); "
                            "import comfy_memx_build; print(comfy_memx_build.build_sdist(sys.argv[1]))",
                            str(tmp_path / "sdist")], capture_output=True, text=True, timeout=300, cwd=str(source))
    assert build.returncode == 0, build.stderr[-3000:]
    with tarfile.open(tmp_path / "sdist" / build.stdout.split()[-1]) as tar:
        tar.extractall(tmp_path / "unpacked")
    [unpacked] = (tmp_path / "unpacked").iterdir()
    pointer = unpacked / "comfy_memx" / "patches" / "__init__.py"
    os.utime(pointer, (pointer.stat().st_atime, pointer.stat().st_mtime + 60))   # newer: copied over a data file
    pip("wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(unpacked), cwd=tmp_path)
    [built] = (tmp_path / "dist").glob("comfy_memx-*.whl")
    archive = zipfile.ZipFile(built)
    names = set(archive.namelist())
    assert {n for n in names if n.endswith(".py")} == source_modules(source) and "comfy_memx.pth" in names
    # the sdist lists the checkout's pointer too (as data of comfy_memx): it must not replace the package's own init
    assert archive.read("comfy_memx/patches/__init__.py") == (source / "patches" / "__init__.py").read_bytes()


def test_the_wheel_installed_imports_the_patches_from_the_installed_package(source, wheel, tmp_path):
    pip("install", "--no-deps", "--ignore-installed", "--target", str(tmp_path / "site"), str(wheel), cwd=tmp_path)
    result = probe(tmp_path / "site", cwd=tmp_path)
    assert result["patches"] == str(tmp_path / "site" / "comfy_memx" / "patches")
    assert result["names"] == patch_module_names(source) and not result["top_level_patches"]
    assert (tmp_path / "site" / "comfy_memx.pth").is_file()
    installed_init = tmp_path / "site" / "comfy_memx" / "patches" / "__init__.py"
    assert installed_init.read_bytes() == (source / "patches" / "__init__.py").read_bytes()


def test_pip_install_dot_imports_the_patches_from_the_installed_package(source, tmp_path):
    pip("install", "--no-deps", "--ignore-installed", "--target", str(tmp_path / "site"), str(source),
        cwd=tmp_path)
    result = probe(tmp_path / "site", cwd=tmp_path)
    assert result["package"] == str(tmp_path / "site" / "comfy_memx")
    assert result["patches"] == str(tmp_path / "site" / "comfy_memx" / "patches")
    assert result["names"] == patch_module_names(source) and not result["top_level_patches"]


@pytest.mark.parametrize("mode", ["lenient", "strict"])
def test_the_editable_install_imports_the_patches_from_the_sources_patches_folder(source, tmp_path, mode):
    """lenient (pip's default): setuptools' finder maps comfy_memx to the sources, whose comfy_memx/patches/__init__.py
    adds patches/ to the package's path; strict: a tree of links to the sources' files, patches/ at
    comfy_memx/patches/ there.  Either way the code run is the sources' patches/, and comfy_memx.pth is installed."""
    if mode == "strict":
        only_once(source, "the link tree is made from the same files")
    work = tmp_path / "src"
    shutil.copytree(source, work)   # an editable install writes build files next to the sources
    prefix = tmp_path / "prefix"
    before = running_environments_comfy_memx()
    # --ignore-installed: without it pip uninstalls the comfy_memx of the environment running the tests
    pip("install", "--no-deps", "--ignore-installed", "--prefix", str(prefix), "-e", str(work),
        "--config-settings", f"editable_mode={mode}", cwd=tmp_path)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(prefix), "platbase": str(prefix)}))
    assert (purelib / "comfy_memx.pth").read_bytes() == (work / "comfy_memx.pth").read_bytes()
    assert running_environments_comfy_memx() == before   # the environment running the tests kept its own
    result = probe(purelib, cwd=tmp_path)
    assert result["patches_source"] == str(work / "patches")
    assert result["names"] == patch_module_names(source) and not result["top_level_patches"]
    if mode == "lenient":
        assert result["package"] == str(work / "comfy_memx") and result["patches"] == str(work / "patches")
        assert result["patches_init"] == str(work / "comfy_memx" / "patches" / "__init__.py")
        assert result["editable_mapping"] == [str(work / "patches")]   # setuptools' own map, for the same folder
    else:
        [links] = (work / "build").glob("__editable__.comfy_memx-*")
        assert result["package"] == str(links / "comfy_memx")
        assert result["patches"] == str(links / "comfy_memx" / "patches")
        assert result["patches_init"] == str(work / "patches" / "__init__.py")


def test_the_bare_checkout_on_sys_path_imports_the_patches_from_its_patches_folder(source, tmp_path):
    result = probe(pythonpath=source, cwd=tmp_path)
    assert result["package"] == str(source / "comfy_memx") and result["patches"] == str(source / "patches")
    assert result["patches_init"] == str(source / "comfy_memx" / "patches" / "__init__.py")
    assert result["names"] == patch_module_names(source) and not result["top_level_patches"]
