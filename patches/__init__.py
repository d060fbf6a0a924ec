"""One module per ComfyUI area that comfy_memx wraps; installed as ``comfy_memx.patches``.

Each module follows the contract in ``_template.py``: ``NAME``, ``TARGET`` (the ComfyUI module it patches),
``SITES`` (dotted attribute names inside it, for feature detection without importing ComfyUI), ``patch(module)``
and ``unpatch(module)``.
"""
