"""Pytest fixtures for the fake ComfyUI shapes; tests/conftest.py re-exports them.

Each fixture imports its shape fresh, yields its ``comfy.model_management`` module and purges the shape again
afterwards, restoring ``sys.path``.
"""
import pytest

from .loader import purge_fake_comfy, use_fake_comfy


def _shape(version):
    mm = use_fake_comfy(version)
    try:
        yield mm
    finally:
        purge_fake_comfy()


@pytest.fixture(params=["0.3.64", "0.27.0"])
def fake_comfy(request):
    """``comfy.model_management`` of each shape in turn (the test runs once per ComfyUI version)."""
    yield from _shape(request.param)


@pytest.fixture
def fake_comfy_0364():
    """``comfy.model_management`` of the ComfyUI 0.3.64 shape."""
    yield from _shape("0.3.64")


@pytest.fixture
def fake_comfy_0270():
    """``comfy.model_management`` of the ComfyUI 0.27.0 shape."""
    yield from _shape("0.27.0")
