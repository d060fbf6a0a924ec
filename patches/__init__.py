"""One module per ComfyUI area that comfy_memx wraps, imported as ``comfy_memx.patches.<area>``.

A wheel holds this folder as ``comfy_memx/patches/``; a checkout's ``comfy_memx/patches/__init__.py`` adds it to
that package's path.  This file holds only its docstring: only built packages run it (tests/unit/test_packaging.py).

Each module defines a subclass of :class:`comfy_memx.core.patching.Patch` (``name``, ``target``: the ComfyUI
module it patches, ``sites``: dotted attribute -> wrapper factory) and its instance ``PATCH``; ``_template.py``
is the skeleton.  The contract is in ``comfy_memx.core.patching`` and the contract tests enforce it.
"""
