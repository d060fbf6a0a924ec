"""A small ComfyUI-shaped world for ``python -m comfy_memx demo``: no ComfyUI, no GPU needed.

The demo puts this folder first on ``sys.path`` so that comfy_memx's patches find the module names they wrap
(``comfy.model_management``, ``execution``) exactly as in ComfyUI.  Written by the comfy_memx authors from the
published behaviour of ComfyUI's model management (LoadedModel, load_models_gpu, free_memory, the two-stage leak
check of cleanup_models_gc); it contains no ComfyUI code.  The "GPU" is simulated: a load moves no bytes, it only
counts them against ``SIM_VRAM_TOTAL``.  It is not used by comfy_memx itself, only by the demo.
"""
