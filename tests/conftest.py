"""Shared fixtures: comfy_memx's internal errors are re-raised here, and every test starts from a clean state.

tests/ goes first on ``sys.path`` (memx_helpers, fake_comfy, ...), the checkout last (the bench package)."""

import os
import sys

import pytest

os.environ["COMFY_MEMX_RAISE_INTERNAL"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# the checkout, last: tests import bench as a package, and an installed comfy_memx (the wheel) still comes first
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from comfy_memx.core.state import STATE  # noqa: E402

try:
    from fake_comfy.fixtures import fake_comfy, fake_comfy_0270, fake_comfy_0364  # noqa: E402,F401
except ImportError:  # the stand-ins are optional for unit tests of the core
    pass


@pytest.fixture(autouse=True)
def clean_memx_state():
    """Re-raise internal errors, and reset all of comfy_memx's process state after each test."""
    STATE.errors.raise_internal = True
    yield
    STATE.reset()
    STATE.errors.raise_internal = True
