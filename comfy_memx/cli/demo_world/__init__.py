"""A small ComfyUI-shaped world for ``python -m comfy_memx demo``: no ComfyUI, no GPU needed.

The demo puts this folder first on ``sys.path`` so that comfy_memx's patches find the module names they wrap
(``comfy.model_management``, ``execution``) exactly as in ComfyUI.  The world is the ComfyUI 0.27.0 stand-in that
the tests run too: every module here runs its source from ``standin/`` (the one source of the stand-ins, shared with
``tests/fake_comfy``), and ``nodes.py`` and ``execution.py`` add what the demo needs on top (a synchronous pack
loader, an executor without a server, the demo prompt's input names).  The "GPU" is simulated: a load moves no
bytes, it only counts them against ``comfy.model_management.SIM_VRAM_TOTAL``.  Written by the comfy_memx authors
from ComfyUI's published behaviour; it contains no ComfyUI code.  It is not used by comfy_memx itself, only by the
demo and the tests.
"""
