"""Benchmark case ``pins``: bytes registered per workflow cycle under four pin-eviction policies.

A cyclic workflow loads N models in turn (text encoder, diffusion model, VAE, ...) with a pin cap that holds the k
largest of them.  Each load needs all of its model's bytes pinned; bytes still pinned from before are free, the
rest must be registered (``cudaHostRegister``, about 0.5-1 s/GB), evicting other models' pins when the cap is hit.
Pins are requested one 64 MiB module at a time, as ComfyUI does, and may be evicted partially.  Policies:

``mru``      :class:`comfy_memx.pins.budget.PinBudget` itself (most recently used other model first).
``lru``      the same budget with ``policy="lru"``.
``comfyui``  ComfyUI 0.27.0's ``free_registrations``: walk ``reversed(current_loaded_models)`` (least recently
             loaded first) over inactive models, unregistering the shortfall plus ``REGISTERABLE_PIN_HYSTERESIS``
             (2 GiB), then, as ``evict_active=True`` allows, the active model's own pins.
``optimal``  the offline optimum for this model of pinning: on each shortfall evict from the other model whose next
             use is farthest in the future (Belady's rule, partially, as much as needed).  With every byte of a
             model sharing its model's next-use time, Belady's exchange argument carries over, so this is the exact
             minimum of bytes registered among all policies that pin each model fully for its load, for equal and
             mixed sizes alike; ``tests/unit/test_bench_pins.py`` checks it against exhaustive search on small cases.

Besides pure cycles, one "hires" pattern per size mix (TE, UNet, VAE, UNet, VAE) shows a workflow that is not a
pure cycle; there MRU is no longer optimal.

Each figure is a record ``{"case": "pins", "metric": "bytes_registered_per_cycle", "policy", "config", "value",
"unit": "bytes"}`` (steady state, after warm-up cycles), plus ``bytes_registered_total`` over the whole run.
Run ``python -m bench.pins [--quick] [--json]`` for a table.
"""

import argparse
import json
import os
import sys

from comfy_memx.pins.budget import PinBudget

MIB = 1024 ** 2
GIB = 1024 ** 3
MODULE_BYTES = 64 * MIB
COMFYUI_HYSTERESIS = 2 * GIB
POLICIES = ("mru", "lru", "comfyui", "optimal")

# Cycle order of a typical workflow; sizes are multiples of MODULE_BYTES.
WORKFLOW = (("clip_l", 256 * MIB), ("t5xxl_fp8", 4992 * MIB), ("controlnet", 3328 * MIB),
            ("flux_fp8", 11392 * MIB), ("vae", 192 * MIB), ("upscaler", 64 * MIB))


def mix_sizes(mix, n):
    """Sizes in bytes of the ``n`` models of size mix ``mix`` ("equal", "big+small" or "workflow"), in cycle order."""
    if mix == "equal":
        return [4 * GIB] * n
    if mix == "big+small":
        return [12 * GIB] + [2 * GIB] * (n - 1)
    if mix == "workflow":
        chosen = {3: (1, 3, 4), 4: (1, 2, 3, 4), 5: (0, 1, 2, 3, 4), 6: (0, 1, 2, 3, 4, 5)}[n]
        return [WORKFLOW[i][1] for i in chosen]
    raise ValueError("unknown size mix %r" % mix)


def cap_for(sizes, k):
    """A cap that holds the ``k`` largest models at once (so any ``k`` of them, and every single one)."""
    return sum(sorted(sizes, reverse=True)[:k])


def simulate(policy, sizes, cap, sequence):
    """Replay ``sequence`` (model indices) and return the bytes registered after each step, cumulatively."""
    if policy in ("mru", "lru"):
        return _simulate_budget(policy, sizes, cap, sequence)
    if policy == "comfyui":
        return _simulate_comfyui(sizes, cap, sequence)
    if policy == "optimal":
        return _simulate_optimal(sizes, cap, sequence)
    raise ValueError("unknown policy %r" % policy)


def _modules(nbytes):
    while nbytes > 0:
        yield min(MODULE_BYTES, nbytes)
        nbytes -= MODULE_BYTES


def _simulate_budget(policy, sizes, cap, sequence):
    budget = PinBudget(cap, policy=policy)
    pinned = [0] * len(sizes)
    registered, history = 0, []
    for model in sequence:
        with budget.load([str(model)]):
            for size in _modules(sizes[model] - pinned[model]):
                decision = budget.request(str(model), size)
                if not decision.granted:
                    raise AssertionError("budget refused %d bytes for model %d: %s" % (size, model, decision.reason))
                for victim, freed in decision.evict:
                    pinned[int(victim)] -= freed
                    budget.release(victim, freed)
                pinned[model] += size
                registered += size
        history.append(registered)
    return history


