"""Releasing what published packs keep, on real ComfyUI (opt-in, as ``test_real_comfyui.py``), with
``COMFY_MEMX_RELEASE=ask``: ComfyUI's wrappers (ModelPatcher and clones, CLIP, VAE, tuples of them) in the containers
real packs use.

``shapes``   ``tests/real_comfy/memx_release_shapes`` keeps a sampled tiny MODEL (``memx_test_nodes``, 64 MiB) in each
             of its shapes: a weak-keyed memo of clones keyed by the MODEL, a dict of lists of checkpoint tuples, an
             ``OrderedDict`` of clones, a ``defaultdict``, a deque and, where the interpreter has cachetools, a
             ``cachetools`` LRU and TTL cache and a tagged mapping class over them.
``inspire``  ltdrdata's ComfyUI-Inspire-Pack, unmodified (``../shared/realpacks``, needs opencv, cachetools,
             webcolors and matplotlib in the interpreter): ``CheckpointLoaderSimpleShared //Inspire`` keeps
             ``(model, clip, vae)`` of the random-weight SD1.5 checkpoint in its module-level ``TaggedCache``.

``shapes`` runs on every tree: what ComfyUI still reaches (its output caches, classic in 0.3.64, RAM-pressure after) is
what decides "in use", and it differs between them.  ``inspire`` (an SD1.5 session) runs on the newest tree only: its
cut through a pack's mapping class is the ``tagged`` shape on every tree, and that ComfyUI itself keeps none of a
checkpoint's UNet, CLIP and VAE after ``/memx/free`` is ``test_memx_free_frees_unet_clip_and_vae`` on the oldest and
the newest tree (test_real_comfyui.py).

Each workflow samples its model (a KSampler, or ``MemxTinySampler``), so ComfyUI's own loads put the models in the
ledger.  Then ``POST /memx/free`` unloads them and empties ComfyUI's caches: each kept model survives, held by the
pack at the path of its shape.  ``POST /memx/models/{id}/release`` then answers 200 ``released``: every model of the
cut entry dies, RSS drops by at least half of their bytes, and the same workflow afterwards gives the same output
(the sampler's checksum; Inspire's saved PNG byte for byte).
"""

import os
import subprocess
import tarfile
from pathlib import Path
from urllib.parse import quote

import pytest

from test_real_comfyui import (configured_python, drive, memx_importable_by_real_python,  # noqa: F401
                               needs_real_comfyui, newest_tree_only, real_checkpoint, real_trees, ready, run_session,
                               where)

REAL_COMFY_DIR = Path(__file__).parents[1] / "real_comfy"
SHAPE_PACK = "memx_release_shapes"
INSPIRE = "ComfyUI-Inspire-Pack"
INSPIRE_ARCHIVE = Path(__file__).parents[2].parent / "shared" / "realpacks" / "ComfyUI-Inspire-Pack-1aef2c5.tar.xz"
ENV = {"COMFY_MEMX_RELEASE": "ask"}
WIDTH = 2048   # MemxTinyNet of 4 Linear(2048, 2048): 64 MiB, enough for RSS to show what came back
# shape -> the start of its holder path (the pack's container), and whether it needs cachetools
SHAPES = {
    "weak_memo": ("memx_release_shapes.PATCHED.data[", False),
    "dict_of_lists": ("memx_release_shapes.LOADED['tiny']", False),
    "ordered_clones": ("memx_release_shapes.CLONES[", False),
    "defaultdict": ("memx_release_shapes.BY_ARCH[", False),
    "deque": ("memx_release_shapes.HISTORY[", False),
    "lru": ("memx_release_shapes.CKPTS._Cache__data[", True),
    "ttl": ("memx_release_shapes.RECENT._Cache__data[", True),
    "tagged": ("memx_release_shapes.backend._data['ckpt']", True),
}


def has_modules(*names):
    """True when the real interpreter imports every module of ``names``."""
    python = configured_python()
    if not python:
        return False
    probe = subprocess.run([python, "-c", "import " + ", ".join(names)], capture_output=True, timeout=120,
                           env=drive.inherited_env())
    return probe.returncode == 0


