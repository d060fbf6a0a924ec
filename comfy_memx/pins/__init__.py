"""Pinned host memory: a RAM/swap/cgroup-aware cap and a budget with most-recently-used eviction.

``host`` (what the host really has: RAM, disk swap vs zram, cgroup limits), ``cap`` (the cap rule and
``COMFY_MEMX_PIN_LIMIT``), ``budget`` (the bookkeeping and eviction decisions, per process or per host) and
``session`` (the glue between ComfyUI's pin functions and the budget, started once ComfyUI enabled pinning).
"""
