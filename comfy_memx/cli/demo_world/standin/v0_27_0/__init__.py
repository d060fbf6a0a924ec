"""What the ComfyUI 0.27.0 stand-in adds to ``shared/`` or does differently (run by ``extend``, never imported)."""
