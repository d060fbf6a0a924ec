"""What comfy_memx must say about the packs of ``culprit_packs/``: each holds a model that the innocent
``memx_utility_belt`` loaded, in the way pack authors write such code.  Shared by the stand-in test
(``tests/patches/test_culprit.py``) and the real-ComfyUI test (``tests/real/test_real_culprit.py``)."""

import os

PACKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "culprit_packs")
LOADER = "memx_utility_belt"
LOADER_NODE = "UBApplyModel"

#: holder pack -> (its keeper node, the path its chain starts with, the holder pattern)
HOLDERS = {
    "memx_list_keeper": ("KeepListKeeper", "memx_list_keeper.MODELS[0]", "appended_list"),
    "memx_hook_hub": ("KeepHookHub", "memx_hook_hub.CALLBACKS[0] -> closure 'model'", "callback_registry"),
    "memx_style_mixer": ("KeepStyleMixer", "memx_style_mixer.StyleMixer._cache[(1328, 1328)]", "class_cache"),
    "memx_lora_cache": ("KeepLoraCache", "memx_lora_cache.cached_load -> lru_cache", "lru_cache"),
    "memx_thread_stash": ("KeepThreadStash", "memx_thread_stash.TLS -> thread-local.model", "thread_local"),
    "memx_background_worker": ("KeepBackgroundWorker",
                               "thread 'preview-loop' frame memx_background_worker.keep.<locals>.preview_loop "
                               "local 'model'", "thread_frame"),
    "memx_torch_glue": ("KeepTorchGlue", "memx_torch_glue._HOLDER[0]._modules['extra']", "torch_module_attribute"),
}


def pack_dir(name):
    """The source folder of one pack of ``culprit_packs/``."""
    return os.path.join(PACKS_DIR, name)
