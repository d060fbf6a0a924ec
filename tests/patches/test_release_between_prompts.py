"""When releases run, on the stand-in PromptServer with its real prompt worker: on ComfyUI's worker between prompts
(never while a node runs), every survivor of a ``/memx/free`` with ``release`` whose holder is known, a model a
running prompt loaded again is neither leaked nor releasable while it runs, and ``auto`` releases a leak ComfyUI
never warns about (found after a free) between prompts.

The pack is ``tests/fake_comfy/packs/cached_pack``: ``CachedLoader`` hands out a new ModelPatcher of its cached
module on a cache hit, ``HookedLoader`` keeps its module in a callback, ``SlowPass``/``SlowAfter`` hold their MODEL
until the test lets them go."""

import asyncio
import sys
import threading
from urllib.parse import quote

import pytest

from bench.harness.waits import always, no_progress, wait_until_async
from comfy_memx.leaks.release import desk
from memx_helpers import read_events
from test_routes import leaky, serve
from test_unwarned_leaks import add_packs

VERSIONS = ["0.3.64", "0.27.0"]


def pack(class_type):
    """The module of the test pack that defines ``class_type`` (the stand-in imports a pack under its path)."""
    import nodes
    return sys.modules[nodes.NODE_CLASS_MAPPINGS[class_type].__module__]


def loaded(class_type, name, first="1"):
    """A loader node ``first`` and a sampler after it that loads its model."""
    return {first: {"class_type": class_type, "inputs": {"name": name, "tensor_count": 4, "tensor_numel": 1024}},
            str(int(first) + 1): {"class_type": "LeakySampler", "inputs": {"model": [first, 0]}}}


async def leak(comfy, class_type, names):
    """Run one prompt per name (each leaves the pack holding a model), then one more, so that ComfyUI drops the last
    patcher and warns; returns the leaked rows by name of their loader (in load order)."""
    for name in names:
        await comfy.run(loaded(class_type, name))
    await comfy.run(leaky("other"))
    await comfy.run(leaky("another"))
    _, rows = await comfy.get_json("/memx/models")
    leaked = [row for row in rows if row["leak"] is not None]
    assert len(leaked) >= len(names), leaked
    return leaked


async def post(comfy, path, body=None):
    response = await comfy.client.post(path, json=body if body is not None else {})
    return response.status, await response.json(), response.headers


def release_path(model_id, timeout=None):
    return f"/memx/models/{quote(model_id, safe='')}/release" + (f"?timeout={timeout}" if timeout is not None else "")


async def until(ready, what):
    return await wait_until_async(ready, always, no_progress, what, poll_s=0.02)


async def started(comfy, prompt):
    """Queue ``prompt`` and wait until its slow node holds its model."""
    slow = pack("SlowPass").Slow
    slow.go.clear()
    slow.entered.clear()
    slow.left = None
    await comfy.queue(prompt)
    await asyncio.get_running_loop().run_in_executor(None, slow.entered.wait, 60)
    return slow


@pytest.mark.parametrize("version", VERSIONS)
def test_a_release_asked_while_a_slow_node_holds_the_model_the_pack_just_gave_it_cuts_nothing(version, tmp_path):
    """The race users hit: the pack hands a fresh patcher of its cached (leaked) model to a slow node, which holds it
    before anything loaded it; a release asked then waits for the prompt, which loads the model again: in use."""
    async def scenario(comfy):
        await add_packs(tmp_path, "cached_pack")
        [row] = await leak(comfy, "CachedLoader", ["x"])
        cache = pack("CachedLoader").CachedLoader._cache
        slow = await started(comfy, {"1": {"class_type": "CachedLoader", "inputs": {"name": "x"}},
                                     "2": {"class_type": "SlowPass", "inputs": {"model": ["1", 0]}},
                                     "3": {"class_type": "LeakySampler", "inputs": {"model": ["2", 0]}}})
        asked = asyncio.ensure_future(post(comfy, release_path(row["model_id"])))
        await until(lambda: desk.queued() == 1 or asked.done(), "the release to wait on the desk")
        during = ("x" in cache, asked.done())
        slow.go.set()
        status, body, _ = await asked
        return during, status, body, "x" in cache

    (kept_during, answered_during), status, body, kept = serve(version, tmp_path, scenario, release="ask")
    assert kept_during and not answered_during        # nothing happened while the node held the model
    assert status == 409 and body["error"] == "in_use", body
    assert body["release"]["cut"] is None and kept     # after the prompt the model is in use: no cut, ever


