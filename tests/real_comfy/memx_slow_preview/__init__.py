"""A node that takes its time with the MODEL it is given before passing it on (a preview, a download, a heavy
pre-pass: what makes a node slow), the way pack authors write one: it holds the ModelPatcher in its frame for
``seconds`` and logs when it starts and ends, so that a test knows a prompt is in it.

V1 node API, so the same code loads in ComfyUI 0.3.64, 0.27.0 and 0.33.0.
"""

import logging
import time


class MemxSlowPreview:
    """Hold the MODEL for ``seconds``, then pass it on unchanged."""

    CATEGORY = "memx/testing"
    RETURN_TYPES = ("MODEL",)
    FUNCTION = "preview"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",),
                             "seconds": ("FLOAT", {"default": 5.0, "min": 0.0, "max": 120.0, "step": 0.5})}}

    def preview(self, model, seconds):
        logging.info("memx_slow_preview: previewing %s for %.1f s", type(model.model).__name__, seconds)
        time.sleep(seconds)
        logging.info("memx_slow_preview: done at %.6f", time.time())
        return (model,)


NODE_CLASS_MAPPINGS = {"MemxSlowPreview": MemxSlowPreview}
