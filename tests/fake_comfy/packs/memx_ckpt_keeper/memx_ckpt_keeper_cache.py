"""The checkpoint cache of ``memx_ckpt_keeper``, imported under this top-level name (the pack's folder is on
``sys.path``): ``loaded_objects["ckpt"]`` lists ``(ckpt_name, model, clip, vae, [keys])``, oldest first."""
import comfy.sd
import folder_paths

loaded_objects = {"ckpt": []}


def load_checkpoint(ckpt_name, key):
    """``(model, clip, vae)`` of ``ckpt_name``: the cached ones (``key`` joins the entry's keys), else loaded by
    ComfyUI's checkpoint loader and cached."""
    for name, model, clip, vae, keys in loaded_objects["ckpt"]:
        if name == ckpt_name:
            if key not in keys:
                keys.append(key)
            return model, clip, vae
    path = folder_paths.get_full_path_or_raise("checkpoints", ckpt_name)
    model, clip, vae = comfy.sd.load_checkpoint_guess_config(path, output_vae=True, output_clip=True)[:3]
    loaded_objects["ckpt"].append((ckpt_name, model, clip, vae, [key]))
    return model, clip, vae


def forget():
    """Drop every cached checkpoint."""
    loaded_objects["ckpt"].clear()
