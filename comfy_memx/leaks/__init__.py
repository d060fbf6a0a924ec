"""Answering ComfyUI's leak warnings: who loaded the leaked model, and (strict mode) what still holds it.

``watch`` (the reports around ``cleanup_models_gc``, once per leaked model) and ``holders`` (the engine that names
the reference chains keeping an object alive).
"""
