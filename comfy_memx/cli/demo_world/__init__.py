"""The ComfyUI 0.27.0 stand-in: a small ComfyUI-shaped tree for ``python -m comfy_memx demo``, no ComfyUI or GPU.

This folder is a ComfyUI root (``comfy/``, ``comfy_execution/``, ``execution.py``, ``nodes.py``, ``main.py``,
``server.py``, ...), every module a plain file of its own.  The demo puts the folder first on ``sys.path`` so that
comfy_memx's patches find the module names they wrap exactly as in ComfyUI; the tests run it as their ComfyUI 0.27.0
shape (``tests/fake_comfy``, beside the 0.3.64 tree) and the benches start it as a server.  ``packs/`` holds the
demo's custom-node pack, copied under a ``custom_nodes`` folder before it loads.  The "GPU" is simulated: a load
moves no bytes to a device, it only counts them against ``comfy.model_management.SIM_VRAM_TOTAL``.  Written by the
comfy_memx authors from ComfyUI's published behaviour; it contains no ComfyUI code.  comfy_memx itself never imports
it; only the demo, the tests and the benches do.
"""