def _simulate_comfyui(sizes, cap, sequence):
    pinned = [0] * len(sizes)
    loaded = []  # current_loaded_models: index 0 = most recently loaded
    registered, history = 0, []
    for model in sequence:
        if model in loaded:
            loaded.remove(model)
        loaded.insert(0, model)
        for size in _modules(sizes[model] - pinned[model]):
            shortfall = sum(pinned) + size - cap
            if shortfall > 0:
                target = shortfall + COMFYUI_HYSTERESIS
                inactive = [m for m in reversed(loaded) if m != model]
                for victim in inactive + [model]:  # then the active model itself (evict_active=True)
                    freed = min(pinned[victim], target)
                    pinned[victim] -= freed
                    target -= freed
                    if target <= 0:
                        break
                if sum(pinned) + size > cap:
                    continue  # ComfyUI would steal a pin or leave the module unpinned: nothing registered
            pinned[model] += size
            registered += size
        history.append(registered)
    return history


def _simulate_optimal(sizes, cap, sequence):
    pinned = [0] * len(sizes)
    registered, history = 0, []
    for step, model in enumerate(sequence):
        missing = sizes[model] - pinned[model]
        need = sum(pinned) + missing - cap
        if need > 0:
            for victim in sorted((m for m in range(len(sizes)) if m != model and pinned[m] > 0),
                                 key=lambda m: _next_use(sequence, step, m), reverse=True):
                freed = min(pinned[victim], need)
                pinned[victim] -= freed
                need -= freed
                if need <= 0:
                    break
        pinned[model] = sizes[model]
        registered += missing
        history.append(registered)
    return history


def _next_use(sequence, step, model):
    for later in range(step + 1, len(sequence)):
        if sequence[later] == model:
            return later
    return len(sequence) + model  # never used again: evict first (ties broken by index, any order is optimal)


def configs(quick):
    """The (label, sizes, cap, cycle) of a run; ``cycle`` is the list of model indices repeated each cycle.

    Pure cycles over every N and k, plus one "hires" pattern per size mix (text encoder, then diffusion model and
    VAE twice, as in a hires-fix workflow), which is not a pure cycle.
    """
    counts = (3, 4) if quick else (3, 4, 5, 6)
    out = []
    for mix in ("equal", "big+small", "workflow"):
        for n in counts:
            sizes = mix_sizes(mix, n)
            for k in range(1, n):
                out.append(("N=%d,k=%d,mix=%s" % (n, k, mix), sizes, cap_for(sizes, k), list(range(n))))
        sizes = mix_sizes(mix, 3)
        out.append(("N=3,k=2,mix=%s,pattern=hires" % mix, sizes, cap_for(sizes, 2), [0, 1, 2, 1, 2]))
    return out


def run(quick=False):
    """Run the case and return its JSON records (see the module docstring)."""
    warmup, measured = (2, 4) if quick else (3, 12)
    records = []
    for label, sizes, cap, cycle in configs(quick):
        sequence = cycle * (warmup + measured)
        for policy in POLICIES:
            history = simulate(policy, sizes, cap, sequence)
            steady = history[-1] - history[warmup * len(cycle) - 1]
            base = {"case": "pins", "policy": policy, "config": label, "unit": "bytes"}
            records.append(dict(base, metric="bytes_registered_per_cycle", value=steady // measured))
            records.append(dict(base, metric="bytes_registered_total", value=history[-1],
                                cycles=warmup + measured))
    return records


def _table(records):
    per_cycle = [r for r in records if r["metric"] == "bytes_registered_per_cycle"]
    labels = list(dict.fromkeys(r["config"] for r in per_cycle))
    value = {(r["config"], r["policy"]): r["value"] for r in per_cycle}
    lines = ["GiB registered per cycle (steady state)",
             "%-38s" % "config" + "".join("%10s" % p for p in POLICIES) + "   mru/optimal"]
    for label in labels:
        row = [value[(label, p)] / GIB for p in POLICIES]
        ratio = value[(label, "mru")] / value[(label, "optimal")] if value[(label, "optimal")] else 1.0
        lines.append("%-38s" % label + "".join("%10.2f" % v for v in row) + "%14.3f" % ratio)
    return "\n".join(lines)


def main(argv=None):
    """Print the table (or the JSON records with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer configurations and cycles")
    parser.add_argument("--json", action="store_true", help="print JSON records, one per line")
    options = parser.parse_args(argv)
    records = run(quick=options.quick)
    if options.json:
        for record in records:
            print(json.dumps(record))
    else:
        print(_table(records))


if __name__ == "__main__":
    main()
