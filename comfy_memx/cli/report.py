"""``python -m comfy_memx report EVENTS.jsonl [--png timeline.png] [--json]``: what an event log says, per model
and per owning package.

For each model (``model_id`` within one process) and each custom-node package that loaded models: loads and bytes
loaded, unloads by reason and bytes freed, transfer rates (GB/s = bytes / seconds / 1e9 over all loads, and over
all unloads), leaks with the reference chains that held them, and pin evictions.  ``--png`` draws resident bytes
per model over time (matplotlib, an optional extra: ``pip install comfy_memx[plot]``).

A line that is not a JSON object with an ``event`` name, or whose fields have the wrong types, is counted and
skipped; events of kinds this report does not know are counted as ``other``.  Exit status: 0, 1 when the PNG
could not be written (the text report is printed anyway), 2 when the file cannot be read.
"""

import argparse
import json
import sys

from comfy_memx.core.units import format_bytes

PLOT_HINT = "pip install matplotlib  (or: pip install comfy_memx[plot])"


def _rate(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 and nbytes > 0 else None


class _Tally:
    """Counts shared by a model row and a package row."""

    def __init__(self):
        self.loads = 0
        self.load_bytes = 0
        self.load_seconds = 0.0
        self.unloads = {}
        self.unload_bytes = 0
        self.unload_seconds = 0.0
        self.leaks = {}
        self.pin_evictions = 0
        self.pin_evicted_bytes = 0

    def as_dict(self):
        return {"loads": self.loads, "load_bytes": self.load_bytes, "load_gb_per_s": _rate(self.load_bytes,
                                                                                           self.load_seconds),
                "unloads": dict(sorted(self.unloads.items())), "unload_bytes": self.unload_bytes,
                "unload_gb_per_s": _rate(self.unload_bytes, self.unload_seconds),
                "leaks": dict(sorted(self.leaks.items())), "pin_evictions": self.pin_evictions,
                "pin_evicted_bytes": self.pin_evicted_bytes}


class EventReport:
    """The aggregation of one event log; feed lines with :meth:`add_line`, read :meth:`as_dict`."""

    def __init__(self):
        self.lines = 0
        self.events = 0
        self.malformed = 0
        self.other = 0
        self.first_time = None
        self.last_time = None
        self.models = {}      # (pid, model_id) -> {"model", "package", "tally", "leaks": [...], "peak"}
        self.packages = {}    # package -> _Tally
        self.timeline = {}    # (pid, model_id) -> [(time, resident bytes)]
        self._resident = {}

    def add_line(self, line):
        """Aggregate one line of the log (malformed lines are counted, never raised)."""
        if not line.strip():
            return
        self.lines += 1
        try:
            event = json.loads(line)
            if not isinstance(event, dict) or not isinstance(event.get("event"), str):
                raise ValueError("not an event object")
            self._add(event)
        except (ValueError, TypeError, KeyError, AttributeError):
            self.malformed += 1
            return
        self.events += 1

    def _add(self, event):
        kind = event["event"]
        when = float(event["time"])
        pid = int(event.get("pid") or 0)
        handler = {"load": self._load, "unload": self._unload, "leak": self._leak,
                   "pin_evict": self._pin_evict}.get(kind)
        if handler is None:
            self.other += 1
        else:
            handler(event, pid, when)
        self.first_time = when if self.first_time is None else min(self.first_time, when)
        self.last_time = when if self.last_time is None else max(self.last_time, when)

    def _model(self, event, pid):
        model_id = event["model_id"]
        if not isinstance(model_id, str):
            raise TypeError("model_id")
        key = (pid, model_id)
        row = self.models.get(key)
        owner = event.get("owner")
        package = owner.get("package") if isinstance(owner, dict) else None
        if row is None:
            row = self.models[key] = {"model": str(event.get("model") or "?"), "package": package or "?",
                                      "owner": owner if isinstance(owner, dict) else None, "tally": _Tally(),
                                      "leak_reports": [], "peak_resident": 0}
        elif package and row["package"] == "?":
            row["package"] = package
        return key, row

    def _package(self, name):
        tally = self.packages.get(name)
        if tally is None:
            tally = self.packages[name] = _Tally()
        return tally

    def _load(self, event, pid, when):
        nbytes, seconds = _count(event.get("bytes")), _seconds(event.get("seconds"))
        resident = _count(event.get("loaded_bytes"))
        key, row = self._model(event, pid)
        for tally in (row["tally"], self._package(row["package"])):
            tally.loads += 1
            tally.load_bytes += nbytes
            tally.load_seconds += seconds
        self._set_resident(key, row, when, resident)

    def _unload(self, event, pid, when):
        nbytes, seconds = _count(event.get("bytes")), _seconds(event.get("seconds"))
        reason = str(event.get("reason") or "other")
        key, row = self._model(event, pid)
        for tally in (row["tally"], self._package(row["package"])):
            tally.unloads[reason] = tally.unloads.get(reason, 0) + 1
            tally.unload_bytes += nbytes
            tally.unload_seconds += seconds
        self._set_resident(key, row, when, max(0, self._resident.get(key, 0) - nbytes))

    def _leak(self, event, pid, when):
        stage = str(event.get("stage") or "?")
        referrers = event.get("referrers") or []
        if not isinstance(referrers, list):
            raise TypeError("referrers")
        chains = [{"path": str(r.get("path")), "package": r.get("package"), "root_kind": r.get("root_kind")}
                  for r in referrers if isinstance(r, dict)]
        _, row = self._model(event, pid)
        for tally in (row["tally"], self._package(row["package"])):
            tally.leaks[stage] = tally.leaks.get(stage, 0) + 1
        row["leak_reports"].append({"stage": stage, "time": when, "chains": chains})

    def _pin_evict(self, event, pid, when):
        nbytes = _count(event.get("bytes"))
        _, row = self._model(event, pid)
        for tally in (row["tally"], self._package(row["package"])):
            tally.pin_evictions += 1
            tally.pin_evicted_bytes += nbytes

    def _set_resident(self, key, row, when, resident):
        self._resident[key] = resident
        row["peak_resident"] = max(row["peak_resident"], resident)
        self.timeline.setdefault(key, []).append((when, resident))

    def as_dict(self):
        """The report as JSON-ready builtins."""
        pids = {pid for pid, _ in self.models}
        models = []
        for (pid, model_id), row in sorted(self.models.items()):
            models.append({"model_id": model_id, "pid": pid, "model": row["model"], "package": row["package"],
                           "owner": row["owner"], "peak_resident_bytes": row["peak_resident"],
                           **row["tally"].as_dict(), "leak_reports": row["leak_reports"]})
        packages = [{"package": name, **tally.as_dict()} for name, tally in sorted(self.packages.items())]
        span = (self.last_time - self.first_time) if self.first_time is not None else 0.0
        return {"lines": self.lines, "events": self.events, "malformed_lines": self.malformed,
                "other_events": self.other, "processes": len(pids), "seconds": round(span, 3),
                "models": models, "packages": packages}


def _count(value):
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("a byte count must be a number")
    return max(0, int(value))


def _seconds(value):
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError("seconds must be a number")
    return max(0.0, float(value))


def read_events(path):
    """Aggregate the event log at ``path`` (raises OSError when it cannot be read)."""
    report = EventReport()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            report.add_line(line)
    return report


def format_text(report, path):
    """The human-readable report."""
    data = report.as_dict()
    several = data["processes"] > 1
    head = (f"comfy_memx report of {path}: {data['events']} events over {data['seconds']:.1f} s"
            f", {data['processes']} process(es)")
    if data["malformed_lines"]:
        head += f"; {data['malformed_lines']} malformed line(s) skipped"
    lines = [head, "", "per model"]
    for row in data["models"]:
        name = f"{row['model_id']}" + (f" (pid {row['pid']})" if several else "")
        lines.append(f"  {name}  {row['model']}  package {row['package']}  peak resident "
                     f"{format_bytes(row['peak_resident_bytes'])}")
        lines.append("    " + _tally_text(row))
        for leak in row["leak_reports"]:
            lines.append(f"    leak ({leak['stage']})" + ("" if leak["chains"] else ": no chains recorded"))
            for chain in leak["chains"]:
                lines.append(f"      held by {chain['path']}  [package {chain['package']}, {chain['root_kind']}]")
    if not data["models"]:
        lines.append("  (no model events)")
    lines += ["", "per package"]
    for row in data["packages"]:
        lines.append(f"  {row['package']}")
        lines.append("    " + _tally_text(row))
    if not data["packages"]:
        lines.append("  (no model events)")
    return "\n".join(lines)


def _tally_text(row):
    unloads = ", ".join(f"{reason} {count}" for reason, count in row["unloads"].items()) or "none"
    leaks = ", ".join(f"{stage} {count}" for stage, count in row["leaks"].items()) or "none"
    return (f"loads {row['loads']} ({format_bytes(row['load_bytes'])}, {_gbps(row['load_gb_per_s'])}); "
            f"unloads {unloads} ({format_bytes(row['unload_bytes'])}, {_gbps(row['unload_gb_per_s'])}); "
            f"leaks {leaks}; pin evictions {row['pin_evictions']} ({format_bytes(row['pin_evicted_bytes'])})")


def _gbps(rate):
    return "- GB/s" if rate is None else f"{rate:.3f} GB/s"


def write_timeline(report, png_path):
    """Draw resident bytes per model over time into ``png_path``; raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(10, 4.5))
    start = report.first_time or 0.0
    several = len({pid for pid, _ in report.timeline}) > 1
    for (pid, model_id), points in sorted(report.timeline.items()):
        times = [when - start for when, _ in points]
        mib = [resident / 2 ** 20 for _, resident in points]
        label = f"{model_id} (pid {pid})" if several else model_id
        axes.step(times, mib, where="post", label=label)
    axes.set_xlabel("seconds since the first event")
    axes.set_ylabel("resident MiB")
    axes.set_title("comfy_memx: resident bytes per model")
    if report.timeline:
        axes.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)


def main(argv):
    """Entry point of ``python -m comfy_memx report``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m comfy_memx report", description=__doc__.splitlines()[0])
    parser.add_argument("events", metavar="EVENTS.jsonl", help="an event log written with COMFY_MEMX_EVENTS")
    parser.add_argument("--png", metavar="timeline.png", help="also draw resident bytes per model over time")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    try:
        report = read_events(args.events)
    except OSError as exc:
        print(f"comfy_memx report: cannot read {args.events}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=2) if args.json else format_text(report, args.events))
    if args.png is None:
        return 0
    try:
        write_timeline(report, args.png)
    except ImportError:
        print(f"comfy_memx report: --png needs matplotlib; {PLOT_HINT}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"comfy_memx report: cannot write {args.png}: {exc}", file=sys.stderr)
        return 1
    print(f"timeline written to {args.png}", file=sys.stderr)
    return 0
