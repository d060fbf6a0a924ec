"""Tell a Python leak from allocator retention: process RSS, bytes that live models hold in RAM, and ``malloc_trim``.

After ComfyUI frees its models, the process's resident memory (RSS) often stays high: the C allocator keeps freed
pages for reuse instead of handing them back to the kernel (Impact-Pack users call ``malloc_trim`` by hand).  A
``/memx/free`` receipt therefore carries:

* ``rss_before`` / ``rss_after`` (the worker's collection done) / ``rss_after_trim``;
* ``held_bytes``: what the models comfy_memx still knows hold in RAM (their CPU-resident weights), i.e. what a
  Python holder keeps;
* ``trim``: the bytes that ``malloc_trim(0)`` returned to the kernel (``rss_after - rss_after_trim``), i.e. what the
  allocator was keeping, and how long it took; on by default, ``COMFY_MEMX_TRIM=0`` turns it off, and off Linux or
  without glibc it is skipped with the reason.

RSS is read by :func:`comfy_memx.core.process.rss_bytes`.
"""

import ctypes
import ctypes.util
import platform
import sys
import time

from comfy_memx.core.process import rss_bytes  # noqa: F401  (the receipts' and metrics' RSS)
from comfy_memx.core.state import STATE


def trim_unavailable():
    """Why ``malloc_trim`` cannot run here (a sentence), or None when it can."""
    if not STATE.config.trim:
        return "COMFY_MEMX_TRIM=0"
    if not sys.platform.startswith("linux"):
        return f"malloc_trim is glibc's; this is {sys.platform}"
    if platform.libc_ver()[0] != "glibc":
        return "malloc_trim is glibc's; this Python does not run on glibc"
    if _malloc_trim() is None:
        return "glibc has no malloc_trim here"
    return None


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function


def trim():
    """Run ``malloc_trim(0)``; returns ``{"returned_bytes", "seconds", "rss_after_trim"}`` or ``{"skipped": why}``."""
    why = trim_unavailable()
    if why is not None:
        return {"skipped": why}
    before = rss_bytes()
    started = time.perf_counter()
    _malloc_trim()(0)
    seconds = time.perf_counter() - started
    after = rss_bytes()
    returned = max(0, before - after) if before is not None and after is not None else None
    return {"returned_bytes": returned, "seconds": round(seconds, 4), "rss_after_trim": after}


def held_bytes(rows):
    """Bytes of RAM that the live models of ``rows`` (``/memx/models`` rows) hold: their CPU-resident weights."""
    return sum(int(nbytes) for row in rows for device, nbytes in (row.get("bytes_by_device") or {}).items()
               if str(device).startswith("cpu"))
