"""The production surface: what a running ComfyUI shows about its model memory.

``readmodel`` (the one read-model every surface shows), ``routes`` (``/memx/models``, ``/memx/free``,
``/metrics`` on ComfyUI's own server, built with ``comfy_memx.routekit``), ``answers`` (the shared ``/memx/models``
answer), ``gate`` (one holder search at a time, within a CPU budget), ``metrics`` (Prometheus), ``freeing``
(following a free request through ComfyUI's prompt worker, and its receipt), ``timeline``, ``releases`` (the
Released list's answer) and ``panel`` (the memory panel), ``retention`` (allocator retention).
"""
