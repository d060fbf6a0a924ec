"""Shared fixtures: comfy_memx's internal errors are re-raised here, and every test starts from a clean state."""

import os
import sys

import pytest

os.environ["COMFY_MEMX_RAISE_INTERNAL"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from comfy_memx import errors, importhook, leakwatch, registry, runtime  # noqa: E402

try:
    from fake_comfy.fixtures import fake_comfy, fake_comfy_0270, fake_comfy_0364  # noqa: E402,F401
except ImportError:  # the stand-ins are optional for unit tests of the core
    pass


@pytest.fixture(autouse=True)
def clean_memx_state():
    """Re-raise internal errors, and reset registry, runtime and leak reports around each test."""
    errors.RAISE_INTERNAL = True
    yield
    importhook.discard()
    registry.reset()
    leakwatch.reset()
    runtime.reset()
