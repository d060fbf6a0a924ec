"""Stand-in for the ``comfy`` package of a ComfyUI tree (see tests/fake_comfy/README.md)."""
