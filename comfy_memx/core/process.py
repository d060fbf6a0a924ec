"""This process's memory as the kernel, torch and ComfyUI count it, read without importing anything new.

``rss_bytes`` reads ``/proc/self/statm`` (a few microseconds) with psutil as the fallback; ``memory_snapshot`` adds
the CUDA bytes torch has allocated (only when torch is imported and CUDA is initialised: reading it never starts
CUDA) and ComfyUI's pinned host memory (``comfy.model_management.TOTAL_PINNED_MEMORY``, absent before 0.27.0).
"""

import os
import sys

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
