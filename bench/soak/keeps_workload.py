"""The ``pack-keeps`` workload: every prompt makes a pack keep a new model built by ComfyUI's own checkpoint loader
(a new cache key each prompt), samples it and saves the image; a free follows every ``free_every``-th prompt and the
last one. What the packs hold at any point follows from the prompts, which the verdict compares with the census."""

import copy

from bench.soak.config import (INSPIRE_CKPT_SLOTS, KEEPS_CENSUS_ID, KEEPS_CHECKPOINT_NAME, KEEPS_DECODE_ID,
                               KEEPS_LOADER_ID, KEEPS_LOADERS, KEEPS_PLAIN_LOADER, KEEPS_SAMPLER_ID, KEEPS_SAVE_ID,
                               KEEPS_TEXT_CHECKPOINT_NAME, KEEPS_TEXT_LOADER_ID, KEEPS_WITNESS_ID)
from bench.soak.workload import load_workflow

KEEP = "keep"
BOUNDED = {"inspire": INSPIRE_CKPT_SLOTS}   # loaders whose cache holds at most this many checkpoints (LRU)


def keep_key(index):
    """The cache key of prompt ``index`` (never asked for by another prompt)."""
    return f"memx-keep-{index}"


def _loader_node(loader, key):
    node, key_input = KEEPS_LOADERS[loader]
    inputs = {"ckpt_name": KEEPS_CHECKPOINT_NAME, key_input: key}
    if loader == "inspire":
        inputs["mode"] = "Auto"
    return {"class_type": node, "inputs": inputs}


def keeps_prompt(workflow, index, loader, key):
    """ComfyUI's default text-to-image ``workflow`` with seed ``index`` whose MODEL and VAE come from ``loader``'s
    node (its key ``key``) through the pack's witness; the text encoder stays with the workflow's own
    CheckpointLoaderSimple on the checkpoint with CLIP, which every prompt shares (ComfyUI caches its outputs)."""
    prompt = copy.deepcopy(workflow)
    prompt[KEEPS_TEXT_LOADER_ID]["inputs"]["ckpt_name"] = KEEPS_TEXT_CHECKPOINT_NAME
    prompt[KEEPS_LOADER_ID] = _loader_node(loader, key)
    prompt[KEEPS_WITNESS_ID] = {"class_type": "MemxKeepsWitness",
                                "inputs": {"model": [KEEPS_LOADER_ID, 0], "vae": [KEEPS_LOADER_ID, 2], "key": key,
                                           "clip": [KEEPS_LOADER_ID, 1]}}
    prompt[KEEPS_SAMPLER_ID]["inputs"]["model"] = [KEEPS_WITNESS_ID, 0]
    prompt[KEEPS_SAMPLER_ID]["inputs"]["seed"] = index
    prompt[KEEPS_DECODE_ID]["inputs"]["vae"] = [KEEPS_WITNESS_ID, 1]
    prompt[KEEPS_SAVE_ID]["inputs"]["filename_prefix"] = f"memx_keeps/{key}"
    return prompt


def build_keeps_workload(prompts, loaders=("dict", "lru"), free_every=10, workflow=None):
    """The prompts of a ``pack-keeps`` run, in order: dicts with ``index``, ``kind`` (``keep``), ``loader`` (a name
    of ``KEEPS_LOADERS``, the next of ``loaders`` in turn), ``key``, ``prompt`` (what the comfy_memx servers run),
    ``plain_prompt`` (plain ComfyUI's: the same with Inspire-Pack's loader replaced by the pack's dict loader, which
    keeps nothing there) and ``free_after`` (a free follows this prompt: every ``free_every``-th and the last)."""
    if free_every < 1:
        raise ValueError(f"free_every must be >= 1, got {free_every}")
    unknown = [loader for loader in loaders if loader not in KEEPS_LOADERS]
    if unknown or not loaders:
        raise ValueError(f"loaders must be some of {sorted(KEEPS_LOADERS)}, got {list(loaders)}")
    workflow = workflow or load_workflow()
    items = []
    for index in range(prompts):
        loader = loaders[index % len(loaders)]
        key = keep_key(index)
        prompt = keeps_prompt(workflow, index, loader, key)
        plain_loader = KEEPS_PLAIN_LOADER if loader == "inspire" else loader
        items.append({"index": index, "kind": KEEP, "loader": loader, "key": key, "prompt": prompt,
                      "plain_prompt": keeps_prompt(workflow, index, plain_loader, key),
                      "free_after": (index + 1) % free_every == 0 or index == prompts - 1})
    return items


def keeps_census_prompt(nonce):
    """A prompt of the pack's census node alone."""
    return {KEEPS_CENSUS_ID: {"class_type": "MemxKeepsCensus", "inputs": {"nonce": nonce}}}


def _held(keys_by_loader):
    """The keys the packs hold, from the keys each loader kept in order (a bounded one holds its newest only)."""
    held = []
    for loader, keys in keys_by_loader.items():
        bound = BOUNDED.get(loader)
        held += keys[-bound:] if bound else keys
    return held


def held_keys(items, upto=None, release_at_frees=False):
    """The keys the packs hold after prompt ``upto`` (default: the last): every key of an unbounded loader, the
    newest ``INSPIRE_CKPT_SLOTS`` of Inspire-Pack's; with ``release_at_frees`` only those kept since the last free
    (what a release after every free leaves)."""
    kept = {}
    for item in items:
        if upto is not None and item["index"] > upto:
            break
        kept.setdefault(item["loader"], []).append(item["key"])
        if release_at_frees and item["free_after"]:
            kept = {}
    return sorted(_held(kept))


def entries_to_release(items):
    """How many cache entries a release after every free has to cut: at each free, what the packs kept since the
    previous one (a bounded cache holds at most its size of them)."""
    total, kept = 0, {}
    for item in items:
        kept.setdefault(item["loader"], []).append(item["key"])
        if item["free_after"]:
            total += len(_held(kept))
            kept = {}
    return total
