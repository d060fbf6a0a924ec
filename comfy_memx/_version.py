"""The version of comfy_memx, in a module that imports nothing (read by every part; pyproject.toml holds the same
literal for the node registry, tests/unit/test_pyproject.py keeps them equal)."""

__version__ = "0.3.0"
