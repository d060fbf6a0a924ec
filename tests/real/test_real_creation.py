"""A checkpoint a pack keeps and no sampler used, on real ComfyUI (opt-in, as ``test_real_comfyui.py``).

``memx_ckpt_keeper`` (``tests/fake_comfy/packs/``) is written as published checkpoint-caching packs are: its loader
node calls ComfyUI's ``comfy.sd.load_checkpoint_guess_config`` and keeps ``(ckpt_name, model, clip, vae, keys)``
tuples in a module-level dict of a module it imports under a top-level name after putting its folder on
``sys.path``; its output node only reports the cache.  On the random-weight SD1.5 checkpoint, with ComfyUI's base
directory elsewhere (``--base-directory``, as every session of ``bench.harness.drive`` runs): the UNet, CLIP and VAE
are in ``/memx/models`` from their build on (state ``built``, ``created_by`` the pack's node); a search while
ComfyUI's output cache holds the UNet names that cache as ComfyUI's own (``core``, ``comfyui_cache``), not as a
package ``execution`` or ``main``; and after ``/memx/free`` the receipt names the three with their bytes and the pack
as holder, and those bytes are at least 0.8 times the resident memory the pack keeps (RSS after the free minus RSS
before the workflow).
"""

import os
from urllib.parse import quote

import pytest

from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, real_checkpoint, real_trees, ready, run_session, where)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
PACK = "memx_ckpt_keeper"
PACK_DIR = os.path.join(HERE, "fake_comfy", "packs", PACK)
HELPER = "memx_ckpt_keeper_cache"
MODELS = {"BaseModel", "SD1ClipModel", "AutoencoderKL"}   # SD1.5's UNet, text encoder and VAE in ComfyUI
KEPT_RATIO = 0.8


def keeper_prompt():
    return {"1": {"class_type": "KeeperCheckpointLoader", "inputs": {"ckpt_name": drive.CHECKPOINT_NAME,
                                                                     "key": "memx"}},
            "2": {"class_type": "KeeperCacheInfo", "inputs": {"model": ["1", 0]}}}


def rss_bytes(session):
    """Resident memory of the server process now (``VmRSS``)."""
    with open(f"/proc/{session.server.process.pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def run_creation_session(session):
    session.note("boot", rss=rss_bytes(session))
    session.prompt("keep", keeper_prompt())
    rows = session.call("models", "GET", "/memx/models")["body"]
    unet = next((row["model_id"] for row in rows if isinstance(row, dict) and row["model"] == "BaseModel"), "none")
    session.call("search", "POST", f"/memx/models/{quote(unet, safe='')}/search", timeout=300)
    session.memx_free("free", timeout=300)


@pytest.fixture(scope="module")
def creation_session(tmp_path_factory, memx_importable_by_real_python, real_checkpoint):  # noqa: F811
    """``creation_session(tree)`` -> the stopped session on ``tree`` (run once per tree)."""
    done = {}

    def get(tree):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if tree not in done:
            out = str(tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-creation"))
            session = drive.Session(tree, configured_python(), out, launcher="module", packs=[PACK_DIR],
                                    checkpoint=real_checkpoint(tree))
            done[tree] = run_session(session, run_creation_session)
        return done[tree]

    return get


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_a_checkpoint_a_pack_keeps_unsampled_is_known_from_its_build(tree, creation_session):
    session = ready(creation_session(tree))
    assert session.step("keep")["ok"], (session.step("keep"), where(session))
    prompt_id = session.step("keep")["prompt_id"]
    rows = [row for row in session.step("models")["body"] if row["model"] in MODELS]
    assert sorted(row["model"] for row in rows) == sorted(MODELS), where(session)
    builder = {"prompt_id": prompt_id, "node_id": "1", "class_type": "KeeperCheckpointLoader", "package": PACK,
               "via": None}
    for row in rows:
        assert row["created_by"] == builder and row["bytes"] > 0, row
    unet = next(row for row in rows if row["model"] == "BaseModel")
    assert unet["state"] == "built" and unet["loads"] == 0, unet   # no sampler ever loaded the UNet
    created = [event for event in session.step_events("keep", "created") if event["model"] in MODELS]
    assert sorted(event["model"] for event in created) == sorted(MODELS), where(session)


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_with_the_base_directory_elsewhere_comfyuis_output_cache_is_core(tree, creation_session):
    session = ready(creation_session(tree))
    search = session.step("search")
    assert search["http_status"] == 200, (search, where(session))
    chains = search["body"]["holders"]
    cache = [chain for chain in chains if ".caches.outputs" in chain["path"]]
    assert cache, (chains, where(session))
    assert all(chain["package"] == "core" and chain["pattern"] == "comfyui_cache" for chain in cache), cache
    pack = [chain for chain in chains if chain["path"].startswith(f"{HELPER}.loaded_objects['ckpt'][0]")]
    assert pack and all(chain["package"] == PACK for chain in pack), chains
    assert not {chain["package"] for chain in chains} & {"execution", "main", "server", "folder_paths", "comfy"}


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_after_a_free_the_receipt_names_what_the_pack_keeps_with_its_bytes(tree, creation_session):
    session = ready(creation_session(tree))
    free = session.step("free")
    assert free["http_status"] == 200, (free, where(session))
    receipt = free["body"]
    survivors = {row["model"]: row for row in receipt["survivors"] if row["model"] in MODELS}
    assert set(survivors) == MODELS, (receipt["survivors"], where(session))
    sizes = {row["model"]: row["bytes"] for row in session.step("models")["body"] if row["model"] in MODELS}
    for model, survivor in survivors.items():
        assert survivor["bytes"] == sizes[model] > 0, survivor
        assert survivor["created_by"]["package"] == PACK, survivor
        assert survivor["leak"] is not None and survivor["leak"]["holder_package"] == PACK, survivor
        assert survivor["leak"]["holder"]["path"].startswith(f"{HELPER}.loaded_objects['ckpt'][0]"), survivor
    named = sum(survivor["bytes"] for survivor in survivors.values())
    kept = receipt["memory"]["rss_after_trim"] - session.step("boot")["rss"]
    assert named >= KEPT_RATIO * kept, (f"receipt names {named} bytes, the pack keeps {kept} bytes of RSS",
                                        where(session))
    assert session.failure_tracebacks() == [], where(session)
