"""What the patch modules call of the leak wing (``patches/model_management.py``'s ``cleanup_models_gc``): one
small front over ``leaks.watch``.

:func:`suspects` (the loaded entries whose patcher is gone while the module lives, before ComfyUI's collection),
:func:`before_collect` and :func:`after_collect` (the report of the ones that survive it).
"""

from comfy_memx.leaks.watch import after_collect, before_collect, suspects  # noqa: F401
