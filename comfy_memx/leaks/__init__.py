"""Answering ComfyUI's leak warnings: who loaded the leaked model, and (strict mode) what still holds it.

``watch`` (the reports around ``cleanup_models_gc``, once per leaked model), ``unwarned`` (the leaks ComfyUI never
warns about), ``holders`` (the engine that names the reference chains keeping an object alive), ``gate`` (the holder
searches that no prompt pays for: one at a time, within ``COMFY_MEMX_SEARCH_CPU``) and ``release`` (cutting a pack's
cache entry, on ComfyUI's prompt worker between prompts).
"""
