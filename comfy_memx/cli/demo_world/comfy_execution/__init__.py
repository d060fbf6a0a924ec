"""Test stand-in for ComfyUI's ``comfy_execution`` package."""