def shapes_here():
    """The shapes the real interpreter can keep (the cachetools ones only where it imports cachetools)."""
    with_cachetools = has_modules("cachetools")
    return [shape for shape, (_, needs) in SHAPES.items() if with_cachetools or not needs]


def keep_prompt(shape, seed=0):
    return {"1": drive.loader_node(f"memx-shape-{shape}", width=WIDTH), "2": drive.sampler_node("1", seed),
            "3": {"class_type": "MemxKeepInShape", "inputs": {"model": ["1", 0], "shape": shape, "key": shape}}}


def inspire_workflow():
    workflow = drive.default_workflow(0)
    workflow["4"] = {"class_type": "CheckpointLoaderSimpleShared //Inspire",
                     "inputs": {"ckpt_name": drive.CHECKPOINT_NAME, "key_opt": "memx-sd15", "mode": "Auto"}}
    workflow["9"]["inputs"]["filename_prefix"] = "memx_inspire"
    return workflow


def held_by(rows, package):
    """The survivor rows of a free receipt (or /memx/models rows) whose leak holder is ``package``."""
    return [row for row in rows if isinstance(row, dict) and ((row.get("leak") or {}).get("holder") or {})
            .get("package") == package]


def release_all(session, rows, prefix):
    for row in rows:
        session.call(f"{prefix}{row['model_id']}", "POST", f"/memx/models/{quote(row['model_id'], safe='')}/release",
                     timeout=600.0)


def run_shapes(session, shapes):
    for shape in shapes:
        session.prompt(f"keep_{shape}", keep_prompt(shape))
    session.memx_free("free", timeout=600)
    session.call("models", "GET", "/memx/models")
    release_all(session, held_by(session.step("models")["body"], SHAPE_PACK), "release_")
    session.prompt("again", keep_prompt(shapes[0]))


def run_inspire(session):
    session.prompt("first", inspire_workflow(), timeout=1200)
    session.memx_free("free", timeout=600)
    session.call("models", "GET", "/memx/models")
    rows = held_by(session.step("models")["body"], INSPIRE)
    release_all(session, sorted(rows, key=lambda row: -(row.get("bytes") or 0))[:1], "release_")
    session.call("after", "GET", "/memx/models")
    session.prompt("again", inspire_workflow(), timeout=1200)


def inspire_pack(folder):
    """The Inspire pack unpacked into ``folder`` (the archive's one top folder); its path."""
    with tarfile.open(INSPIRE_ARCHIVE, "r:xz") as archive:
        archive.extractall(folder, filter="data")
    return os.path.join(folder, INSPIRE)


@pytest.fixture(scope="module")
def packs_session(tmp_path_factory, memx_importable_by_real_python, real_checkpoint):  # noqa: F811
    """``packs_session(tree, name)`` -> the stopped session ``shapes`` or ``inspire`` on ``tree`` (once each)."""
    done = {}

    def get(tree, name):
        if not memx_importable_by_real_python:
            pytest.skip(f"comfy_memx is not installed for {configured_python()}")
        if (tree, name) not in done:
            out = tmp_path_factory.mktemp(f"{os.path.basename(os.path.normpath(tree))}-{name}")
            if name == "shapes":
                session = drive.Session(tree, configured_python(), str(out), launcher="module", env=ENV,
                                        packs=("memx_test_nodes", str(REAL_COMFY_DIR / SHAPE_PACK)))
                done[(tree, name)] = run_session(session, lambda s: run_shapes(s, shapes_here()))
            else:
                pack = inspire_pack(str(tmp_path_factory.mktemp("inspire-pack")))
                session = drive.Session(tree, configured_python(), str(out), launcher="module", env=ENV,
                                        packs=(pack,), checkpoint=real_checkpoint(tree))
                done[(tree, name)] = run_session(session, run_inspire)
        return done[(tree, name)]

    return get


