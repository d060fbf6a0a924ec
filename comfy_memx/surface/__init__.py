"""The production surface: what a running ComfyUI shows about its model memory.

``readmodel`` (the one read-model every surface shows), ``routes`` (``/memx/models``, ``/memx/free``,
``/metrics`` on ComfyUI's own server, built with ``comfy_memx.routekit``), ``answers`` (the shared ``/memx/models``
answer), ``metrics`` (Prometheus), ``freeing`` (following a free request through ComfyUI's prompt worker, and its
receipt), ``timeline``, ``releases`` (the Released list's answer) and ``panel`` (the memory panel), ``retention``
(allocator retention).  Holder searches go through the leak wing's search gate (``leaks.gate``: one at a time, within a CPU budget); releases through its
release desk (``leaks.release.desk``: on ComfyUI's prompt worker, between prompts).
"""
