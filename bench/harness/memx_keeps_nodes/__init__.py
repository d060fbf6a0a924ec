"""A ComfyUI node pack whose checkpoint loaders keep every checkpoint they load, the way pack authors write such
caches: they call ComfyUI's own checkpoint loader and keep its ``(model, clip, vae)`` under a key of the workflow's
choosing (``bench.soak --workload pack-keeps``: does comfy_memx give back what a pack keeps of ComfyUI's own
objects, and does the pack keep working after it?).

``bench.soak --workload pack-keeps`` copies this folder into the ``custom_nodes/`` of each server it starts, so the
package comfy_memx names for these loaders is this folder's name, ``memx_keeps_nodes``. The caches:

* ``MemxKeepsCheckpointLoader``: a module-level dict, ``CHECKPOINTS``, of ``key -> (model, clip, vae)`` filled by
  ComfyUI's ``CheckpointLoaderSimple.load_checkpoint`` (the shape of Inspire-Pack's ``CheckpointLoaderSimpleShared``
  backend cache without its LRU bound, and of many "shared model" loaders);
* ``MemxKeepsLruCheckpointLoader``: a module-level function decorated with ``functools.lru_cache(maxsize=None)`` that
  calls ``comfy.sd.load_checkpoint_guess_config`` and returns its first three outputs.

Both are caches in the full sense: a key asked for again is served from the cache, and an entry that was cut (by
comfy_memx's release) is loaded again from the file, which gives the same weights. With the environment variable
``MEMX_KEEPS_NODES_CACHE=off`` they keep nothing (the dict is not written, the undecorated function is called): the
pack once its author fixed the leak, which the soak runs on plain ComfyUI as the memory baseline.

``MemxKeepsWitness`` passes a MODEL and a VAE through unchanged and notes their torch modules (and the CLIP's, when
the checkpoint had one) by weak reference under the prompt's key, whichever loader built them (this pack's or
another pack's, such as Inspire-Pack's); it also notes the modules' bytes. ``MemxKeepsCensus`` reports, from inside the server after a full collection, which noted modules
are alive (by key) and how many of ComfyUI's ModelPatcher and BaseModel objects exist: the ground truth for
survivors, independent of comfy_memx. Nothing in this pack but the two caches holds a model.

V1 node API only, so the same code loads in ComfyUI 0.3.64, 0.27.0 and 0.33.0. ``comfy.*``, ``folder_paths`` and
``nodes`` are imported inside functions: ComfyUI has imported them before it loads custom nodes, and this module
stays importable without them (the soak's offline tests read ``NODE_CLASS_MAPPINGS``).
"""

import functools
import os
import weakref

CATEGORY = "memx/keeps"
CACHE_SWITCH = "MEMX_KEEPS_NODES_CACHE"

# key -> (model, clip, vae): the dict cache, never emptied by the pack.
CHECKPOINTS = {}

# key -> {"model": weakref, "vae": weakref}: the modules the witness saw, weakly (the census reads it).
_WITNESSED = {}
# key -> bytes of the model's and the VAE's weights when the witness saw them (numbers only).
_WITNESSED_BYTES = {}


def caching():
    """Whether the loaders keep what they load (``MEMX_KEEPS_NODES_CACHE`` is not ``off``)."""
    return os.environ.get(CACHE_SWITCH, "on").strip().lower() != "off"


def checkpoint_names():
    """The checkpoint files ComfyUI offers (its ``checkpoints`` folder)."""
    import folder_paths

    return folder_paths.get_filename_list("checkpoints")


def load_with_comfyui(ckpt_name):
    """``(model, clip, vae)`` of ``ckpt_name`` from ComfyUI's own ``CheckpointLoaderSimple``."""
    import nodes

    return tuple(nodes.CheckpointLoaderSimple().load_checkpoint(ckpt_name)[:3])


@functools.lru_cache(maxsize=None)
def load_checkpoint_cached(ckpt_name, key):
    """``(model, clip, vae)`` of ``ckpt_name`` through ``comfy.sd.load_checkpoint_guess_config``, kept by an unbounded
    ``lru_cache`` under ``(ckpt_name, key)``."""
    import comfy.sd
    import folder_paths

    path = folder_paths.get_full_path("checkpoints", ckpt_name)
    out = comfy.sd.load_checkpoint_guess_config(path, output_vae=True, output_clip=True,
                                                embedding_directory=folder_paths.get_folder_paths("embeddings"))
    return tuple(out[:3])


def loader_inputs():
    return {"required": {"ckpt_name": (checkpoint_names(),), "key": ("STRING", {"default": "default"})}}


