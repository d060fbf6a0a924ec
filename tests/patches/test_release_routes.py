"""POST /memx/models/{id}/release, the rows' release field, /memx/free with release and the release metrics, on the
stand-in PromptServer with its real prompt worker (the leaky pack keeps each model in ``LeakyLoader._cache``)."""

import gc
import weakref
from urllib.parse import quote

import pytest

from comfy_memx.cli import free as free_cli
from memx_helpers import read_events
from test_routes import leaky, serve

VERSIONS = ["0.3.64", "0.27.0"]


async def leak_one(comfy, name="qwen_2512"):
    """Run a prompt whose model the pack caches, then another: ComfyUI drops the first patcher and warns."""
    await comfy.run(leaky(name, leak=True))
    await comfy.run(leaky("other"))
    _, rows = await comfy.get_json("/memx/models")
    return next(row for row in rows if row["leak"] is not None)


async def post(comfy, path, body=None):
    response = await comfy.client.post(path, json=body) if body is not None else await comfy.client.post(path)
    return response.status, await response.json()


def release_path(model_id):
    return f"/memx/models/{quote(model_id, safe='')}/release"


@pytest.mark.parametrize("version", VERSIONS)
def test_release_is_off_by_default_and_says_how_to_turn_it_on(version, tmp_path):
    async def scenario(comfy):
        row = await leak_one(comfy)
        answer = await post(comfy, release_path(row["model_id"]))
        import nodes
        return row, answer, dict(nodes.NODE_CLASS_MAPPINGS["LeakyLoader"]._cache)

    row, (status, body), cache = serve(version, tmp_path, scenario)
    assert row["release"]["policy"] == "off" and row["release"]["possible"] is False
    assert "COMFY_MEMX_RELEASE" in row["release"]["why"]
    assert status == 403 and body["error"] == "release_off" and "COMFY_MEMX_RELEASE=ask" in body["message"]
    assert "qwen_2512" in cache   # nothing cut


@pytest.mark.parametrize("version", VERSIONS)
def test_a_leaked_model_is_released_over_http_and_disappears(version, tmp_path):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        row = await leak_one(comfy)
        import nodes
        cache = nodes.NODE_CLASS_MAPPINGS["LeakyLoader"]._cache
        probe = weakref.ref(cache["qwen_2512"])
        answer = await post(comfy, release_path(row["model_id"]))
        gc.collect()
        _, after = await comfy.get_json("/memx/models")
        again = await comfy.run(leaky("qwen_2512", leak=True))   # the pack rebuilds what it needs
        return row, answer, probe, after, "qwen_2512" in cache, again

    row, (status, body), probe, after, rebuilt, _ = serve(version, tmp_path, scenario, release="ask", events=events)
    assert row["release"] == {"policy": "ask", "possible": True, "why": None,
                              "path": "leaky_pack.LeakyLoader._cache['qwen_2512']", "last": None}
    receipt = body["release"]
    assert status == 200 and receipt["outcome"] == "released" and receipt["died"] is True, body
    assert receipt["cut"] == "leaky_pack.LeakyLoader._cache['qwen_2512']" and receipt["trigger"] == "http"
    assert receipt["bytes"] == row["bytes"] > 0 and receipt["package"] == "leaky_pack"
    assert probe() is None and row["model_id"] not in {r["model_id"] for r in after}
    assert rebuilt
    [event] = [e for e in read_events(events) if e["event"] == "release"]
    assert event["model_id"] == row["model_id"] and event["outcome"] == "released"


@pytest.mark.parametrize("version", ["0.27.0"])
def test_a_changed_cache_answers_409_and_nothing_is_cut(version, tmp_path):
    async def scenario(comfy):
        row = await leak_one(comfy)
        import nodes
        loader = nodes.NODE_CLASS_MAPPINGS["LeakyLoader"]
        loader._cache = dict(loader._cache)      # the pack rebuilt its cache object
        answer = await post(comfy, release_path(row["model_id"]))
        return answer, dict(loader._cache)

    (status, body), cache = serve(version, tmp_path, scenario, release="ask")
    assert status == 409 and body["error"] == "changed" and "nothing was cut" in body["message"]
    assert body["release"]["cut"] is None and "qwen_2512" in cache


