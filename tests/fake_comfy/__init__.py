"""ComfyUI-shaped stand-ins for the tests (see README.md): import helpers re-exported from :mod:`.loader`."""
from .loader import (PACKS_DIR, SHAPES, make_model, make_patcher, purge_fake_comfy, shape_paths,  # noqa: F401
                     shape_root, use_fake_comfy)
