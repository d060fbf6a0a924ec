"""Stand-in for ComfyUI 0.27.0 ``comfy/memory_management.py`` (RAM-cache release hook and alignment helper).

``execution.PromptExecutor`` installs the cache's release callback here for the duration of a prompt;
``pin_memory`` calls :func:`extra_ram_release` before pinning.  DynamicVRAM (comfy-aimdo) is never enabled.
"""
aimdo_enabled = False

extra_ram_release_callback = None
RAM_CACHE_HEADROOM = 0


def set_ram_cache_release_state(callback, headroom):
    """Install (or clear, with None) the cache callback that frees RAM, and the RAM headroom in bytes."""
    global extra_ram_release_callback, RAM_CACHE_HEADROOM
    extra_ram_release_callback = callback
    RAM_CACHE_HEADROOM = max(0, int(headroom))


def extra_ram_release(target, free_active=False):
    """Ask the installed cache callback to free RAM down to ``target`` headroom; returns its result or 0."""
    if extra_ram_release_callback is None:
        return 0
    return extra_ram_release_callback(target, free_active=free_active)


def vram_aligned_size(tensor):
    """Bytes of a tensor (or list of tensors, None skipped), each rounded up to 1 KiB as the allocator would."""
    tensors = tensor if isinstance(tensor, (list, tuple)) else [tensor]
    return sum((t.nbytes + 1023) // 1024 * 1024 for t in tensors if t is not None)
