"""The demo world's stand-in for ComfyUI's ``comfy`` package."""
