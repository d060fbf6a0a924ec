"""Run under `python -m comfy_memx [--leak-fail 1] leak_then_exit.py SHAPE_DIR PACK_DIR`: leaks a model, exits 0."""
import gc
import importlib.util
import os
import sys

shape, pack_dir = sys.argv[1], sys.argv[2]
sys.path.insert(0, shape)
import comfy.model_management as mm  # noqa: E402  (comfy_memx patches it on import)

spec = importlib.util.spec_from_file_location("holder_pack", os.path.join(pack_dir, "__init__.py"))
pack = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pack)
patcher = pack.make_patcher()
pack.load(patcher)
pack.REGISTRY["model"] = patcher.model
del patcher
gc.collect()
mm.cleanup_models_gc()
print("script finished")
