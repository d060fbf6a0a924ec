"""The production surface: what a running ComfyUI shows about its model memory.

``readmodel`` (the one read-model every surface shows), ``routes`` (``/memx/models``, ``/memx/free``,
``/metrics`` on ComfyUI's own server), ``metrics`` (Prometheus) and ``freeing`` (following a free request through
ComfyUI's prompt worker, and its receipt).
"""
