"""Shared pieces of the benchmark cases: interleaved timing, statistics, records, test checkpoints, page cache, output.

Records are plain dicts: ``case``, ``metric``, ``value``, ``unit``, and where they apply ``min``/``max`` (over the
rounds), ``floor`` (the same-run physical limit the value is compared with) and ``ratio`` (value against that floor,
the median of per-round ratios), plus free-form labels.  Only ratios taken inside one run are meaningful on a shared
machine; absolute GB/s move 2-5x between runs (performance-anchors.md).

Records made from per-round timings keep them, unrounded, in ``per_round`` (seconds of each round, by variant), so
that every figure can be recomputed from them.  A record with a target has ``target_min`` (the figure must be at
least that) or ``target_max`` (at most that) and ``met``: true, false, or null when the measurement cannot tell
(an added cost below the resolution, with an upper bound above the target).  The figure a target applies to is
``ratio`` when the record has one, else ``value`` (else ``upper_bound``).

Added costs (``unit`` us) are never a bare difference of two noisy timings: see :func:`difference_record`.

torch and safetensors are imported inside the functions that need them.
"""

import contextlib
import gc
import json
import math
import os
import shutil
import statistics
import struct
import tempfile
import time

from comfy_memx.cli import demo_world

MIB = 1024 ** 2
GIB = 1024 ** 3
TENSORS = 1250
FULL_BYTES = 2 * GIB
QUICK_BYTES = 256 * MIB
TINY_BYTES = 2 * MIB
READ_CHUNK = 64 * MIB
HERE = os.path.dirname(os.path.abspath(__file__))
# The ComfyUI 0.27.0 stand-in that ships in comfy_memx (the demo's world, and the tests' 0.27.0 shape), imported by
# the in-process cases with this folder first on sys.path, as a ComfyUI root.
STAND_IN_0270 = os.path.dirname(os.path.abspath(demo_world.__file__))
RESULTS_DIR = os.path.join(HERE, "results")


def write_stand_in_tree(dest):
    """Copy the 0.27.0 stand-in into the new folder ``dest`` as a ComfyUI root and return the path of its main.py.

    A server started from the copy writes its caches there, not into the installed comfy_memx; the demo's packs
    and the folder's package marker stay behind, and ``custom_nodes/`` is created empty.
    """
    shutil.copytree(STAND_IN_0270, dest, ignore=shutil.ignore_patterns("__pycache__", "packs", "custom_nodes"))
    os.remove(os.path.join(dest, "__init__.py"))
    os.makedirs(os.path.join(dest, "custom_nodes"))
    return os.path.join(dest, "main.py")


def checkpoint_bytes(quick=False, tiny=False):
    """Size of the generated test checkpoint: 2 GiB, 256 MiB with ``quick``, 2 MiB with ``tiny`` (smoke tests)."""
    return TINY_BYTES if tiny else QUICK_BYTES if quick else FULL_BYTES


def rounds_for(quick, tiny, full, quick_rounds, tiny_rounds=2):
    """How many interleaved rounds a measurement gets in each mode."""
    return tiny_rounds if tiny else quick_rounds if quick else full


# -- timing -------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def gc_paused():
    """Keep the cyclic garbage collector from running inside timed regions."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def timed(call):
    """Seconds one ``call()`` takes."""
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def interleaved(variants, rounds, warmup=1):
    """Time each variant once per round, rotating the order every round (A B C, B C A, ...); returns name -> [s].

    ``variants`` maps a name to ``call`` or to ``(call, prepare)``; ``prepare()`` runs untimed right before its
    variant (e.g. dropping the page cache).  ``warmup`` untimed rounds go first.
    """
    names = list(variants)
    steps = {name: v if isinstance(v, tuple) else (v, None) for name, v in variants.items()}
    times = {name: [] for name in names}
    with gc_paused():
        for index in range(warmup + rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                call, prepare = steps[name]
                if prepare is not None:
                    prepare()
                seconds = timed(call)
                if index >= warmup:
                    times[name].append(seconds)
    return times


def spread(values):
    """(median, min, max) of a list of numbers."""
    return statistics.median(values), min(values), max(values)


def _round(value, digits=4):
    if value is None or isinstance(value, int) or not math.isfinite(value):
        return value
    return round(value, digits) if abs(value) >= 1 else float(f"{value:.{digits}g}")


def record(case, metric, value, unit, **labels):
    """One benchmark record (values rounded to 4 significant digits or 4 decimals); judged when it has a target."""
    out = {"case": case, "metric": metric, "value": _round(value), "unit": unit}
    for key, label in labels.items():
        out[key] = _round(label) if isinstance(label, float) else label
    return judge(out)


def judged_figure(r):
    """The figure a record's target applies to: ``ratio`` if present, else ``value``, else ``upper_bound``."""
    for key in ("ratio", "value", "upper_bound"):
        if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool):
            return key, r[key]
    return None, None


