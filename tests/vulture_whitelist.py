"""Names that vulture takes for dead code but that ComfyUI, torch, Python or pytest use by name.

A vulture whitelist: never imported, only read by ``vulture`` next to the sources (tests/unit/test_code_health.py
passes it), where each access below counts as a use of that name.  Add a name here only with the caller that reads
it; code nobody calls is deleted instead.
"""
# ruff: noqa

# ComfyUI's node protocol: the server and the executor read these off every node class and pack module.
_.INPUT_TYPES  # the node's inputs, read by server.py and execution.py
_.RETURN_TYPES  # the node's output types
_.RETURN_NAMES  # the node's output labels, read by the server's object_info
_.FUNCTION  # the method name the executor calls
_.CATEGORY  # the node menu ComfyUI files the node under
_.OUTPUT_NODE  # the executor runs output nodes even when nothing consumes them
_.NODE_CLASS_MAPPINGS  # nodes.load_custom_node reads a pack's nodes from it
_.NODE_DISPLAY_NAME_MAPPINGS  # the names the ComfyUI frontend shows
_.WEB_DIRECTORY  # ComfyUI serves the memory panel's files from the pack's WEB_DIRECTORY

# torch calls a module's forward through Module.__call__.
_.forward

# Python's import system calls these on meta-path finders and reads them off modules.
_.invalidate_caches  # importlib.invalidate_caches() calls every finder's
_.__loader__  # importlib reads a module's loader

# The docs helper generates the configuration reference from each setting's doc line.
_.doc  # comfy_memx.core.config.Setting.doc

# bench/leak.py: a module attribute that only holds the target, so that the holder search has a path to name.
_._CACHE

# bench/pin_invariant.py's stand-in comfy_aimdo: ComfyUI's pinned-memory code calls these by name.
_.allocated  # ModelVBAR.allocated
_.prioritize  # ModelVBAR.prioritize()
_.alloc  # ModelVBAR.alloc()
_.hostbuf_to_tensor  # comfy_aimdo.torch.hostbuf_to_tensor()
_.vbar_unpin  # comfy_aimdo.model_vbar.vbar_unpin()
_.truncate  # HostBuffer.truncate()
_.discard_cuda_async_error  # comfy.model_management.discard_cuda_async_error()
_.get_all_torch_devices  # comfy.model_management.get_all_torch_devices()

# ComfyUI's ModelPatcher.model_dtype() calls the model's get_dtype.
_.get_dtype

# leaks.api's door for the release engine and the other wings: "is this holder's package a loaded custom-node pack"
# (tests/unit/test_attribution_by_file.py calls it by name).
is_custom_node_package