class MemxKeepsCheckpointLoader:
    """ComfyUI's checkpoint loader behind a module-level dict: the checkpoint loaded for ``key`` is kept there."""

    @classmethod
    def INPUT_TYPES(cls):
        return loader_inputs()

    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, ckpt_name, key):
        """The kept ``(model, clip, vae)`` of ``key``, loaded (and kept) when the dict has none."""
        cached = CHECKPOINTS.get(key)
        if cached is None:
            cached = load_with_comfyui(ckpt_name)
            if caching():
                CHECKPOINTS[key] = cached
        return cached


class MemxKeepsLruCheckpointLoader:
    """ComfyUI's checkpoint loader behind the ``lru_cache`` function :func:`load_checkpoint_cached`."""

    @classmethod
    def INPUT_TYPES(cls):
        return loader_inputs()

    RETURN_TYPES = ("MODEL", "CLIP", "VAE")
    FUNCTION = "load"
    CATEGORY = CATEGORY

    def load(self, ckpt_name, key):
        """The cached ``(model, clip, vae)`` of ``(ckpt_name, key)`` (loaded on a cache miss)."""
        if caching():
            return load_checkpoint_cached(ckpt_name, key)
        return load_checkpoint_cached.__wrapped__(ckpt_name, key)


def weight_bytes(module):
    """Bytes of a torch module's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


class MemxKeepsWitness:
    """Pass a MODEL and a VAE through, noting their torch modules (and the optional CLIP's, when the checkpoint had
    one) weakly under ``key`` (for the census)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",), "vae": ("VAE",), "key": ("STRING", {"default": "default"})},
                "optional": {"clip": ("CLIP",)}}

    RETURN_TYPES = ("MODEL", "VAE")
    FUNCTION = "witness"
    CATEGORY = CATEGORY

    def witness(self, model, vae, key, clip=None):
        modules = {"model": model.model, "vae": vae.first_stage_model}
        if clip is not None:
            modules["clip"] = clip.cond_stage_model
        _WITNESSED[key] = {kind: weakref.ref(module) for kind, module in modules.items()}
        _WITNESSED_BYTES[key] = sum(weight_bytes(module) for module in modules.values())
        del modules
        return (model, vae)


class MemxKeepsCensus:
    """Report what is alive in the server: the witnessed modules by key, what the pack's caches hold, and ComfyUI's
    model objects by kind."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"nonce": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF})}}

    RETURN_TYPES = ()
    FUNCTION = "count"
    OUTPUT_NODE = True
    CATEGORY = CATEGORY

    def count(self, nonce):
        import gc

        import comfy.model_base
        import comfy.model_patcher

        gc.collect()
        kinds = {"model_patchers": comfy.model_patcher.ModelPatcher, "base_models": comfy.model_base.BaseModel}
        counts = dict.fromkeys(kinds, 0)
        for obj in gc.get_objects():
            kind = type(obj)  # not isinstance: that reads __class__, which some lazy module proxies warn about
            for name, cls in kinds.items():
                if issubclass(kind, cls):
                    counts[name] += 1
        alive = {kind: sorted(key for key, refs in _WITNESSED.items() if kind in refs and refs[kind]() is not None)
                 for kind in ("model", "vae", "clip")}
        any_alive = sorted(set().union(*alive.values()))
        record = {
            "nonce": nonce,
            "alive": any_alive,
            "alive_by_kind": alive,
            "alive_bytes": sum(_WITNESSED_BYTES.get(key, 0) for key in any_alive),
            "witnessed": len(_WITNESSED),
            "witnessed_bytes": dict(_WITNESSED_BYTES),
            "held": {"dict": len(CHECKPOINTS), "lru": load_checkpoint_cached.cache_info().currsize},
            "caching": caching(),
            **counts,
        }
        return {"ui": {"memx_keeps_census": [record]}}


NODE_CLASS_MAPPINGS = {
    "MemxKeepsCheckpointLoader": MemxKeepsCheckpointLoader,
    "MemxKeepsLruCheckpointLoader": MemxKeepsLruCheckpointLoader,
    "MemxKeepsWitness": MemxKeepsWitness,
    "MemxKeepsCensus": MemxKeepsCensus,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "MemxKeepsCheckpointLoader": "Memx keeps: checkpoint loader, dict cache (leaks)",
    "MemxKeepsLruCheckpointLoader": "Memx keeps: checkpoint loader, lru_cache (leaks)",
    "MemxKeepsWitness": "Memx keeps: witness",
    "MemxKeepsCensus": "Memx keeps: census",
}