@pytest.mark.parametrize("version", ["0.27.0"])
def test_release_answers_404_for_an_unknown_model_and_400_for_a_bad_body(version, tmp_path):
    async def scenario(comfy):
        row = await leak_one(comfy)
        unknown = await post(comfy, release_path("Nope#1"))
        bad = await post(comfy, release_path(row["model_id"]), {"path": 12})
        elsewhere = await post(comfy, release_path(row["model_id"]), {"path": "leaky_pack.Elsewhere"})
        return unknown, bad, elsewhere

    (s1, unknown), (s2, bad), (s3, elsewhere) = serve(version, tmp_path, scenario, release="ask")
    assert s1 == 404 and unknown["error"] == "unknown_model"
    assert s2 == 400 and "path" in bad["message"]
    assert s3 == 422 and elsewhere["error"] == "not_releasable" and "no holder at that path" in elsewhere["message"]


@pytest.mark.parametrize("version", VERSIONS)
def test_free_with_release_cuts_the_survivors_and_the_cli_says_so(version, tmp_path):
    async def scenario(comfy):
        await leak_one(comfy)
        return await comfy.free({"unload_models": True, "free_memory": True, "release": True})

    status, receipt = serve(version, tmp_path, scenario, release="ask")
    assert status == 200 and receipt["survivors"] == [] and receipt["survivor_bytes"] == 0   # released: not left
    [released] = receipt["releases"]
    assert released["outcome"] == "released" and released["trigger"] == "free" and released["died"] is True
    assert receipt["release_bytes"] == released["bytes"] > 0 and receipt["release_state"] == "done"
    assert receipt["memory"]["held_bytes"] == 0   # read after the release: nothing of it is still counted
    text = "\n".join(free_cli.format_receipt(receipt))
    assert f"released {released['model_id']} (" in text and "LeakyLoader._cache['qwen_2512']" in text
    assert "released 1 of 1 survivor(s) with a known holder: " in text and "survivors left: none" in text
    assert "the model is gone" in text and free_cli.exit_status(receipt) == 0


@pytest.mark.parametrize("version", ["0.27.0"])
def test_free_with_release_while_release_is_off_is_refused_before_anything_is_unloaded(version, tmp_path):
    async def scenario(comfy):
        await comfy.run(leaky("kept"))                 # a model ComfyUI keeps loaded
        await leak_one(comfy)
        answer = await comfy.free({"unload_models": True, "free_memory": True, "release": True})
        _, rows = await comfy.get_json("/memx/models")
        return answer, rows

    (status, body), rows = serve(version, tmp_path, scenario)
    assert status == 403 and body["error"] == "release_off" and "nothing was unloaded" in body["message"]
    assert any(row["in_comfyui_loaded_list"] for row in rows)        # ComfyUI still has its models loaded
    assert all(row["last_unload"] is None or row["last_unload"]["reason"] != "free_request" for row in rows)


@pytest.mark.parametrize("version", ["0.27.0"])
def test_release_metrics_count_outcomes_and_bytes_by_package(version, tmp_path):
    parser = pytest.importorskip("prometheus_client.parser")

    async def scenario(comfy):
        row = await leak_one(comfy)
        await post(comfy, release_path(row["model_id"]))
        response = await comfy.client.get("/memx/metrics")
        return row, await response.text()

    row, text = serve(version, tmp_path, scenario, release="ask")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in parser.text_string_to_metric_families(text) for s in family.samples}
    assert samples[("comfy_memx_releases_total", (("outcome", "released"), ("package", "leaky_pack")))] == 1
    assert samples[("comfy_memx_released_bytes_total", (("package", "leaky_pack"),))] == row["bytes"]
