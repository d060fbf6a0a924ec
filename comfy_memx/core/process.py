"""This process's memory as the kernel, torch and ComfyUI count it, read without importing anything new.

``rss_bytes`` reads ``/proc/self/statm`` (a few microseconds) with psutil as the fallback; ``memory_snapshot`` adds
the CUDA bytes torch has allocated (only when torch is imported and CUDA is initialised: reading it never starts
CUDA) and ComfyUI's pinned host memory (``comfy.model_management.TOTAL_PINNED_MEMORY``, absent before 0.27.0).
``trim`` hands the C allocator's free pages back to the kernel (glibc ``malloc_trim(0)``; ``COMFY_MEMX_TRIM=0``
turns it off): after a free or a release the allocator often keeps what Python let go.
"""

import ctypes
import ctypes.util
import os
import platform
import sys
import time

from comfy_memx.core.state import STATE

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes():
    """Resident set size of this process in bytes, or None when it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


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


def vram_bytes():
    """CUDA bytes torch has allocated in this process, or None when torch or CUDA is not in use here."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return None
        return int(cuda.memory_allocated())
    except Exception:
        return None


def pinned_bytes():
    """Pinned host memory ComfyUI counts (``TOTAL_PINNED_MEMORY``), or None where ComfyUI has no such figure."""
    value = getattr(sys.modules.get("comfy.model_management"), "TOTAL_PINNED_MEMORY", None)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def memory_snapshot():
    """``{"rss", "vram", "pinned"}`` in bytes now (None where a figure cannot be read)."""
    return {"rss": rss_bytes(), "vram": vram_bytes(), "pinned": pinned_bytes()}
