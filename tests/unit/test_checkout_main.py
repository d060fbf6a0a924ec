"""``python -m comfy_memx`` from the folder that holds a checkout named ``comfy_memx`` (a clone beside ComfyUI, or
``custom_nodes/`` itself): Python finds the checkout's node-pack ``__init__.py`` first, and the checkout's
``__main__.py`` must hand over to the real package instead of failing with "No module named comfy_memx.__main__"."""

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_python_m_from_the_checkouts_parent_folder_runs_the_real_package(tmp_path):
    checkout = tmp_path / "comfy_memx"
    checkout.mkdir()
    for name in ("__init__.py", "__main__.py"):
        shutil.copy(os.path.join(ROOT, name), checkout / name)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "comfy_memx", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m comfy_memx [options]") and "--release VALUE" in done.stdout
    assert "No module named" not in done.stderr