def test_a_release_asked_during_a_prompt_waits_for_its_end_or_answers_409_and_cuts_nothing_later(tmp_path):
    async def scenario(comfy):
        await add_packs(tmp_path, "cached_pack")
        [row] = await leak(comfy, "CachedLoader", ["x"])
        cache = pack("CachedLoader").CachedLoader._cache
        slow = await started(comfy, {"1": {"class_type": "CachedLoader", "inputs": {"name": "busy"}},
                                     "2": {"class_type": "SlowPass", "inputs": {"model": ["1", 0]}},
                                     "3": {"class_type": "LeakySampler", "inputs": {"model": ["2", 0]}}})
        refused = await post(comfy, release_path(row["model_id"], timeout=0.3))
        after_refusal = (desk.queued(), "x" in cache)
        waiting = asyncio.ensure_future(post(comfy, release_path(row["model_id"])))
        await until(lambda: desk.queued() == 1, "the release to wait on the desk")
        kept_during = "x" in cache
        slow.go.set()
        status, body, _ = await waiting
        return refused, after_refusal, kept_during, (status, body), slow.left, "x" in cache

    (status_409, body_409, headers), after_refusal, kept_during, (status, body), left, kept = serve(
        "0.27.0", tmp_path, scenario, release="ask")
    assert status_409 == 409 and body_409["error"] == "prompt_running" and int(headers["Retry-After"]) >= 1
    assert "nothing was cut" in body_409["message"]
    assert after_refusal == (0, True)                  # withdrawn: nothing left to cut later
    assert kept_during                                 # the waiting release cut nothing while the prompt ran
    receipt = body["release"]
    assert status == 200 and receipt["outcome"] == "released" and receipt["died"] is True, body
    assert receipt["time"] >= left and not kept        # cut after the slow node let go, between prompts


def test_free_with_release_releases_every_one_of_12_cache_leaks_in_one_call(tmp_path):
    async def scenario(comfy):
        await add_packs(tmp_path, "cached_pack")
        names = [f"m{i}" for i in range(12)]
        leaked = await leak(comfy, "CachedLoader", names)
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True, "release": True})
        return leaked, status, receipt, dict(pack("CachedLoader").CachedLoader._cache)

    leaked, status, receipt, cache = serve("0.27.0", tmp_path, scenario, release="ask")
    assert len(leaked) == 12 and status == 200
    outcomes = sorted((row["model_id"], row["outcome"]) for row in receipt["releases"])
    assert outcomes == sorted((row["model_id"], "released") for row in leaked)
    assert cache == {} and receipt["survivors"] == [] and receipt["release_state"] == "done"


def test_free_with_release_releases_3_cache_leaks_behind_9_newer_callback_leaks(tmp_path):
    async def scenario(comfy):
        await add_packs(tmp_path, "cached_pack")
        await leak(comfy, "CachedLoader", ["a", "b", "c"])
        leaked = await leak(comfy, "HookedLoader", [f"h{i}" for i in range(9)])
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True, "release": True})
        return leaked, status, receipt, dict(pack("CachedLoader").CachedLoader._cache)

    leaked, status, receipt, cache = serve("0.27.0", tmp_path, scenario, release="ask")
    assert len(leaked) == 12 and status == 200
    by_outcome = {}
    for row in receipt["releases"]:
        by_outcome.setdefault(row["outcome"], []).append(row)
    assert len(by_outcome["released"]) == 3 and all(r["pattern"] == "class_cache" for r in by_outcome["released"])
    assert len(by_outcome["refused"]) == 9 and cache == {}
    left = {row["model_id"] for row in receipt["survivors"]}
    assert left == {row["model_id"] for row in by_outcome["refused"]}   # the released ones are not survivors


