"""The workload: the default text-to-image prompt per seed, and the pack's leaking loaders in their slots."""

import copy
import json

from bench.soak.config import (CENSUS_ID, PACK_LOADER_ID, PACK_SAMPLER_ID, SAMPLER_NODE_ID, SLOTS, WORKFLOW_PATH,
                               WORKLOAD_NEW_LEAKS, WORKLOAD_REUSE)


def load_workflow(path=WORKFLOW_PATH):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def slot_name(slot, generation):
    return f"soak-{slot}-g{generation}"


def build_workload(prompts, workflow, generations=3, slots=SLOTS, workload=WORKLOAD_REUSE):
    """The prompts of a run, in order: dicts with ``index``, ``kind`` ("t2i" or "t2i+pack"), ``seed``, ``prompt``,
    and for pack prompts ``slot``, ``loader``, ``name``, ``generation``.

    Prompt ``i`` is ``workflow`` with the KSampler seed set to ``i``.  ``workload`` ``reuse``: odd prompts add a
    pack loader (cycling through ``slots``) and a sampler on its MODEL, under node ids the workflow does not use;
    the slot's model name changes ``generations`` times over the pack prompts (at even fractions of them), so a new
    model replaces the slot's old one: the same few models keep leaking.  ``new-leaks``: every prompt adds the
    class-cache loader with a slot of its own (the Qwen-Image resolution-keyed cache), so every prompt leaks a
    model never seen before and strict mode investigates a new leak in every prompt.  The same list is run on both
    servers.
    """
    if workload == WORKLOAD_NEW_LEAKS:
        return _new_leak_workload(prompts, workflow)
    pack_total = prompts // 2
    items = []
    for index in range(prompts):
        prompt = copy.deepcopy(workflow)
        prompt[SAMPLER_NODE_ID]["inputs"]["seed"] = index
        item = {"index": index, "kind": "t2i", "seed": index, "prompt": prompt}
        if index % 2 == 1:
            pack_index = index // 2
            slot, loader = slots[pack_index % len(slots)]
            generation = min(generations - 1, pack_index * generations // max(1, pack_total))
            name = slot_name(slot, generation)
            prompt[PACK_LOADER_ID] = {"class_type": loader,
                                      "inputs": {"slot": slot, "name": name, "width": 256, "depth": 4}}
            prompt[PACK_SAMPLER_ID] = {"class_type": "MemxSoakSampler",
                                       "inputs": {"model": [PACK_LOADER_ID, 0], "seed": index}}
            item.update(kind="t2i+pack", slot=slot, loader=loader, name=name, generation=generation)
        items.append(item)
    return items


def _new_leak_workload(prompts, workflow):
    items = []
    for index in range(prompts):
        prompt = copy.deepcopy(workflow)
        prompt[SAMPLER_NODE_ID]["inputs"]["seed"] = index
        slot, loader = f"n{index}", "MemxSoakCachedLoader"
        name = slot_name(slot, 0)
        prompt[PACK_LOADER_ID] = {"class_type": loader, "inputs": {"slot": slot, "name": name, "width": 256,
                                                                   "depth": 4}}
        prompt[PACK_SAMPLER_ID] = {"class_type": "MemxSoakSampler", "inputs": {"model": [PACK_LOADER_ID, 0],
                                                                              "seed": index}}
        items.append({"index": index, "kind": "t2i+pack", "seed": index, "prompt": prompt, "slot": slot,
                      "loader": loader, "name": name, "generation": 0})
    return items


def census_prompt(nonce):
    return {CENSUS_ID: {"class_type": "MemxSoakCensus", "inputs": {"nonce": nonce}}}


def expected_held(workload):
    """``{slot: name}`` of the models the pack holds after the whole workload ran (the last name per slot)."""
    held = {}
    for item in workload:
        if "slot" in item:
            held[item["slot"]] = item["name"]
    return held
