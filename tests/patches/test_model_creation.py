"""Every model ComfyUI builds is known, loaded or not (``patches/model_patcher.py``, ``comfy_memx.ledger.creation``).

On the stand-ins: a checkpoint that a pack's own loader node builds through ComfyUI's
``comfy.sd.load_checkpoint_guess_config`` and keeps (``memx_ckpt_keeper``: ``(ckpt_name, model, clip, vae, keys)``
tuples in a top-level module of its own) is in the ledger from the moment it is built, with the node and package
that built it, in ``/memx/models`` (state ``built``), in the ``created`` events, and, after ``/memx/free``, among the
survivors with its bytes and the pack as holder, although no sampler ever loaded it.  ComfyUI's own checkpoint
loader's models are core's and die with the output cache.  A clone is no new model; the ledger keeps nothing alive.
"""

import gc
import os
import shutil
import sys
import weakref

import pytest
import torch
from safetensors.torch import save_file

from comfy_memx.core.state import STATE
from fake_comfy.loader import PACKS_DIR, make_patcher
from memx_helpers import memx_on, read_events
from test_routes import serve

VERSIONS = ["0.3.64", "0.27.0"]
PACK = "memx_ckpt_keeper"
CACHE_MODULE = "memx_ckpt_keeper_cache"
CKPT = "tiny_sd.safetensors"
# (prefix, tensors, elements each): the stand-in's parts of a checkpoint, float32
PARTS = {"BaseModel": ("model.diffusion_model.", 4, 256), "SD1ClipModel": ("cond_stage_model.", 3, 128),
         "AutoencoderKL": ("first_stage_model.", 2, 64)}
SIZES = {model: count * numel * 4 for model, (_, count, numel) in PARTS.items()}


def write_checkpoint(folder):
    """A checkpoint file with a diffusion model, a text encoder and a VAE, in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    sd = {f"{prefix}block_{i}.weight": torch.full((numel,), 0.25 + i)
          for prefix, count, numel in PARTS.values() for i in range(count)}
    save_file(sd, os.path.join(folder, CKPT))
    return folder


@pytest.fixture
def keeper_cleanup(tmp_path):
    """The pack imports its cache module under a top-level name from its folder (on ``sys.path``): forget both."""
    yield
    sys.modules.pop(CACHE_MODULE, None)
    sys.path[:] = [entry for entry in sys.path if not str(entry).startswith(str(tmp_path))]


async def install_keeper(tmp_path, custom_nodes=None):
    """Install memx_ckpt_keeper with the stand-in's own loader and register the checkpoints folder."""
    import folder_paths
    import nodes
    folder_paths.add_model_folder_path("checkpoints", write_checkpoint(str(tmp_path / "models" / "checkpoints")))
    target = (custom_nodes or tmp_path / "custom_nodes") / PACK
    shutil.copytree(os.path.join(PACKS_DIR, PACK), target)
    assert await nodes.load_custom_node(str(target)) is not False
    return sys.modules[CACHE_MODULE]


def keeper_prompt(key="a"):
    return {"1": {"class_type": "KeeperCheckpointLoader", "inputs": {"ckpt_name": CKPT, "key": key}},
            "2": {"class_type": "KeeperCacheInfo", "inputs": {"model": ["1", 0]}}}


def core_prompt():
    return {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CKPT}},
            "2": {"class_type": "KeeperCacheInfo", "inputs": {"model": ["1", 0]}}}


@pytest.mark.parametrize("version", VERSIONS)
def test_a_checkpoint_a_pack_keeps_unsampled_is_known_and_survives_a_free_with_its_bytes(version, tmp_path,
                                                                                          keeper_cleanup):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        cache = await install_keeper(tmp_path)
        prompt_id = await comfy.run(keeper_prompt())
        _, rows = await comfy.get_json("/memx/models")
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True})
        _, after = await comfy.get_json("/memx/models")
        [entry] = cache.loaded_objects["ckpt"]
        refs = [weakref.ref(entry[1].model), weakref.ref(entry[2].cond_stage_model),
                weakref.ref(entry[3].first_stage_model)]
        return prompt_id, rows, status, receipt, after, refs, cache

    prompt_id, rows, status, receipt, after, refs, cache = serve(version, tmp_path, scenario, events=events)
    builder = {"prompt_id": prompt_id, "node_id": "1", "class_type": "KeeperCheckpointLoader", "package": PACK,
               "via": None}
    assert sorted(row["model"] for row in rows) == sorted(SIZES)
    for row in rows:   # never loaded: the ledger knows it from its build
        assert row["created_by"] == builder and row["created_at"] is not None, row
        assert row["state"] == "built" and row["loads"] == 0 and row["loaded_bytes"] == 0, row
        assert row["bytes"] == SIZES[row["model"]] and row["in_comfyui_loaded_list"] is False, row
    assert status == 200 and receipt["freed"] == [] and receipt["freed_bytes"] == 0
    survivors = {row["model"]: row for row in receipt["survivors"]}
    assert set(survivors) == set(SIZES) and receipt["survivor_bytes"] == sum(SIZES.values())
    for model, survivor in survivors.items():
        assert survivor["bytes"] == SIZES[model] and survivor["created_by"] == builder, survivor
        leak = survivor["leak"] or {}
        assert leak.get("found_by") == "after_free" and leak.get("holder_package") == PACK, survivor
        assert survivor["holder"]["path"].startswith(f"{CACHE_MODULE}.loaded_objects['ckpt'][0]"), survivor
    assert {row["model_id"] for row in after} == {row["model_id"] for row in rows}
    assert all(row["state"] == "leaked" for row in after)
    created = [event for event in read_events(events) if event["event"] == "created"]
    assert sorted((e["model"], e["bytes"]) for e in created) == sorted(SIZES.items())
    assert all(e["created_by"] == builder for e in created)
    cache.forget()
    gc.collect()
    assert [ref() for ref in refs] == [None, None, None]   # the books kept none of them alive


