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

RSS and ``malloc_trim`` are :mod:`comfy_memx.core.process`'s (a release reads them too).
"""


from comfy_memx.core.process import rss_bytes, trim, trim_unavailable  # noqa: F401  (the receipts' and metrics')


def held_bytes(rows):
    """Bytes of RAM that the live models of ``rows`` (``/memx/models`` rows) hold: their CPU-resident weights."""
    return sum(int(nbytes) for row in rows for device, nbytes in (row.get("bytes_by_device") or {}).items()
               if str(device).startswith("cpu"))
