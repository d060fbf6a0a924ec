"""The server driver of the real-ComfyUI tests (``tests/real_comfy/drive.py``), imported once."""

import importlib.util
import os

from bench.soak.config import REAL_COMFY


_drive = None


def drive():
    """``tests/real_comfy/drive.py``, imported once under a private name (it is not a package)."""
    global _drive
    if _drive is None:
        spec = importlib.util.spec_from_file_location("memx_soak_drive", os.path.join(REAL_COMFY, "drive.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _drive = module
    return _drive