@pytest.mark.parametrize("version", VERSIONS)
def test_comfyuis_own_checkpoint_loader_builds_for_core_and_a_free_releases_what_nothing_keeps(version, tmp_path,
                                                                                              keeper_cleanup):
    async def scenario(comfy):
        await install_keeper(tmp_path)
        prompt_id = await comfy.run(core_prompt())
        _, rows = await comfy.get_json("/memx/models")
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True})
        _, after = await comfy.get_json("/memx/models")
        return prompt_id, rows, status, receipt, after

    prompt_id, rows, status, receipt, after = serve(version, tmp_path, scenario)
    assert sorted(row["model"] for row in rows) == sorted(SIZES)
    assert {(row["created_by"]["class_type"], row["created_by"]["package"], row["created_by"]["node_id"],
             row["created_by"]["prompt_id"], row["state"]) for row in rows} == {
        ("CheckpointLoaderSimple", "core", "1", prompt_id, "built")}
    assert status == 200 and receipt["survivors"] == [] and after == []
    assert sorted((row["model"], row["bytes"], row["released"]) for row in receipt["freed"]) == sorted(
        (model, size, True) for model, size in SIZES.items())


@pytest.mark.parametrize("version", VERSIONS)
def test_a_clone_is_no_new_model_and_its_load_is_the_built_models(version, tmp_path):
    with memx_on(version) as mm:
        import comfy.sd
        patcher = make_patcher(2, 64)
        [record] = STATE.ledger.records()
        assert record.created_by is not None and record.created_by.package == "core"   # outside a prompt
        assert record.created_by.prompt_id is None and record.model_bytes == 2 * 64 * 4
        clone = patcher.clone()
        mm.load_models_gpu([clone])
        assert STATE.ledger.records() == [record] and len(record.patchers) == 2 and record.loads == 1
        model, clip, vae, _ = comfy.sd.load_checkpoint_guess_config(
            os.path.join(write_checkpoint(str(tmp_path)), CKPT))
        clip_clone = clip.clone()
        assert clip_clone.cond_stage_model is clip.cond_stage_model
        assert sorted(r.model for r in STATE.ledger.records()) == sorted(["BaseModel", *SIZES])
        clip_record = STATE.ledger.find(clip.cond_stage_model)
        assert len(clip_record.patchers) == 2 and clip_record.loads == 0
        assert STATE.ledger.find(vae.first_stage_model).model_bytes == SIZES["AutoencoderKL"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_ledger_keeps_no_built_model_alive(version, tmp_path):
    with memx_on(version):
        import comfy.sd
        path = os.path.join(write_checkpoint(str(tmp_path)), CKPT)
        out = comfy.sd.load_checkpoint_guess_config(path)
        refs = [weakref.ref(out[0].model), weakref.ref(out[1].cond_stage_model), weakref.ref(out[2].first_stage_model)]
        assert len(STATE.ledger.records()) == 3
        del out
        gc.collect()
        assert [ref() for ref in refs] == [None, None, None]
        assert STATE.ledger.records() == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")   # the half-built patcher's __del__
@pytest.mark.parametrize("version", VERSIONS)
def test_the_constructor_is_transparent_and_off_with_its_patch(version, tmp_path):
    with memx_on(version):
        import comfy.model_patcher as model_patcher
        from fake_comfy.loader import make_model

        class PackPatcher(model_patcher.ModelPatcher):   # a pack's subclass that calls ComfyUI's constructor
            def __init__(self, model, *args, **kwargs):
                super().__init__(model, *args, **kwargs)
                self.tag = "pack"

        assert model_patcher.ModelPatcher.__init__.__wrapped__ is not None
        patcher = PackPatcher(make_model(2, 8), "cpu", "cpu", size=123)
        assert patcher.tag == "pack" and patcher.size == 123
        assert STATE.ledger.find(patcher.model).model_bytes == 123   # the size it was given
        with pytest.raises(AttributeError):
            model_patcher.ModelPatcher(None, "cpu", "cpu")   # ComfyUI's own error, and no record
        assert len(STATE.ledger.records()) == 1
    with memx_on(version, disable="model_patcher"):
        patcher = make_patcher(2, 8)
        assert STATE.ledger.records() == []   # a model enters the ledger at its first load only