def judge(r):
    """Set ``met`` on a record with ``target_min`` or ``target_max`` (see the module docstring); returns it.

    An upper bound (an added cost below the resolution) meets a ``target_max`` it does not exceed; above it, the
    measurement cannot tell and ``met`` is None.  Records without a figure (skipped, error) are not judged.
    """
    low, high = r.get("target_min"), r.get("target_max")
    if low is None and high is None:
        return r
    key, figure = judged_figure(r)
    if key is None:
        r.pop("met", None)
        return r
    if key == "upper_bound":
        r["met"] = True if (low is None and figure <= high) else None
    else:
        r["met"] = (low is None or figure >= low) and (high is None or figure <= high)
    return r


def target_text(r):
    """``">= 0.6"`` / ``"<= 1.02"`` for a record with a target, else ``""``."""
    parts = []
    if r.get("target_min") is not None:
        parts.append(f">= {_fmt(r['target_min'])}")
    if r.get("target_max") is not None:
        parts.append(f"<= {_fmt(r['target_max'])}")
    return " and ".join(parts)


def rate_record(case, metric, nbytes, seconds, floor_seconds=None, floor_bytes=None, **labels):
    """GB/s of moving ``nbytes`` per round (median, min, max), next to the floor's GB/s and the per-round ratio.

    ``seconds`` and ``floor_seconds`` are per-round timings from :func:`interleaved` (same length, same rounds);
    ``ratio`` is the median over rounds of (this GB/s) / (floor GB/s) in that round.
    """
    rates = [nbytes / s / 1e9 for s in seconds]
    median, low, high = spread(rates)
    extra = {"min": low, "max": high, "rounds": len(seconds), "bytes": nbytes}
    per_round = {"seconds": list(seconds)}
    if floor_seconds:
        floor_nbytes = nbytes if floor_bytes is None else floor_bytes
        floor_rates = [floor_nbytes / s / 1e9 for s in floor_seconds]
        extra["floor"] = statistics.median(floor_rates)
        extra["ratio"] = statistics.median(rate / floor for rate, floor in zip(rates, floor_rates))
        extra["floor_bytes"] = floor_nbytes
        per_round["floor_seconds"] = list(floor_seconds)
    return record(case, metric, median, "GB/s", **extra, **labels, per_round=per_round)


def seconds_record(case, metric, seconds, **labels):
    """Median, min and max of per-round timings in seconds."""
    median, low, high = spread(seconds)
    return record(case, metric, median, "s", min=low, max=high, rounds=len(seconds), **labels,
                  per_round={"seconds": list(seconds)})


def ratio_record(case, metric, numerators, denominators, **labels):
    """Median, min and max of per-round ``numerator / denominator`` (e.g. patched / unpatched seconds)."""
    ratios = [a / b for a, b in zip(numerators, denominators)]
    median, low, high = spread(ratios)
    return record(case, metric, median, "ratio", min=low, max=high, ratio=median, pairs=len(ratios), **labels,
                  per_round={"numerator": list(numerators), "denominator": list(denominators)})


