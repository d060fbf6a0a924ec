"""Fixture: a module inside the fake ComfyUI root (``tests/holder_fixtures``), so it belongs to ``core``."""

CACHE = {}
