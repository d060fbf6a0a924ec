"""No wrapper of comfy_memx keeps a model, a ModelPatcher or a LoadedModel on its stack (issue: OOM tracebacks).

An out-of-memory error raised inside ``load_models_gpu`` travels up through comfy_memx's wrappers, and ComfyUI
handles it (``unload_all_models()``) while the traceback, and so every frame on it, is still alive.  Whatever a
wrapper's frame holds then lives as long as the traceback.  comfy_memx's frames may hold ids and weakrefs only.
"""

import gc
import os
import sys
import weakref

import pytest
import torch

import comfy_memx
from fake_comfy.loader import make_patcher, shape_root
from memx_helpers import memx_on

VERSIONS = ["0.3.64", "0.27.0"]
OURS = (os.path.dirname(os.path.abspath(comfy_memx.__file__)),
        os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(comfy_memx.__file__))), "patches"))
# the 0.27.0 stand-in ships inside comfy_memx (the demo's world) but plays ComfyUI: its frames are not ours
COMFYUI = os.path.realpath(shape_root("0.27.0")) + os.sep


def our_frames(traceback):
    frames = []
    while traceback is not None:
        filename = os.path.realpath(traceback.tb_frame.f_code.co_filename)
        if not filename.startswith(COMFYUI) and any(filename.startswith(os.path.realpath(root) + os.sep)
                                                    for root in OURS):
            frames.append(traceback.tb_frame)
        traceback = traceback.tb_next
    return frames


def parameters(frame):
    """A wrapper's own parameters: ComfyUI's arguments passed through, which the wrapped function holds anyway."""
    code = frame.f_code
    count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return set(code.co_varnames[:count])


def strong_model_references(value, kinds, depth=0):
    """The objects of ``kinds`` that ``value`` holds strongly (itself, or inside lists, tuples, sets and dicts)."""
    if isinstance(value, kinds):
        return [value]
    if depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        return [found for item in value for found in strong_model_references(item, kinds, depth + 1)]
    if depth < 3 and isinstance(value, dict):
        return [found for item in value.values() for found in strong_model_references(item, kinds, depth + 1)]
    return []


@pytest.mark.parametrize("version", VERSIONS)
def test_no_wrapper_frame_on_an_oom_traceback_holds_a_model(version, monkeypatch):
    with memx_on(version) as mm:
        resident = make_patcher()
        mm.load_models_gpu([resident])                 # one model already loaded (in the wrappers' "before")
        patcher = make_patcher()
        patcher_type = type(patcher)

        def out_of_memory(self, *args, **kwargs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        monkeypatch.setattr(patcher_type, "partially_load", out_of_memory)
        with pytest.raises(torch.cuda.OutOfMemoryError) as caught:
            mm.load_models_gpu([patcher])
        frames = our_frames(caught.value.__traceback__)
        names = {frame.f_code.co_name for frame in frames}
        assert {"load_models_gpu", "model_load"} <= names   # the traceback does pass through our wrappers
        kinds = (torch.nn.Module, patcher_type, mm.LoadedModel)
        held = {(frame.f_code.co_name, name): type(found).__name__
                for frame in frames for name, value in frame.f_locals.items() if name not in parameters(frame)
                for found in strong_model_references(value, kinds)}
        assert held == {}, f"comfy_memx frames hold models on an OOM traceback: {held}"
        monkeypatch.undo()
        mm.unload_all_models()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_model_dropped_during_an_oom_is_collectable_once_comfyui_lets_go(version, monkeypatch):
    with memx_on(version) as mm:
        patcher = make_patcher()
        probe = weakref.ref(patcher.model)

        def out_of_memory(self, *args, **kwargs):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        monkeypatch.setattr(type(patcher), "partially_load", out_of_memory)
        try:
            mm.load_models_gpu([patcher])
        except torch.cuda.OutOfMemoryError:
            mm.unload_all_models()                     # ComfyUI's OOM handler, inside the except
        del patcher
        gc.collect()
        assert probe() is None
        assert sys.exc_info() == (None, None, None)
