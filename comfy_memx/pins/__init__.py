"""Pinned host memory: a RAM/swap/cgroup-aware cap and a budget with most-recently-used eviction that follows
ComfyUI's own pin books.

Host and cap: ``host`` (what the host really has: RAM, disk swap vs zram, cgroup limits; the cached RAM gauge),
``cap`` (the cap rule and ``COMFY_MEMX_PIN_LIMIT``); the host scope shares the cap through ``core.hostshare``.
Bookkeeping: ``budget`` (decisions and eviction plans, per process or per host; standard library only).
Glue to ComfyUI, started once ComfyUI enabled pinning: ``session`` (life cycle), ``context`` (the process's pin
state, its locks and the rule for calling the budget), ``layout`` (where each ComfyUI version keeps its pins), ``owners`` (which model a pin belongs to),
``loadscope`` (the load in progress is never evicted), ``requests`` (pins asked of the budget), ``eviction``
(ComfyUI's own evictions), ``reconcile`` (the budget equals ComfyUI's counters), and ``api`` (what the patch
modules call).
"""

from comfy_memx.pins import cap  # noqa: F401  (registers the COMFY_MEMX_PIN_LIMIT check with core.config)
