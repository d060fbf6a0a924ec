"""The version of comfy_memx, in a module that imports nothing (read by setup.py and every part)."""

__version__ = "0.2.0"
