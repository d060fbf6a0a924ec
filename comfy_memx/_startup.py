"""Imported by the ``comfy_memx.pth`` interpreter-startup line when ``COMFY_MEMX`` is set to something non-false.

With ``COMFY_MEMX`` unset the .pth line only reads ``os.environ`` and never imports this module.  The .pth line runs
in every Python process of the environment (pip, a notebook, a test run): a ``COMFY_MEMX`` value that is neither
true nor false (``COMFY_MEMX=maybe``) is reported only in ComfyUI's own process (its ``main.py`` is being run), which
it leaves unpatched; any other process says nothing and activates nothing.
"""

import os
import sys

from comfy_memx.core import config
from comfy_memx.core.bootstrap import bootstrap_quietly


def comfyui_process(argv=None):
    """True when this interpreter runs ComfyUI's ``main.py`` (a ``main.py`` with ComfyUI's ``comfy`` folder next to
    it), as ``sys.argv`` already says while the .pth line runs."""
    argv = sys.argv if argv is None else argv
    script = argv[0] if argv else ""
    return (os.path.basename(script) == "main.py"
            and os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(script)), "comfy")))


if os.environ.get("COMFY_MEMX", "").strip().lower() in config.TRUE_WORDS or comfyui_process():
    bootstrap_quietly("env")