def difference_record(case, metric, treated, control, control_again, per=1, scale=1e6, unit="us", **labels):
    """The added cost of ``treated`` over ``control``, per call, from the same interleaved rounds; never negative.

    ``treated``, ``control`` and ``control_again`` are per-round seconds of ``per`` calls each; ``control_again``
    times the control a second time in the same round (an A/A pair: the same code measured twice).  The estimate
    is the median over rounds of ``(treated - control) / per``; the ``resolution`` is the median over the same
    rounds of ``|control_again - control| / per``: the gap that two timings of identical code typically show in
    this run, so a smaller difference cannot be told from noise (the median, like the estimate, so that one
    preempted round moves neither).  Only an estimate above the resolution is a ``value``; otherwise the record has
    ``value`` None, ``below_resolution`` True and ``upper_bound`` = max(estimate, 0) + resolution, and the table
    prints ``< upper_bound``.  So a difference of two noisy timings never shows as a negative cost.  Seconds are
    multiplied by ``scale`` (default: microseconds).
    """
    differences = [(t - c) / per * scale for t, c in zip(treated, control)]
    resolution = statistics.median(abs(a - c) / per * scale for a, c in zip(control_again, control))
    estimate = statistics.median(differences)
    per_round = {"treated": list(treated), "control": list(control), "control_again": list(control_again)}
    shared = dict(rounds=len(differences), calls=per, resolution=resolution, **labels, per_round=per_round)
    if estimate > resolution:
        return record(case, metric, estimate, unit, **shared)
    return record(case, metric, None, unit, below_resolution=True, upper_bound=max(estimate, 0.0) + resolution,
                  **shared)


def skipped_record(case, reason, **labels):
    """A record saying why a case (or a part of it) was not measured."""
    return record(case, "skipped", None, None, reason=reason, **labels)


