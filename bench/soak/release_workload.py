"""The ``release`` workload: every prompt leaks a new model through one of the release pack's caches, and every so
often a prompt repeats an earlier one, whose cache entry the pack must then recompute where it was released."""

from bench.soak.config import (RELEASE_CENSUS_ID, RELEASE_LOADERS, RELEASE_LOADER_ID, RELEASE_RENDER_ID,
                               RELEASE_SAVE_ID, RELEASE_SIDE)

LEAK, REUSE = "leak", "reuse"


def model_bytes(features, depth):
    """Bytes of one of the pack's models (float32 weights and biases of ``depth`` square Linear layers); the same
    formula as the pack's ``model_bytes``."""
    return 4 * depth * (features * features + features)


def _resolution(count):
    """The ``count``-th resolution of the class cache: a new (width, height) for every count, in steps of 8."""
    return RELEASE_SIDE + 8 * (count % 16), RELEASE_SIDE + 8 * (count // 16)


def _leak_prompt(index, loader, ordinal, features, depth):
    """The prompt of leak ``index``: the loader's node with a key of its own, the render node, ComfyUI's SaveImage."""
    node, kind = RELEASE_LOADERS[loader]
    if loader == "resolution":
        width, height = _resolution(ordinal)
        inputs = {"width": width, "height": height}
        key, tag = f"resolution:{width}x{height}", f"resolution-{width}x{height}"
    else:
        width = height = RELEASE_SIDE
        name = f"{kind}{index}"
        inputs = {"name": name}
        key, tag = f"{loader}:{name}", f"{loader}-{name}"
    inputs.update(features=features, depth=depth)
    prompt = {
        RELEASE_LOADER_ID: {"class_type": node, "inputs": inputs},
        RELEASE_RENDER_ID: {"class_type": "MemxReleaseRender",
                            "inputs": {"model": [RELEASE_LOADER_ID, 0], "seed": index, "width": width,
                                       "height": height}},
        RELEASE_SAVE_ID: {"class_type": "SaveImage",
                          "inputs": {"images": [RELEASE_RENDER_ID, 0], "filename_prefix": f"memx_release/{tag}"}},
    }
    return key, prompt


def build_release_workload(prompts, reuse_every=10, min_age=8, features=1024, depth=2):
    """The prompts of a ``release`` run, in order: dicts with ``index``, ``kind`` (``leak`` or ``reuse``),
    ``loader`` (``resolution``, ``named``, ``bounded``, ``list``), ``key`` (the pack's name of the model the prompt
    needs, as its census reports it), ``origin`` (the index of the prompt that first built that key) and ``prompt``.

    A ``leak`` prompt asks the next loader in turn (class cache by resolution, unbounded lru_cache, bounded
    lru_cache, module list) for a model never asked for before, renders it and saves the image. Every
    ``reuse_every``-th prompt (``index % reuse_every == reuse_every - 1``) is instead the very same prompt as the
    oldest leak prompt not repeated yet that is at least ``min_age`` prompts old: its model was released by then
    (where release is on), so the pack recomputes it, and its image must equal the original's byte for byte. With
    release off the pack's cache still holds it: nothing new leaks.
    """
    if reuse_every < 2:
        raise ValueError(f"reuse_every must be >= 2, got {reuse_every}")
    items, ordinals, waiting = [], dict.fromkeys(RELEASE_LOADERS, 0), []
    leaks = 0
    for index in range(prompts):
        due = index % reuse_every == reuse_every - 1
        if due and waiting and waiting[0]["index"] <= index - min_age:
            origin = waiting.pop(0)
            items.append({"index": index, "kind": REUSE, "loader": origin["loader"], "key": origin["key"],
                          "origin": origin["index"], "prompt": origin["prompt"]})
            continue
        loader = tuple(RELEASE_LOADERS)[leaks % len(RELEASE_LOADERS)]
        key, prompt = _leak_prompt(index, loader, ordinals[loader], features, depth)
        ordinals[loader] += 1
        leaks += 1
        item = {"index": index, "kind": LEAK, "loader": loader, "key": key, "origin": index, "prompt": prompt}
        items.append(item)
        waiting.append(item)
    return items


def release_census_prompt(nonce):
    """A prompt of the release pack's census node alone."""
    return {RELEASE_CENSUS_ID: {"class_type": "MemxReleaseCensus", "inputs": {"nonce": nonce}}}


def distinct_keys(workload):
    """Every model key the workload asks for (what a pack that never lets go holds at the end)."""
    return sorted({item["key"] for item in workload})


def recent_keys(workload, lag):
    """The keys of the last ``lag`` prompts: models ComfyUI may not have warned about by the end of the run (the
    last prompt's patcher is still in ComfyUI's output cache, the one before may not have been collected yet)."""
    return sorted({item["key"] for item in workload[len(workload) - lag:]}) if lag > 0 else []


def built_after(workload, start, release):
    """How many models the pack builds in prompts with index > ``start``: every leak prompt, and with ``release``
    (its earlier model cut) every reuse prompt too."""
    return sum(1 for item in workload if item["index"] > start and (item["kind"] == LEAK or release))
