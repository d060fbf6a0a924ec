"""Every test under tests/real runs against a real ComfyUI tree: each gets the ``real`` marker (registered in
pyproject.toml), so ``-m real`` selects them and ``-m "not real"`` leaves them out.  The modules keep their own skip
when COMFY_MEMX_REAL_COMFYUI / COMFY_MEMX_REAL_PYTHON are not set."""

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    """Mark the items collected from this folder (the hook sees the whole session's items)."""
    for item in items:
        if str(item.fspath).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.real)