def load_average():
    """The 1-minute load average (the machine is shared: report it next to every figure), or None."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


# -- test checkpoints ---------------------------------------------------------------------------------------------

# One block of a UNet-like diffusion model at width c: (name, shape in units of c).
_BLOCK = (("norm1.weight", ("c",)), ("norm1.bias", ("c",)), ("conv1.weight", ("c", "c", 3, 3)),
          ("conv1.bias", ("c",)), ("norm2.weight", ("c",)), ("norm2.bias", ("c",)),
          ("attn.to_q.weight", ("c", "c")), ("attn.to_k.weight", ("c", "c")), ("attn.to_v.weight", ("c", "c")),
          ("attn.to_out.weight", ("c", "c")), ("attn.to_out.bias", ("c",)), ("ff.proj_in.weight", ("4c", "c")),
          ("ff.proj_in.bias", ("4c",)), ("ff.proj_out.weight", ("c", "4c")), ("ff.proj_out.bias", ("c",)),
          ("conv2.weight", ("c", "c", 3, 3)))
_WIDTH_MULTIPLIERS = (1, 2, 4)
BF16_EVERY = 7   # about 15 % of the tensors are bf16, the rest fp16


def checkpoint_layout(total_bytes, tensors=TENSORS):
    """[(name, shape, dtype name)] of a diffusion-model-like checkpoint: ``tensors`` tensors, about ``total_bytes``.

    Blocks of convolutions, attention projections, feed-forward layers, norms and biases at three widths
    (w, 2w, 4w); the base width w is the largest that keeps the total at or below ``total_bytes`` (at least 1).
    """
    def layout(width):
        out = []
        for index in range(tensors):
            block, slot = divmod(index, len(_BLOCK))
            c = width * _WIDTH_MULTIPLIERS[block % len(_WIDTH_MULTIPLIERS)]
            name, dims = _BLOCK[slot]
            shape = tuple(c if d == "c" else 4 * c if d == "4c" else d for d in dims)
            dtype = "BF16" if index % BF16_EVERY == 3 else "F16"
            out.append((f"diffusion_model.blocks.{block}.{name}", shape, dtype))
        return out

    def size(width):
        return sum(2 * math.prod(shape) for _, shape, _ in layout(width))

    low, high = 1, 2
    while size(high) <= total_bytes:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if size(middle) <= total_bytes else (low, middle)
    return layout(low)


def write_checkpoint(path, layout, metadata=None):
    """Write a safetensors file of ``layout`` (a :func:`checkpoint_layout`) tensor by tensor; returns its size.

    The data is uniform fp16 noise, cut from one 32 MiB pool so that writing is bound by the disk, not by the random
    generator (never zeros: nothing sparse or trivially compressible).  The file is fsynced so that its pages can be
    dropped from the page cache for cold reads.
    """
    import torch
    header, offset = {}, 0
    for name, shape, dtype in layout:
        nbytes = 2 * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = dict(metadata or {"format": "pt", "generator": "comfy_memx bench"})
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-(8 + len(encoded)) % 8)
    pool = torch.empty(16 * MIB, dtype=torch.float16).uniform_(-1, 1, generator=torch.Generator().manual_seed(0))
    pool = memoryview(pool.view(torch.uint8).numpy())
    position = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name, shape, dtype in layout:
            left = 2 * math.prod(shape)
            while left:
                piece = min(left, len(pool) - position)
                f.write(pool[position:position + piece])
                position = (position + piece) % len(pool)
                left -= piece
        f.flush()
        os.fsync(f.fileno())
    return os.path.getsize(path)


class Workspace:
    """A temporary folder for generated checkpoints (reused across cases of one run, removed at the end)."""

    def __init__(self, parent=None):
        self.path = tempfile.mkdtemp(prefix="comfy_memx_bench_", dir=parent)
        self._checkpoints = {}

    def checkpoint(self, total_bytes, tensors=TENSORS, name=None):
        """Path of a generated checkpoint of about ``total_bytes`` in ``tensors`` tensors (generated once)."""
        key = (total_bytes, tensors)
        if key not in self._checkpoints:
            layout = checkpoint_layout(total_bytes, tensors)
            path = os.path.join(self.path, name or f"bench_{tensors}t_{total_bytes // MIB or 1}MiB.safetensors")
            write_checkpoint(path, layout)
            self._checkpoints[key] = (path, layout)
        return self._checkpoints[key]

    def file(self, name):
        """A path inside the workspace."""
        return os.path.join(self.path, name)

    def close(self):
        """Delete the folder and everything generated in it."""
        shutil.rmtree(self.path, ignore_errors=True)
        self._checkpoints.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@contextlib.contextmanager
def workspace_for(workspace):
    """Use ``workspace`` if given, else a temporary one removed on exit (for running a case module on its own)."""
    if workspace is not None:
        yield workspace
        return
    with Workspace() as own:
        yield own


def drop_page_cache(path):
    """Ask the kernel to drop ``path``'s cached pages (POSIX_FADV_DONTNEED) so the next read comes from disk.

    Works for clean pages of files nobody maps; the checkpoint is fsynced when written.  Returns False where the
    call is unavailable (then "cold" figures are warm ones).
    """
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True


def sequential_read(path, chunk=READ_CHUNK):
    """Read the whole file with ``readinto`` into one reused buffer (the raw read floor); returns bytes read."""
    buffer = bytearray(min(chunk, max(1, os.path.getsize(path))))
    view = memoryview(buffer)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(view)
            if not n:
                return total
            total += n


# -- output -------------------------------------------------------------------------------------------------------

_COLUMNS = ("case", "metric", "value", "unit", "min", "max", "floor", "ratio", "target_min", "target_max", "met",
            "upper_bound", "below_resolution", "per_round")
# Kept in the JSON, left out of the table to keep it readable.
_QUIET_LABELS = ("bytes", "rounds", "loadavg_1m", "case_seconds", "floor_is", "note", "file_bytes", "tensors",
                 "events", "event_bytes", "command", "calls", "wrapped_calls_per_cycle", "cycles", "scans",
                 "objects_visited", "floor_bytes", "ok")
_QUIET_METRICS = ("bytes_registered_total",)
MISSED = "MISSED"


def verdict(r):
    """``"met"``, ``"MISSED"`` or ``"unresolved"`` for a judged record, else ``""``."""
    if "met" not in r:
        return ""
    return {True: "met", False: MISSED, None: "unresolved"}[r["met"]]


def _describe(r):
    where = ", ".join(f"{r[k]}" for k in ("path", "site", "config", "memory") if k in r)
    return f"{r['case']} {r['metric']}" + (f" [{where}]" if where else "")


def missed_targets(records):
    """One line per record that missed its target (its figure next to the target), for the table's footer."""
    lines = []
    for r in records:
        if r.get("met") is False:
            key, figure = judged_figure(r)
            lines.append(f"{MISSED}: {_describe(r)}: {key} {_fmt(figure)}, target {target_text(r)}")
    return lines