@pytest.mark.parametrize("version", VERSIONS)
def test_a_leak_a_running_prompt_loaded_again_is_neither_leaked_nor_releasable_while_it_runs(version, tmp_path):
    async def scenario(comfy):
        await add_packs(tmp_path, "cached_pack")
        rows = await leak(comfy, "CachedLoader", ["x", "y"])
        slow = await started(comfy, {**loaded("CachedLoader", "x"),
                                     "3": {"class_type": "SlowAfter", "inputs": {"model": ["1", 0],
                                                                                 "value": ["2", 0]}}})
        _, during = await comfy.get_json("/memx/models")
        free_status, free_receipt = await comfy.free(timeout=0.3)     # pending: the leaked models only
        slow.go.set()
        return rows, during, free_status, free_receipt

    rows, during, free_status, free_receipt = serve(version, tmp_path, scenario, release="ask")
    assert {row["model_id"] for row in during if row["leak"] is not None} == {row["model_id"] for row in rows}
    [x] = [row for row in during if row["leak"] is not None and row["state"] != "leaked"]   # loaded again
    assert x["in_comfyui_loaded_list"] and x["owner"]["prompt_id"] != x["leak"]["prompt_id"]
    assert x["release"]["possible"] is False and x["release"]["why"].startswith("in use: ")
    [y] = [row for row in during if row["state"] == "leaked"]
    assert y["release"]["possible"] is True
    assert free_status == 202 and [s["model_id"] for s in free_receipt["survivors"]] == [y["model_id"]]


def test_auto_releases_a_leak_comfyui_never_warns_about_after_a_free_between_prompts(tmp_path, monkeypatch):
    from comfy_memx.leaks.release import engine
    threads = []
    real = engine.release

    def spy(record, trigger, *args, **kwargs):
        threads.append((trigger, threading.current_thread().name))
        return real(record, trigger, *args, **kwargs)
    monkeypatch.setattr(engine, "release", spy)
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        await add_packs(tmp_path, "hoarding_pack")
        kept = pack("ListLoader")._CACHE
        await comfy.run(loaded("ListLoader", "kept"))
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True})
        await until(lambda: not kept, "the auto release of the model the pack kept")
        return status, receipt

    status, receipt = serve("0.27.0", tmp_path, scenario, release="auto", release_packages="hoarding_pack",
                            events=events)
    [survivor] = receipt["survivors"]
    assert status == 200 and survivor["leak"]["found_by"] == "after_free" and receipt["releases"] == []
    assert threads == [("auto", "prompt_worker")]      # on ComfyUI's worker, at its point between prompts
    [event] = [e for e in read_events(events) if e["event"] == "release"]
    assert event["trigger"] == "auto" and event["outcome"] == "released" and event["died"] is True
    assert event["model_id"] == survivor["model_id"] and event["package"] == "hoarding_pack"


def test_a_free_names_its_12_never_warned_survivors_in_one_gated_pass_of_probes_and_auto_releases_them(tmp_path):
    # each module holds a bound method of its own (a hook): the forward probe cannot account for that reference, so
    # a full holder search each would go on to the backward scan of the heap, twelve times over the search budget;
    # the probes of all twelve need only the shortest path, one gated search for the free
    from comfy_memx.leaks import gate

    async def scenario(comfy):
        await add_packs(tmp_path, "hoarding_pack")
        kept = pack("HookedHoarder").HOARD
        for index in range(12):
            await comfy.run(loaded("HookedHoarder", f"kept{index}"))
        searches = gate.gate().counters["searches"]
        status, receipt = await comfy.free({"unload_models": True, "free_memory": True})
        searched = gate.gate().counters["searches"] - searches
        await until(lambda: not kept, "the auto releases of the twelve models the pack kept")
        return status, receipt, searched

    status, receipt, searched = serve("0.27.0", tmp_path, scenario, release="auto", release_packages="hoarding_pack")
    assert status == 200 and len(receipt["survivors"]) == 12 and searched == 1
    assert all(row["holder"]["stage"] == "probe" and row["holder"]["package"] == "hoarding_pack"
               and row["leak"]["found_by"] == "after_free" for row in receipt["survivors"]), [
        (row["holder"], row["search"]) for row in receipt["survivors"]]
