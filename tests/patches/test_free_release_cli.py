"""``python -m comfy_memx free --release`` through the CLI against the stand-in PromptServer with its real prompt
worker: releases first, then the survivors that are left (a released model is never listed as still alive); a
refusal names the holder the receipt names; the exit status says what happened (``--help`` lists each); release off
is refused before anything is unloaded."""

import asyncio
import re

from comfy_memx.cli import free as free_cli
from memx_helpers import read_events
from test_model_creation import PACK, SIZES, install_keeper, keeper_cleanup, keeper_prompt  # noqa: F401  (a fixture)
from test_release_between_prompts import leak, until
from test_routes import leaky, serve
from test_unwarned_leaks import add_packs


async def cli(comfy, *args):
    """Run ``free`` against the test server on a thread (the CLI blocks); returns its exit status."""
    url = f"http://127.0.0.1:{comfy.client.port}"
    return await asyncio.get_running_loop().run_in_executor(None, free_cli.main, ["--url", url, *args])


def test_free_release_prints_the_releases_first_then_the_survivors_left_and_refusals_name_their_holder(
        tmp_path, capsys):
    async def scenario(comfy):
        await add_packs(tmp_path, "cached_pack")
        await leak(comfy, "CachedLoader", ["c"])
        await leak(comfy, "HookedLoader", ["h"])
        status = await cli(comfy, "--release")
        again = await cli(comfy, "--release", "--json")
        return status, again

    status, again = serve("0.27.0", tmp_path, scenario, release="ask")
    out = capsys.readouterr().out
    first, second = out.split("\n{", 1)
    lines = first.splitlines()
    released = next(i for i, line in enumerate(lines) if line.startswith("released 1 of 2 survivor(s)"))
    left = next(i for i, line in enumerate(lines) if line.startswith("survivors left: 1 model(s)"))
    assert released < left                                      # releases first, then what is left
    [cut] = [line for line in lines if line.startswith("  released ")]
    model_id = cut.split()[1]
    assert "CachedLoader._cache['c']" in cut and "the model is gone" in cut
    assert all(model_id not in line for line in lines[left:])   # the released model is no survivor
    [refusal] = [i for i, line in enumerate(lines) if line.startswith("  not released ")]
    holder = re.match(r"\s+holder: (\S+)", lines[refusal + 1]).group(1)
    assert holder.startswith("cached_pack.HOOKS[")
    assert any(line.strip().startswith(f"held by {holder}") for line in lines[left:])   # the same holder
    assert "ComfyUI's output cache" not in first
    assert status == free_cli.HELD == 1                          # one survivor is left alive
    assert again == 1 and '"release_state": "done"' in "{" + second


def test_free_release_that_releases_every_survivor_exits_0(tmp_path, capsys):
    async def scenario(comfy):
        await add_packs(tmp_path, "cached_pack")
        await leak(comfy, "CachedLoader", ["a", "b"])
        return await cli(comfy, "--release")

    status = serve("0.27.0", tmp_path, scenario, release="ask")
    out = capsys.readouterr().out
    assert status == 0 and "released 2 of 2 survivor(s) with a known holder" in out
    assert "survivors left: none" in out and "still alive" not in out


def test_free_release_while_release_is_off_is_refused_before_anything_is_unloaded(tmp_path, capsys):
    async def scenario(comfy):
        await comfy.run(leaky("kept"))
        status = await cli(comfy, "--release")
        _, rows = await comfy.get_json("/memx/models")
        return status, rows

    status, rows = serve("0.27.0", tmp_path, scenario)
    captured = capsys.readouterr()
    assert status == free_cli.REFUSED == 4
    assert "release is off" in captured.err and "nothing was unloaded" in captured.err and captured.out == ""
    [row] = rows
    assert row["in_comfyui_loaded_list"] and row["unloads"] == 0


def test_free_help_explains_every_exit_status(capsys):
    try:
        free_cli.main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    assert "exit status:" in out
    for code, text in free_cli.EXIT_CODES:
        assert re.search(rf"^  {code}  {re.escape(text.split()[0])}", out, flags=re.M), (code, out)
    assert [code for code, _ in free_cli.EXIT_CODES] == [0, 1, 2, 3, 4]


def test_free_release_of_a_packs_model_clip_vae_entry_is_one_release_of_three_models(tmp_path, capsys,
                                                                                      keeper_cleanup):
    # the pack keeps (name, model, clip, vae, keys): one cut frees the three; the CLIP and VAE get no receipt of
    # their own saying they were "gone" before their release, and the counts are of models
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        cache = await install_keeper(tmp_path)
        await comfy.run(keeper_prompt())
        status = await cli(comfy, "--release")
        return status, list(cache.loaded_objects["ckpt"])

    status, left = serve("0.27.0", tmp_path, scenario, release="ask", events=events)
    out = capsys.readouterr().out
    assert status == free_cli.FREED and left == []
    assert "released 3 of 3 survivor(s) with a known holder: " in out and "by cutting 1 cache entry" in out, out
    assert "not released" not in out and out.count("    with it ") == 2 and "survivors left: none" in out, out
    [release] = [event for event in read_events(events) if event["event"] == "release"]
    assert release["outcome"] == "released" and release["trigger"] == "free"
    assert sorted((model["model"], model["died"]) for model in release["models"]) == [
        ("AutoencoderKL", True), ("BaseModel", True), ("SD1ClipModel", True)]
    assert release["released_bytes"] == sum(SIZES.values())


def test_auto_releases_a_packs_model_clip_vae_entry_once(tmp_path, keeper_cleanup):
    events = tmp_path / "events.jsonl"

    async def scenario(comfy):
        cache = await install_keeper(tmp_path)
        await comfy.run(keeper_prompt())
        await comfy.free({"unload_models": True, "free_memory": True})
        await until(lambda: not cache.loaded_objects["ckpt"], "the auto release of the pack's entry")
        await comfy.run(leaky("after"))   # the worker's next pass: a job still queued would run here
        return [event for event in read_events(events) if event["event"] == "release"]

    releases = serve("0.27.0", tmp_path, scenario, release="auto", release_packages=PACK, events=events)
    assert [(event["outcome"], len(event["models"])) for event in releases] == [("released", 3)], releases