def assert_released(step, session, models=1):
    """A release step answered 200 ``released``: ``models`` models died and RSS gave back half of their bytes."""
    assert step["http_status"] == 200, (step, where(session))
    receipt = step["body"]["release"]
    assert receipt["outcome"] == "released" and receipt["died"] is True, (receipt, where(session))
    rows = receipt["models"]
    assert len(rows) == models and all(row["died"] and row["bytes"] > 0 for row in rows), (receipt, where(session))
    assert receipt["released_bytes"] == sum(row["bytes"] for row in rows) > 0
    gave_back = receipt["memory"]["before"]["rss"] - receipt["memory"]["after"]["rss"]
    assert gave_back >= receipt["released_bytes"] / 2, (gave_back, receipt, where(session))
    return receipt


@needs_real_comfyui
@pytest.mark.parametrize("tree", real_trees)
def test_each_shape_keeps_its_model_after_a_free_and_a_release_gives_it_back(tree, packs_session):
    session = ready(packs_session(tree, "shapes"))
    shapes = shapes_here()
    for shape in shapes:
        assert session.step(f"keep_{shape}")["ok"], (shape, where(session))
    survivors = held_by(session.step("free")["body"]["survivors"], SHAPE_PACK)
    paths = sorted(row["leak"]["holder"]["path"] for row in survivors)
    assert len(survivors) == len(shapes), (paths, where(session))
    for shape in shapes:
        assert any(path.startswith(SHAPES[shape][0]) for path in paths), (shape, paths, where(session))
    cut = {}
    for row in survivors:
        receipt = assert_released(session.step(f"release_{row['model_id']}"), session)
        assert receipt["package"] == SHAPE_PACK and receipt["pattern"] in ("module_registry", "appended_list"), receipt
        cut[receipt["cut"]] = receipt["method"]
    assert len(cut) == len(shapes), (cut, where(session))
    again = session.step("again")
    first = session.step(f"keep_{shapes[0]}")
    assert again["ok"] and again["outputs"]["2"] == first["outputs"]["2"], (again, first, where(session))
    assert session.failure_tracebacks() == [], where(session)


@needs_real_comfyui
@pytest.mark.parametrize("tree", newest_tree_only)
def test_inspire_packs_backend_cache_gives_its_checkpoint_back_and_the_workflow_gives_the_same_image(
        tree, packs_session):
    if not INSPIRE_ARCHIVE.is_file():
        pytest.skip(f"{INSPIRE_ARCHIVE} is not here (the shared folder of real packs)")
    if not has_modules("cv2", "cachetools", "webcolors", "matplotlib"):
        pytest.skip(f"{configured_python()} lacks the Inspire pack's modules (opencv, cachetools, webcolors, "
                    "matplotlib)")
    session = ready(packs_session(tree, "inspire"))
    assert session.step("first")["ok"], (session.step("first").get("error_messages"), where(session))
    survivors = held_by(session.step("free")["body"]["survivors"], INSPIRE)
    assert survivors, (session.step("free")["body"]["survivors"], where(session))
    for row in survivors:
        assert "backend_support.cache._data['ckpt']" in row["leak"]["holder"]["path"], (row, where(session))
    [unet] = sorted(survivors, key=lambda row: -(row.get("bytes") or 0))[:1]
    receipt = assert_released(session.step(f"release_{unet['model_id']}"), session, models=len(survivors))
    assert receipt["method"] == "mapping_entry" and receipt["cut"].endswith("._Cache__data['memx-sd15']"), receipt
    left = held_by(session.step("after")["body"], INSPIRE)
    assert left == [], (left, where(session))
    again, first = session.step("again"), session.step("first")
    assert again["ok"], (again.get("error_messages"), where(session))
    images = [Path(session.base, "output", step["outputs"]["9"]["images"][0]["subfolder"],
                   step["outputs"]["9"]["images"][0]["filename"]).read_bytes() for step in (first, again)]
    assert images[0] == images[1], where(session)
    assert session.failure_tracebacks() == [], where(session)
