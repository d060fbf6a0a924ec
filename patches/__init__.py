"""One module per ComfyUI area that comfy_memx wraps; installed (and, in a checkout, linked) as ``comfy_memx.patches``.

Each module defines a subclass of :class:`comfy_memx.core.patching.Patch` (``name``, ``target``: the ComfyUI
module it patches, ``sites``: dotted attribute -> wrapper factory) and its instance ``PATCH``; ``_template.py``
is the skeleton.  The contract is in ``comfy_memx.core.patching`` and the contract tests enforce it.
"""
