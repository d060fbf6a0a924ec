"""GET /memx/models answers from its kept snapshot (``surface.answers``) on the stand-in PromptServer, and the
snapshot is never stale: after a load, an unload, a leak record, a free, a search and a release (and a refused one) the route
answers exactly what a full build of the rows answers at that moment, with the age backstop turned off so that only
the row keys decide.  The snapshot keeps no model alive."""

import asyncio
import gc
import json
import weakref
from urllib.parse import quote

import pytest

from comfy_memx.routekit.replies import clip
from comfy_memx.surface import answers, readmodel
from test_release_routes import post, release_path
from test_routes import VERSIONS, leaky, serve


async def rows_now(comfy):
    """GET /memx/models, checked against a full build of the rows made right after it (nothing runs between)."""
    status, rows = await comfy.get_json("/memx/models")
    assert status == 200
    assert rows == json.loads(json.dumps(clip(readmodel.model_rows()))), "the snapshot answered stale rows"
    return {row["model_id"]: row for row in rows}


async def run_in_thread(function):
    return await asyncio.get_running_loop().run_in_executor(None, function)


@pytest.mark.parametrize("version", VERSIONS)
def test_models_is_never_stale_after_a_load_an_unload_a_leak_record_and_a_free(version, tmp_path):
    async def scenario(comfy):
        answers.models_snapshot().max_age_s = float("inf")    # only the row keys decide
        seen = {"empty": await rows_now(comfy)}
        await comfy.run(leaky("a"))
        seen["load"] = await rows_now(comfy)
        import comfy.model_management as mm
        await run_in_thread(mm.unload_all_models)
        seen["unload"] = await rows_now(comfy)
        await comfy.run(leaky("kept", leak=True))          # the pack caches this module
        seen["cached"] = await rows_now(comfy)
        await comfy.run(leaky("b"))                        # ComfyUI drops the cached one's patcher and warns
        seen["leak"] = await rows_now(comfy)
        status, receipt = await comfy.free()
        seen["free"] = await rows_now(comfy)
        return seen, status, receipt

    seen, status, receipt = serve(version, tmp_path, scenario)
    assert seen["empty"] == {}
    first = seen["load"]["BaseModel#1"]
    assert first["state"] == "loaded" and first["loads"] == 1 and first["in_comfyui_loaded_list"] is True
    unloaded = seen["unload"]["BaseModel#1"]
    assert unloaded["unloads"] == first["unloads"] + 1 and unloaded["loaded_bytes"] == 0
    assert unloaded["in_comfyui_loaded_list"] is False and unloaded["last_unload"] is not None
    [kept_id] = [model_id for model_id in seen["cached"] if model_id not in seen["unload"]]
    assert seen["cached"][kept_id]["leak"] is None
    leaked = seen["leak"][kept_id]
    assert leaked["state"] == "leaked" and leaked["leak"] is not None
    assert status == 200 and [s["model_id"] for s in receipt["survivors"]] == [kept_id]
    assert list(seen["free"]) == [kept_id] and seen["free"][kept_id]["leak"]["stage"] == "rooted"


@pytest.mark.parametrize("version", ["0.27.0"])
def test_models_is_never_stale_after_a_refused_release_a_search_and_a_release_and_keeps_no_model_alive(version, tmp_path):
    async def scenario(comfy):
        answers.models_snapshot().max_age_s = float("inf")
        await comfy.run(leaky("qwen_2512", leak=True))
        await comfy.run(leaky("other"))
        before = await rows_now(comfy)
        [model_id] = [model_id for model_id, row in before.items() if row["leak"] is not None]
        import nodes
        loader = nodes.NODE_CLASS_MAPPINGS["LeakyLoader"]
        loader._cache = dict(loader._cache)               # the pack rebuilt its cache object: a refused release
        refused = await post(comfy, release_path(model_id))
        after_refused = await rows_now(comfy)
        probe = weakref.ref(loader._cache["qwen_2512"])
        searched = await post(comfy, f"/memx/models/{quote(model_id, safe='')}/search")   # finds the new cache
        after_search = await rows_now(comfy)
        done = await post(comfy, release_path(model_id))
        gc.collect()
        after_done = await rows_now(comfy)
        return model_id, before, refused, after_refused, searched, after_search, done, probe, after_done

    model_id, before, refused, after_refused, searched, after_search, done, probe, after_done = serve(
        version, tmp_path, scenario, release="ask")
    assert before[model_id]["release"]["last"] is None
    assert refused[0] == 409 and after_refused[model_id]["release"]["last"] == "changed"
    assert searched[0] == 200 and after_search[model_id]["leak"]["searches"] > after_refused[model_id]["leak"]["searches"]
    assert done[0] == 200 and done[1]["release"]["outcome"] == "released"
    assert probe() is None and model_id not in after_done   # the snapshot served its row and kept nothing of it
