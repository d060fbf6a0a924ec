"""Where a release shows, on the stand-in PromptServer with its real prompt worker (the leaky pack keeps each model in
``LeakyLoader._cache``): ``GET /memx/releases`` (the panel's Released list) lists a release by the route (the Release
button), by ``/memx/free`` with ``release`` (``free --release``) and by ``COMFY_MEMX_RELEASE=auto`` with its models,
bytes given back and memory before and after; ``GET /memx/timeline`` marks each on the model's lane, which ends
there; ``python -m comfy_memx report`` on the events file lists each model as released, not leaked, with the bytes
given back per holding package."""

import pytest

from bench.harness.waits import always, no_progress, wait_until_async
from comfy_memx.cli import report
from test_release_routes import leak_one, post, release_path
from test_routes import leaky, serve

VERSIONS = ["0.3.64", "0.27.0"]
RECEIPT_FIELDS = {"model", "model_id", "trigger", "outcome", "package", "pattern", "path", "cut", "method",
                  "other_entries_dropped", "bytes", "memory", "died", "next_holder", "reason", "fix", "time", "models",
                  "released_bytes"}


async def read_views(comfy):
    """(releases answer, timeline release entries, /memx/models rows)."""
    _, releases = await comfy.get_json("/memx/releases")
    _, timeline = await comfy.get_json("/memx/timeline")
    _, rows = await comfy.get_json("/memx/models")
    return releases, [e for e in timeline["entries"] if e["kind"] == "release"], rows, timeline["entries"]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_release_by_the_route_and_by_free_shows_in_the_released_list_the_timeline_and_the_report(version, tmp_path):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        first = await leak_one(comfy, "first")
        answer = await post(comfy, release_path(first["model_id"]))
        second = await leak_one(comfy, "second")
        freed = await comfy.free({"unload_models": True, "free_memory": True, "release": True})
        return first, answer, second, freed, await read_views(comfy)

    first, (status, _), second, (_, freed), views = serve(version, tmp_path, scenario, release="ask", events=events)
    releases, marks, rows, entries = views
    assert status == 200 and [r["outcome"] for r in freed["releases"]] == ["released"]
    cut = releases["releases"]
    assert [(r["model_id"], r["trigger"], r["outcome"]) for r in cut] == [
        (first["model_id"], "http", "released"), (second["model_id"], "free", "released")], cut
    for receipt, row in zip(cut, (first, second)):
        assert RECEIPT_FIELDS <= set(receipt), set(receipt) ^ RECEIPT_FIELDS
        assert receipt["released_bytes"] == row["bytes"] > 0 and receipt["package"] == "leaky_pack"
        assert receipt["models"] == [{"model": row["model"], "model_id": row["model_id"], "bytes": row["bytes"],
                                      "died": True}]
        assert receipt["memory"]["before"]["rss"] > 0 and receipt["memory"]["after"]["rss"] > 0
        assert receipt["cut"].startswith("leaky_pack.LeakyLoader._cache[")
    assert releases["capacity"] == 64 and releases["cut"] == 2
    assert releases["released_bytes"] == first["bytes"] + second["bytes"]
    assert [(m["model_id"], m["trigger"], m["died"], m["loaded_bytes"]) for m in marks] == [
        (first["model_id"], "http", True, 0), (second["model_id"], "free", True, 0)], marks
    for row in (first, second):   # the lane ends at the release: no later entry of the model
        last = [e["kind"] for e in entries if e["model_id"] == row["model_id"]][-1]
        assert last == "release" and row["model_id"] not in {r["model_id"] for r in rows}

    data = report.read_events(events).as_dict()
    by_id = {row["model_id"]: row for row in data["models"]}
    for row, trigger in ((first, "http"), (second, "free")):
        shown = by_id[row["model_id"]]
        assert shown["status"] == "released" and shown["released_bytes"] == row["bytes"], shown
        assert [(r["trigger"], r["died"]) for r in shown["release_log"]] == [(trigger, [row["model_id"]])]
    assert data["released_by_package"] == [{"package": "leaky_pack", "releases": 2, "models": 2,
                                            "released_bytes": first["bytes"] + second["bytes"]}]
    text = report.format_text(report.read_events(events), str(events))
    assert (f"{first['model_id']}  BaseModel  built by package leaky_pack (LeakyLoader, node 1), loaded by package "
            "leaky_pack, was held by package leaky_pack, released") in text, text
    assert "leaked rooted 1, then released (no longer leaked)" in text
    assert "by the Release button or POST /memx/models/{id}/release: cut leaky_pack.LeakyLoader._cache['first']" in text
    assert "by free --release: cut leaky_pack.LeakyLoader._cache['second']" in text
    assert "leaky_pack: 2 release(s), 2 model(s) freed" in text


@pytest.mark.parametrize("version", VERSIONS)
def test_an_automatic_release_shows_in_the_released_list_the_timeline_and_the_report(version, tmp_path):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        await comfy.run(leaky("auto", leak=True))
        await comfy.run(leaky("other"))    # ComfyUI warns: auto queues the release for the worker's next pause

        async def released():
            _, answer = await comfy.get_json("/memx/releases")
            return bool(answer["releases"])

        await wait_until_async(released, always, no_progress, "the auto release between prompts", poll_s=0.02)
        return await read_views(comfy)

    releases, marks, rows, _ = serve(version, tmp_path, scenario, release="auto", release_packages="leaky_pack",
                                     events=events)
    [receipt] = releases["releases"]
    assert receipt["trigger"] == "auto" and receipt["outcome"] == "released" and receipt["died"] is True
    assert receipt["released_bytes"] == receipt["bytes"] > 0 == sum(1 for row in rows if row["leak"])
    [mark] = marks
    assert mark["model_id"] == receipt["model_id"] and mark["trigger"] == "auto" and mark["loaded_bytes"] == 0
    data = report.read_events(events).as_dict()
    [shown] = [row for row in data["models"] if row["model_id"] == receipt["model_id"]]
    assert shown["status"] == "released" and data["released_bytes"] == receipt["bytes"]
    assert "by COMFY_MEMX_RELEASE=auto: cut leaky_pack.LeakyLoader._cache['auto']" in report.format_text(
        report.read_events(events), str(events))


def test_the_released_list_fills_in_models_and_released_bytes_for_older_receipts(monkeypatch):
    """A receipt written without ``models``/``released_bytes`` gets them from ``model_id``/``bytes``/``died``; one
    that cut nothing gives nothing back; a receipt that has them keeps its own."""
    from comfy_memx.surface import releases
    old = {"model": "M", "model_id": "M#1", "outcome": "released", "bytes": 10, "died": True, "trigger": "auto"}
    refused = {"model": "M", "model_id": "M#2", "outcome": "refused", "bytes": 10, "died": False, "trigger": "http"}
    new = {"model": "M", "model_id": "M#3", "outcome": "released", "bytes": 10, "died": True, "trigger": "free",
           "models": [{"model": "M", "model_id": "M#3", "bytes": 10, "died": True},
                      {"model": "V", "model_id": "V#4", "bytes": 5, "died": True}], "released_bytes": 15}
    monkeypatch.setattr(releases.leaks, "recent_releases", lambda: [old, refused, new])
    view = releases.view()
    assert [r["released_bytes"] for r in view["releases"]] == [10, 0, 15]
    assert view["releases"][0]["models"] == [{"model": "M", "model_id": "M#1", "bytes": 10, "died": True}]
    assert [m["model_id"] for m in view["releases"][2]["models"]] == ["M#3", "V#4"]
    assert view["released_bytes"] == 25 and view["cut"] == 2
