"""The checkout's ``comfy_memx/patches/__init__.py``: ``comfy_memx.patches`` spans the checkout's top-level
``patches/`` folder, only its own checkout's, and a copy of the package without that folder gets nothing added.

Each case imports a copy of the package in a fresh ``python -S`` (nothing installed seen) and prints the package's
path and where one patch module came from.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
import comfy_memx.patches
from comfy_memx.core import discovery
try:
    import comfy_memx.patches.server as server
    origin = server.__file__
except ImportError:
    origin = None
print(json.dumps({"path": list(comfy_memx.patches.__path__), "server": origin, "names": list(discovery.patch_names()),
                  "top_level_patches": "patches" in sys.modules}))
"""


def make_copy(root, with_patches=True):
    """``root/comfy_memx`` (the checkout's package, its pointer included), and ``root/patches`` when asked."""
    shutil.copytree(ROOT / "comfy_memx", root / "comfy_memx", ignore=shutil.ignore_patterns("__pycache__"))
    if with_patches:
        shutil.copytree(ROOT / "patches", root / "patches", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def probe(*path_entries):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMFY_MEMX", "PYTHONPATH"))}
    env["PYTHONPATH"] = os.pathsep.join(map(str, path_entries))
    out = subprocess.run([sys.executable, "-S", "-c", PROBE], capture_output=True, text=True, timeout=120, env=env,
                         cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_a_checkout_spans_its_own_patches_folder(tmp_path):
    checkout = make_copy(tmp_path / "checkout")
    result = probe(checkout)
    assert result["path"] == [str(checkout / "comfy_memx" / "patches"), str(checkout / "patches")]
    assert result["server"] == str(checkout / "patches" / "server.py")
    assert result["names"] == list(probe_names()) and not result["top_level_patches"]


def test_a_copy_without_a_patches_folder_beside_it_gets_none_added(tmp_path):
    bare = make_copy(tmp_path / "bare", with_patches=False)
    elsewhere = make_copy(tmp_path / "elsewhere")   # another checkout later on sys.path: never borrowed
    result = probe(bare, elsewhere)
    assert result["path"] == [str(bare / "comfy_memx" / "patches")]
    assert result["server"] is None and result["names"] == [] and not result["top_level_patches"]


def test_a_patches_folder_that_is_no_package_is_not_added(tmp_path):
    checkout = make_copy(tmp_path / "checkout")
    (checkout / "patches" / "__init__.py").unlink()   # some other folder named patches
    assert probe(checkout)["path"] == [str(checkout / "comfy_memx" / "patches")]


def probe_names():
    """The patch module names of the checkout running the tests."""
    from comfy_memx.core import discovery
    return discovery.patch_names([str(ROOT / "patches")])