def format_table(records):
    """A plain-text table of the records, one block per case headed by its duration and load average.

    Records with a target show it and the verdict (``met``, ``MISSED``, ``unresolved``) in the ``target`` column;
    a footer lists every missed target.  An added cost below the resolution shows as ``< upper bound``.
    """
    lines = []
    for case in dict.fromkeys(r["case"] for r in records):
        rows = [r for r in records if r["case"] == case and r["metric"] not in _QUIET_METRICS]
        first = rows[0] if rows else {}
        lines.append(f"== {case}" + (f"  ({first['case_seconds']} s, load average {first.get('loadavg_1m')})"
                                     if "case_seconds" in first else ""))
        cells = [("metric", "value", "min..max", "unit", "floor", "ratio", "target", "labels")]
        for r in rows:
            value, low, high, unit = r["value"], r.get("min"), r.get("max"), r.get("unit") or ""
            if unit == "bytes" and isinstance(value, int):
                value, unit = value / GIB, "GiB"
            shown = f"< {_fmt(r['upper_bound'])}" if r.get("below_resolution") else _fmt(value)
            labels = ", ".join(f"{k}={v}" for k, v in r.items() if k not in _COLUMNS and k not in _QUIET_LABELS)
            if r.get("below_resolution"):
                labels = "below resolution" + (", " + labels if labels else "")
            target = f"{target_text(r)} {verdict(r)}".strip() if target_text(r) else ""
            cells.append((r["metric"], shown, f"{_fmt(low)}..{_fmt(high)}" if "min" in r else "", unit,
                          _fmt(r.get("floor")), _fmt(r.get("ratio")), target, labels))
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1] for row in cells]
    judged = [r for r in records if "met" in r]
    missed = missed_targets(records)
    if judged:
        lines.append(f"== targets: {len(judged)} judged, {sum(r['met'] is True for r in judged)} met, "
                     f"{len(missed)} {MISSED}, {sum(r['met'] is None for r in judged)} unresolved")
        lines += ["  " + line for line in missed]
    return "\n".join(lines)


def _fmt(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write_json(records, path):
    """Write the records as one JSON list (creating the folder)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(records, f, indent=1)
        f.write("\n")


def _chart_value(r):
    if isinstance(r.get("ratio"), (int, float)):
        return r["ratio"]
    if r.get("unit") == "ratio" and isinstance(r.get("value"), (int, float)):
        return r["value"]
    return None


def write_chart(records, path):
    """A PNG bar chart of every ratio (against a same-run floor, or patched/unpatched); False without matplotlib.

    Targets are black ticks; bars of records that missed their target are red and say so in their label.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in records if _chart_value(r) is not None]
    if not rows:
        return False
    labels = [f"{r['case']}: {r['metric']}" + (f" ({r['path']})" if "path" in r else "")
              + (f" [{r['config']}]" if "config" in r else "")
              + (f"  target {target_text(r)}: {verdict(r)}" if "met" in r else "") for r in rows]
    figure, axes = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.2))
    axes.barh(range(len(rows)), [_chart_value(r) for r in rows],
              color=["tab:red" if r.get("met") is False else "tab:blue" for r in rows])
    for index, r in enumerate(rows):
        if "min" in r and r.get("unit") == "ratio":
            axes.plot([r["min"], r["max"]], [index, index], color="black", linewidth=1)
        for key in ("target_min", "target_max"):
            if r.get(key) is not None:
                axes.plot([r[key]], [index], marker="|", markersize=16, markeredgewidth=2, color="black")
    axes.axvline(1.0, color="grey", linewidth=0.8)
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels(labels, fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("ratio (against the same-run floor, or patched/unpatched)")
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)
    return True
