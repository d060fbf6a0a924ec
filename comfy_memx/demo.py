"""``python -m comfy_memx demo``: comfy_memx on a ComfyUI-shaped model manager, no ComfyUI and no GPU needed.

Runs four prompts on the ComfyUI 0.27.0-shaped stand-in that ships with comfy_memx (the one its tests use: a
simulated GPU, real torch modules, ComfyUI's LoadedModel/free_memory/cleanup_models_gc semantics) with a
custom-node pack that leaks, and prints what comfy_memx recorded: the ledger, the unload records with refcounts,
and the leak report naming the node and package that loaded the leaked model.
"""

import argparse
import asyncio
import json
import importlib.util
import logging
import os
import shutil
import sys
import tempfile

MIB = 1024 ** 2


def shapes_dir():
    """Folder of the ComfyUI-shaped stand-ins (``tests/fake_comfy`` in a checkout, ``comfy_memx/_shapes`` installed)."""
    spec = importlib.util.find_spec("comfy_memx._shapes")
    if spec is not None and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)[0]
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fake_comfy")


def _say(text=""):
    print(text, flush=True)


def _prompt(loader, name, leak=False, numel=256 * 1024):
    if loader == "LeakyLoader":
        inputs = {"name": name, "tensor_count": 8, "tensor_numel": numel, "leak": leak}
        return {"1": {"class_type": "LeakyLoader", "inputs": inputs},
                "2": {"class_type": "LeakySampler", "inputs": {"model": ["1", 0]}}}
    return {"1": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 8, "tensor_numel": numel}},
            "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0]}}}


def run(workdir, leak_mode):
    """Drive the stand-in through load, memory-pressure unload and a leak; returns the runtime for printing."""
    os.environ.setdefault("COMFY_MEMX_EVENTS", os.path.join(workdir, "events.jsonl"))
    os.environ.setdefault("COMFY_MEMX_LEAK_MODE", leak_mode)
    from comfy_memx._bootstrap import bootstrap
    bootstrap("demo")
    root = os.path.join(shapes_dir(), "v0_27_0")
    sys.path.insert(0, root)
    import comfy.model_management as mm
    import execution
    import nodes
    pack = os.path.join(workdir, "custom_nodes", "leaky_pack")
    shutil.copytree(os.path.join(shapes_dir(), "packs", "leaky_pack"), pack)
    asyncio.run(nodes.load_custom_node(pack))
    executor = execution.PromptExecutor(None)

    _say("\n== 1. prompt p1: the custom node LeakyLoader (package leaky_pack) loads an 8 MiB model")
    executor.execute(_prompt("LeakyLoader", "sdxl"), "p1")
    _say("\n== 2. prompt p2: p1's nodes plus a core node that loads a second model on a GPU with room for one:"
         " memory-pressure unload")
    mm.SIM_VRAM_TOTAL = mm.minimum_inference_memory() + 12 * MIB
    both = _prompt("LeakyLoader", "sdxl")
    both.update({"3": {"class_type": "SimModelLoader", "inputs": {"tensor_count": 8, "tensor_numel": 256 * 1024}},
                 "4": {"class_type": "SimSampler", "inputs": {"model": ["3", 0]}}})
    executor.execute(both, "p2")
    mm.SIM_VRAM_TOTAL = 8 * 1024 ** 3
    _say("\n== 3. prompt p3: LeakyLoader keeps its torch module in a class-level dict (the classic custom-node leak)")
    executor.execute(_prompt("LeakyLoader", "qwen_2512.safetensors", leak=True), "p3")
    _say("\n== 4. prompt p4 replaces p3's loader output, so ComfyUI drops p3's ModelPatcher; the module stays alive")
    executor.execute(_prompt("LeakyLoader", "flux"), "p4")
    return executor


def print_report(runtime, events):
    """Print the ledger (models alive now) and, from the event log, every unload and leak comfy_memx recorded."""
    _say("\n== comfy_memx ledger (models alive now)")
    _say(f"{'model_id':<13}{'resident':>10}  {'device':<8}{'owner':<58}leak")
    for r in runtime.ledger.records():
        leak = r.leak["stage"] if r.leak else "-"
        _say(f"{r.model_id:<13}{r.loaded_bytes / MIB:>8.1f}Mi  {str(r.device):<8}{r.owner.describe():<58}{leak}")
    _say("\n== unload records from the event log (refcounts measured at unload time)")
    _say(f"{'model_id':<13}{'reason':<17}{'freed':>9}  partial  refcounts patcher/module  extra_referrers")
    for e in events:
        if e["event"] == "unload":
            _say(f"{e['model_id']:<13}{e['reason']:<17}{e['bytes'] / MIB:>7.1f}Mi  {str(e['partial']):<8} "
                 f"{e['refcounts']['patcher']:>7} / {e['refcounts']['module']:<16}{e['extra_referrers']}")
    _say("\n== leak events")
    for e in events:
        if e["event"] == "leak":
            owner = e["owner"]
            _say(f"{e['model_id']} stage={e['stage']} loaded by node {owner['node_id']} ({owner['class_type']}), "
                 f"package {owner['package']}, prompt {owner['prompt_id']}")
            for ref in e["referrers"]:
                _say(f"    held by {ref['path']}  [package {ref['package']}, {ref['root_kind']}]")


def main(argv):
    """Entry point of ``python -m comfy_memx demo``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m comfy_memx demo", description=__doc__.splitlines()[0])
    parser.add_argument("--leak-mode", default="strict", choices=["report", "strict"],
                        help="leak mode to demonstrate (default strict; COMFY_MEMX_LEAK_MODE wins if set)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    workdir = tempfile.mkdtemp(prefix="comfy_memx_demo_")  # kept: it holds the demo's event log
    try:
        executor = run(workdir, args.leak_mode)
        from comfy_memx import runtime
        path = os.environ["COMFY_MEMX_EVENTS"]
        with open(path, encoding="utf-8") as f:
            events = [json.loads(line) for line in f]
        print_report(runtime, events)
        _say(f"\n== {len(events)} events were written to {path} (JSON lines; see the README's Events section)")
        del executor
    finally:
        from comfy_memx import runtime
        runtime.events.close()
    return 0
