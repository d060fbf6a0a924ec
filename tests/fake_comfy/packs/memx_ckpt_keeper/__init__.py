"""A custom-node pack of our own that keeps checkpoints the way published checkpoint-caching packs do.

Its loader node calls ComfyUI's own ``comfy.sd.load_checkpoint_guess_config`` and keeps what it answered as
``(ckpt_name, model, clip, vae, [keys])`` tuples in a module-level dict of lists (``loaded_objects["ckpt"]``), and
hands a cached checkpoint out again for the same name.  As such packs do, it puts its own folder on ``sys.path`` and
imports that cache module under a top-level name (``memx_ckpt_keeper_cache``), while ComfyUI registers the pack
itself under its folder's path.  No sampler needs to run for the checkpoint to stay: ``KeeperCacheInfo`` (the output
node of a workflow) only reports what the cache holds; the cache module's ``forget()`` empties it.
Works on the stand-ins and on real ComfyUI (0.3.64, 0.27.0, 0.33.0).
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.append(_HERE)

import memx_ckpt_keeper_cache as cache  # noqa: E402  (a top-level module of this pack, found on sys.path)


class KeeperCheckpointLoader:
    """Loads ``ckpt_name`` from ComfyUI's checkpoints folder, once: later calls answer the cached objects."""
    CATEGORY = "memx/testing"
    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ckpt_name": ("STRING", {"default": ""}), "key": ("STRING", {"default": "keeper"})}}

    def load(self, ckpt_name, key="keeper"):
        return cache.load_checkpoint(ckpt_name, key)


class KeeperCacheInfo:
    """Reports how many checkpoints the cache holds (the output node: nothing samples the MODEL it is given)."""
    CATEGORY = "memx/testing"
    RETURN_TYPES = ("STRING",)
    FUNCTION = "info"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    def info(self, model):
        return (", ".join(entry[0] for entry in cache.loaded_objects["ckpt"]),)


NODE_CLASS_MAPPINGS = {"KeeperCheckpointLoader": KeeperCheckpointLoader, "KeeperCacheInfo": KeeperCacheInfo}
