"""Imported by the ``comfy_memx.pth`` interpreter-startup line when ``COMFY_MEMX`` is set to something non-false.

With ``COMFY_MEMX`` unset the .pth line only reads ``os.environ`` and never imports this module.
"""

from comfy_memx.core.bootstrap import bootstrap_quietly

bootstrap_quietly("env")
