"""``python -m comfy_memx demo``: comfy_memx on a ComfyUI-shaped model manager, no ComfyUI and no GPU needed.

Runs four prompts in the small ComfyUI-shaped world shipped with comfy_memx (``comfy_memx/cli/demo_world``: a
simulated GPU, real torch modules, ComfyUI's LoadedModel / free_memory / cleanup_models_gc semantics) with a
custom-node pack that leaks, and prints what comfy_memx recorded: the ledger, the unload records with refcounts,
and the leak report naming the node and package that loaded the leaked model and (strict mode) what holds it.
Everything it writes goes to a temporary folder that is removed at the end.
"""

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings

from comfy_memx.core.errors import MemxError
from comfy_memx.core.units import format_bytes
from comfy_memx.ledger.causes import cause_label

WORLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_world")
MIB = 1024 ** 2


def _say(text=""):
    print(text, flush=True)


class _OnlyOnce(logging.Filter):
    """ComfyUI repeats its leak warning at every load; the demo shows each line once."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record):
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


def _loader(name, leak=False):
    return {"1": {"class_type": "LeakyLoader",
                  "inputs": {"name": name, "tensors": 8, "numel": 256 * 1024, "leak": leak}},
            "2": {"class_type": "SimSampler", "inputs": {"model": ["1", 0]}}}


def _say_events(state, seen):
    """Print the load and unload events written since the last call (what comfy_memx recorded in that prompt)."""
    state.events.close()
    try:
        with open(state.config.events, encoding="utf-8") as f:
            events = [json.loads(line) for line in f][seen:]
    except OSError:
        return seen
    for e in events:
        if e["event"] == "load":
            _say(f"   comfy_memx: load of {e['model_id']}: {format_bytes(e['bytes'])} moved, owner "
                 f"{e['owner']['class_type']} ({e['owner']['package']})")
        elif e["event"] == "unload":
            _say(f"   comfy_memx: unload of {e['model_id']}: {e['reason']}, {format_bytes(e['bytes'])} freed"
                 f"{' (partial)' if e['partial'] else ''}, asked for by "
                 f"{cause_label(e['requested_by'], e['reason'])}")
    return seen + len(events)


def run(workdir, leak_mode):
    """Drive the demo world through load, memory-pressure unload and a leak; returns the executor."""
    from comfy_memx.core.bootstrap import bootstrap
    from comfy_memx.core.state import STATE
    os.environ.setdefault("COMFY_MEMX_EVENTS", os.path.join(workdir, "events.jsonl"))
    os.environ.setdefault("COMFY_MEMX_LEAK_MODE", leak_mode)
    bootstrap("demo")
    sys.path.insert(0, WORLD)
    import comfy.model_management as mm
    import execution
    import nodes
    pack = os.path.join(workdir, "custom_nodes", "leaky_pack")
    shutil.copytree(os.path.join(WORLD, "packs", "leaky_pack"), pack)
    asyncio.run(nodes.load_custom_node(pack))   # ComfyUI's loader is a coroutine; the demo has no event loop
    executor = execution.PromptExecutor(None)   # no server: the demo runs prompts directly

    _say("\n== 1. prompt p1: the custom node LeakyLoader (package leaky_pack) loads an 8 MiB model")
    executor.execute(_loader("sdxl"), "p1")
    seen = _say_events(STATE, 0)
    _say("\n== 2. prompt p2: p1's nodes plus a core loader of a second model, on a GPU with room for one:"
         " memory-pressure unload")
    mm.SIM_VRAM_TOTAL = mm.minimum_inference_memory() + 12 * MIB
    both = _loader("sdxl")
    both.update({"3": {"class_type": "SimModelLoader",
                       "inputs": {"tensor_count": 8, "tensor_numel": 256 * 1024}},
                 "4": {"class_type": "SimSampler", "inputs": {"model": ["3", 0]}}})
    executor.execute(both, "p2")
    seen = _say_events(STATE, seen)
    mm.SIM_VRAM_TOTAL = 8 * 1024 ** 3
    _say("\n== 3. prompt p3: LeakyLoader keeps its torch module in a class-level dict (the classic custom-node leak)")
    executor.execute(_loader("qwen_2512.safetensors", leak=True), "p3")
    seen = _say_events(STATE, seen)
    _say("\n== 4. prompt p4 replaces p3's loader output, so ComfyUI drops p3's ModelPatcher; the module stays alive")
    executor.execute(_loader("flux"), "p4")
    return executor


def print_report(state, events):
    """Print the ledger (models alive now) and, from the event log, every unload and leak comfy_memx recorded."""
    _say("\n== comfy_memx ledger (models alive now)")
    _say(f"{'model_id':<12}{'resident':>10}  {'device':<8}{'owner':<58}leak")
    for r in state.ledger.records():
        leak = r.leak["stage"] if r.leak else "-"
        _say(f"{r.model_id:<12}{format_bytes(r.loaded_bytes):>10}  {str(r.device):<8}{r.owner.describe():<58}{leak}")
    _say("\n== unload records from the event log (refcounts measured at unload time)")
    _say(f"{'model_id':<12}{'reason':<17}{'freed':>10}  partial  refcounts patcher/module  extra_referrers")
    for e in events:
        if e["event"] == "unload":
            _say(f"{e['model_id']:<12}{e['reason']:<17}{format_bytes(e['bytes']):>10}  {str(e['partial']):<8} "
                 f"{e['refcounts']['patcher']:>7} / {e['refcounts']['module']:<16}{e['extra_referrers']}")
    _say("\n== leak events")
    for e in events:
        if e["event"] == "leak":
            owner = e["owner"]
            _say(f"{e['model_id']} stage={e['stage']} loaded by node {owner['node_id']} ({owner['class_type']}), "
                 f"package {owner['package']}, prompt {owner['prompt_id']}")
            for ref in e.get("referrers") or ():
                _say(f"    held by {ref['path']}  [package {ref['package']}, {ref['root_kind']}]")


def main(argv):
    """Entry point of ``python -m comfy_memx demo``; returns the exit status (2 for a bad setting)."""
    description = __doc__.splitlines()[0].replace("``", "")   # --help is plain text, not reStructuredText
    parser = argparse.ArgumentParser(prog="python -m comfy_memx demo", description=description)
    parser.add_argument("--leak-mode", default="strict", choices=["report", "strict"],
                        help="leak mode to demonstrate (default strict; COMFY_MEMX_LEAK_MODE wins if set)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    # torch warns when numpy is missing; the demo needs no numpy (the README's first command does not install it)
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    for handler in logging.getLogger().handlers:
        handler.addFilter(_OnlyOnce())
    workdir = tempfile.mkdtemp(prefix="comfy_memx_demo_")
    try:
        try:
            executor = run(workdir, args.leak_mode)
        except MemxError as exc:
            print(f"comfy_memx: {exc}", file=sys.stderr)
            return 2
        from comfy_memx.core.state import STATE
        STATE.events.close()
        path = STATE.config.events
        with open(path, encoding="utf-8") as f:
            events = [json.loads(line) for line in f]
        print_report(STATE, events)
        _say(f"\n== {len(events)} events were written (JSON lines; see docs/operations.md, Events); with "
             "COMFY_MEMX_EVENTS=path they go to a file you keep")
        del executor
        return 0
    finally:
        from comfy_memx.core.state import STATE
        STATE.events.close()
        shutil.rmtree(workdir, ignore_errors=True)
