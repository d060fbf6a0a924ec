"""The stand-in ComfyUI: a small ComfyUI-shaped tree for ``python -m comfy_memx demo``, no ComfyUI or GPU.

This folder is a ComfyUI 0.27.0 root (``comfy/``, ``comfy_execution/``, ``execution.py``, ``nodes.py``, ``main.py``,
``server.py``, ...) and the base every stand-in version shares: each module holds what all versions have, and a
version's differences are its version layer (``version_layer/`` here for 0.27.0, ``tests/fake_comfy/v0_3_64`` for
0.3.64), joined at import by ``stand_in_version.py``.  The demo puts the folder first on ``sys.path`` so that
comfy_memx's patches find the module names they wrap exactly as in ComfyUI; the tests run it as their ComfyUI shapes
(``tests/fake_comfy``) and the benches start it as a server.  ``packs/`` holds the demo's custom-node pack, copied
under a ``custom_nodes`` folder before it loads.  The "GPU" is simulated: a load moves no bytes to a device, it only
counts them against ``comfy.model_management.SIM_VRAM_TOTAL``.  Written by the comfy_memx authors from ComfyUI's
published behaviour; it contains no ComfyUI code.  comfy_memx itself never imports it; only the demo, the tests and
the benches do.
"""
