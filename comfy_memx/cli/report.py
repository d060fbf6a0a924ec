"""``python -m comfy_memx report EVENTS.jsonl [--png timeline.png] [--json]``: what an event log says, per model
and per owning package.

For each model (``model_id`` within one process) and each custom-node package that loaded models: loads and bytes
loaded, unloads by reason and bytes freed, transfer rates (GB/s = bytes / seconds / 1e9 over the loads, and over
the unloads, that copied bytes: an event with ``copied: false``, as under ``--cpu``, only changed ComfyUI's
accounting and has no rate), leaks with the reference chains that held them, releases (``release`` events that cut
a pack's cache entry: a model whose release freed it is reported as released, no longer as leaked, and each holding
package's bytes given back are summed), and pin evictions.  ``--png`` draws resident bytes per model over time, one
lane per model (a model stays drawn as resident until an unload says otherwise, so one load is a band to the end of
the log; a released model's lane ends at its release), with loads, unloads, leaks and releases marked (matplotlib, an
optional extra: ``python -m pip install matplotlib``).

A line that is not a JSON object with an ``event`` name, or whose fields have the wrong types, is counted and
skipped; events of kinds this report does not know are counted as ``other``.  Exit status: 0, 1 when the PNG
could not be written or its path is refused (a link, another user's file: ``core.private``; the text report is
printed anyway), 2 when the file cannot be read.
"""

import argparse
import json
import math
import os
import sys
import types

from comfy_memx.core.private import Refused
from comfy_memx.core.units import format_bytes

PLOT_HINT = "install matplotlib into this Python environment: python -m pip install matplotlib"
CUT = ("released", "survivor")   # release outcomes after which a pack's cache entry was cut


def _holder_package(event, referrers):
    """The package that holds a leaked model: the event's ``holder_package``, else its first chain's (older logs)."""
    holder = event.get("holder_package")
    if isinstance(holder, str) and holder:
        return holder
    for referrer in referrers:
        if isinstance(referrer, dict):
            package = referrer.get("holder_package") or referrer.get("package")
            if isinstance(package, str) and package not in ("?", ""):
                return package
    return None


def _rate(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 3) if seconds > 0 and nbytes > 0 else None


class _Tally:
    """Counts shared by a model row and a package row."""

    def __init__(self):
        self.loads = 0
        self.load_bytes = 0
        self.load_copied = [0, 0.0]     # bytes and seconds of the loads that copied bytes (their rate)
        self.unloads = {}
        self.unload_bytes = 0
        self.unload_copied = [0, 0.0]
        self.leaks = {}          # leaked models this package holds, by stage (the holder's package, not the loader's)
        self.leaked_loads = {}   # models this package loaded that then leaked, by stage (held by whoever holds them)
        self.pin_evictions = 0
        self.pin_evicted_bytes = 0
        self.releases = 0        # cache entries cut: of this package's holds (a package), of this model (a model)
        self.released_models = 0  # models those cuts freed
        self.released_bytes = 0   # the bytes they gave back

    def as_dict(self):
        return {"loads": self.loads, "load_bytes": self.load_bytes, "load_gb_per_s": _rate(*self.load_copied),
                "unloads": dict(sorted(self.unloads.items())), "unload_bytes": self.unload_bytes,
                "unload_gb_per_s": _rate(*self.unload_copied),
                "leaks": dict(sorted(self.leaks.items())), "leaked_loads": dict(sorted(self.leaked_loads.items())),
                "releases": self.releases, "released_models": self.released_models,
                "released_bytes": self.released_bytes,
                "pin_evictions": self.pin_evictions,
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
        self.marks = {}       # (pid, model_id) -> [(time, "load" | "unload" | "leak", detail)]
        self.reloads = {}     # (cause, model class) -> {"reloads", "seconds", "bytes"}
        self.thrash = 0
        self.leak_patterns = {}  # (package of the root, pattern) -> {"chains", "models", "suggestion"}
        self.releases = []    # one dict per release that cut an entry, in the log's order
        self.release_tries = {}  # outcome -> count of releases that cut nothing (refused, in use, changed, ...)
        self._resident = {}

    def add_line(self, line):
        """Aggregate one line of the log (malformed lines are counted, never raised)."""
        if not line.strip():
            return
        self.lines += 1
        try:
            event = parse_line(line)
            if not isinstance(event, dict) or not isinstance(event.get("event"), str):
                raise ValueError("not an event object")
            self._add(event)
        except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, RecursionError):
            self.malformed += 1
            return
        self.events += 1

    def _add(self, event):
        kind = event["event"]
        when = _seconds(event["time"])
        pid = _count(event.get("pid"))
        handler = {"created": self._created, "load": self._load, "unload": self._unload, "leak": self._leak,
                   "leak_seen": self._leak_seen, "release": self._release, "pin_evict": self._pin_evict,
                   "thrash": self._thrash}.get(kind)
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

    def _created(self, event, pid, when):
        """A model ComfyUI built: who built it (a pack's loader node, say), which may not be who loads it."""
        _, row = self._model(event, pid)
        by = event.get("created_by")
        if isinstance(by, dict):
            row["created_by"] = {key: by.get(key) for key in ("prompt_id", "node_id", "class_type", "package")}

    def _package(self, name):
        tally = self.packages.get(name)
        if tally is None:
            tally = self.packages[name] = _Tally()
        return tally

    def _load(self, event, pid, when):
        nbytes, seconds = _count(event.get("bytes")), _seconds(event.get("seconds"))
        resident = _count(event.get("loaded_bytes"))
        reload = event.get("reload")
        if reload is not None and not isinstance(reload, dict):
            raise TypeError("reload")
        reloaded = (_seconds(reload.get("seconds")), _count(reload.get("bytes"))) if reload is not None else None
        key, row = self._model(event, pid)
        copied = event.get("copied") is not False
        for tally in (row["tally"], self._package(row["package"])):
            tally.loads += 1
            tally.load_bytes += nbytes
            if copied:
                tally.load_copied[0] += nbytes
                tally.load_copied[1] += seconds
        self._set_resident(key, row, when, resident)
        self.marks.setdefault(key, []).append((when, "load", format_bytes(nbytes)))
        if reloaded is not None:   # checked before anything was counted: a bad line counts nothing
            tally = self.reloads.setdefault((str(reload.get("cause") or "?"), row["model"]),
                                            {"reloads": 0, "seconds": 0.0, "bytes": 0})
            tally["reloads"] += 1
            tally["seconds"] += reloaded[0]
            tally["bytes"] += reloaded[1]

    def _unload(self, event, pid, when):
        nbytes, seconds = _count(event.get("bytes")), _seconds(event.get("seconds"))
        reason = str(event.get("reason") or "other")
        key, row = self._model(event, pid)
        copied = event.get("copied") is not False
        for tally in (row["tally"], self._package(row["package"])):
            tally.unloads[reason] = tally.unloads.get(reason, 0) + 1
            tally.unload_bytes += nbytes
            if copied:
                tally.unload_copied[0] += nbytes
                tally.unload_copied[1] += seconds
        self._set_resident(key, row, when, max(0, self._resident.get(key, 0) - nbytes))
        self.marks.setdefault(key, []).append((when, "unload", reason))

    def _leak(self, event, pid, when):
        stage = str(event.get("stage") or "?")
        referrers = event.get("referrers") or []
        if not isinstance(referrers, list):
            raise TypeError("referrers")
        chains = [_leak_chain(r) for r in referrers if isinstance(r, dict)]
        key, row = self._model(event, pid)
        holder = _holder_package(event, referrers)
        if holder is not None:
            row["holder_package"] = holder
        self._count_leak(event, key, row, stage, holder, when)
        for chain in chains:
            if "pattern" in chain:
                self._group_pattern(chain, key)
        row["leak_reports"].append({"stage": stage, "time": when, "chains": chains,
                                    "reason": str(event.get("reason") or "new")})

    def _count_leak(self, event, key, row, stage, holder, when):
        """Count a new leak for the model, its loader and (rooted) its holder; a later search only names the holder."""
        if event.get("reason", "new") == "new":   # a later search of a known leak is not a new leak
            row["tally"].leaks[stage] = row["tally"].leaks.get(stage, 0) + 1
            loader = self._package(row["package"])
            loader.leaked_loads[stage] = loader.leaked_loads.get(stage, 0) + 1
            if stage == "rooted" and holder is not None:
                held = self._package(holder)
                held.leaks[stage] = held.leaks.get(stage, 0) + 1
            self.marks.setdefault(key, []).append((when, "leak", stage))
        elif stage == "rooted" and holder is not None and row.get("counted_holder") is None:
            held = self._package(holder)      # a deferred search named the holder later
            held.leaks[stage] = held.leaks.get(stage, 0) + 1
        if stage == "rooted" and holder is not None:
            row["counted_holder"] = holder

    def _group_pattern(self, chain, key):
        """Add one classified chain to its (holding package, pattern) group."""
        group = self.leak_patterns.setdefault((str(chain.get("holder_package") or chain["package"] or "?"),
                                               chain["pattern"]),
                                              {"chains": 0, "models": set(), "suggestion": chain["suggestion"]})
        group["chains"] += 1
        group["models"].add(key)

    def _leak_seen(self, event, pid, when):
        _, row = self._model(event, pid)
        row["sightings"] = max(row.get("sightings", 1), _count(event.get("sightings")))

    def _release(self, event, pid, when):
        """A ``release`` event: an entry that was cut is counted for each model it held (a model it freed is released,
        its resident bytes 0) and for the holding package (the bytes given back); a release that cut nothing is
        counted by its outcome only."""
        outcome = str(event.get("outcome") or "?")
        if outcome not in CUT:
            self.release_tries[outcome] = self.release_tries.get(outcome, 0) + 1
            return
        models = _released_models(event)
        given = event.get("released_bytes")
        freed = (_count(given) if given is not None
                 else sum(model["bytes"] for model in models if model["died"]))
        holder = str(event.get("package") or "?")
        release = {"time": when, "pid": pid, "trigger": str(event.get("trigger") or "?"), "outcome": outcome,
                   "package": holder, "cut": str(event.get("cut") or event.get("path") or "?"),
                   "models": [model["model_id"] for model in models],
                   "died": [model["model_id"] for model in models if model["died"]], "released_bytes": freed}
        for model in models:
            key, row = self._model({"model_id": model["model_id"], "model": model["model"]}, pid)
            row["tally"].releases += 1
            row.setdefault("releases", []).append(release)
            if model["died"]:
                row["released"] = True
                row["tally"].released_models += 1
                row["tally"].released_bytes += model["bytes"]
                self._set_resident(key, row, when, 0)
            self.marks.setdefault(key, []).append((when, "release", release["trigger"]))
        package = self._package(holder)
        package.releases += 1
        package.released_models += len(release["died"])
        package.released_bytes += freed
        self.releases.append(release)

    def _thrash(self, event, pid, when):
        self._model(event, pid)
        self.thrash += 1

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
                           "owner": row["owner"], "created_by": row.get("created_by"),
                           "peak_resident_bytes": row["peak_resident"],
                           **row["tally"].as_dict(), "leak_reports": row["leak_reports"],
                           "holder_package": row.get("holder_package"),
                           "leak_sightings": row.get("sightings", 0), "status": _status(row),
                           "release_log": row.get("releases", [])})
        packages = [{"package": name, **tally.as_dict()} for name, tally in sorted(self.packages.items())]
        span = (self.last_time - self.first_time) if self.first_time is not None else 0.0
        reloads = [{"cause": cause, "model": model, "reloads": tally["reloads"],
                    "seconds": round(tally["seconds"], 3), "bytes": tally["bytes"]}
                   for (cause, model), tally in sorted(self.reloads.items(), key=lambda item: -item[1]["seconds"])]
        patterns = [{"package": package, "pattern": pattern, "models": len(group["models"]),
                     "chains": group["chains"], "suggestion": group["suggestion"]}
                    for (package, pattern), group in sorted(self.leak_patterns.items())]
        released = [{"package": row["package"], "releases": row["releases"], "models": row["released_models"],
                     "released_bytes": row["released_bytes"]} for row in packages if row["releases"]]
        return {"lines": self.lines, "events": self.events, "malformed_lines": self.malformed,
                "other_events": self.other, "processes": len(pids), "seconds": round(span, 3),
                "models": models, "packages": packages, "reload_causes": reloads, "thrash_warnings": self.thrash,
                "leak_patterns": patterns, "releases": self.releases,
                "released_bytes": sum(release["released_bytes"] for release in self.releases),
                "released_by_package": released, "release_tries_not_cut": dict(sorted(self.release_tries.items()))}


def _released_models(event):
    """``[{model_id, model, bytes, died}]`` of the models a ``release`` event's cut entry held: its ``models``, else
    its one model."""
    models = event.get("models")
    if not isinstance(models, list) or not models:
        models = [{"model_id": event["model_id"], "model": event.get("model"), "bytes": event.get("bytes"),
                   "died": event.get("died")}]
    found = []
    for model in models:
        if not isinstance(model, dict) or not isinstance(model.get("model_id"), str):
            raise TypeError("a released model needs a model_id")
        found.append({"model_id": model["model_id"], "model": model.get("model"), "bytes": _count(model.get("bytes")),
                      "died": model.get("died") is True})
    return found


def _status(row):
    """A model's state at the end of the log as far as leaks go: ``released`` (a release freed it), ``leaked`` (a
    leak was reported and no release freed it) or None."""
    if row.get("released"):
        return "released"
    return "leaked" if row["tally"].leaks else None


MAX_DEPTH = 32          # a line nested deeper is skipped before it is parsed (no RecursionError)
MAX_NUMBER = 2 ** 63    # bytes and seconds above this are not from comfy_memx: the line is skipped


def parse_line(line):
    """One log line as JSON, refusing what comfy_memx never writes: nesting deeper than :data:`MAX_DEPTH`,
    ``NaN``/``Infinity``, numbers that overflow a float (``1e999``) or a whole number of more than 19 digits
    (raises ValueError)."""
    from comfy_memx.routekit.bodies import depth
    if depth(line.encode("utf-8", "replace")) > MAX_DEPTH:
        raise ValueError("nested too deep")
    return json.loads(line, parse_constant=_refuse, parse_float=_finite, parse_int=_bounded_int)


def _refuse(name):
    raise ValueError(name)


def _finite(text):
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def _bounded_int(text):
    if len(text.lstrip("-")) > 19:
        raise ValueError("a whole number too long")
    return int(text)


def _number(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number")
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise ValueError(f"{what} out of range")
    return value


def _count(value):
    if value is None:
        return 0
    return max(0, int(_number(value, "a byte count")))


def _seconds(value):
    if value is None:
        return 0.0
    return max(0.0, float(_number(value, "seconds")))


def read_events(path):
    """Aggregate the event log at ``path`` (raises OSError when it cannot be read)."""
    report = EventReport()
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            report.add_line(line)
    return report



def _section(lines, title, rows, empty, line_of):
    """Append a titled section to ``lines``: one indented line per row (``line_of(row)``), or ``empty``."""
    lines += ["", title]
    lines.extend("  " + line_of(row) for row in rows)
    if not rows:
        lines.append("  " + empty)

def format_text(report, path):
    """The human-readable report."""
    data = report.as_dict()
    head = (f"comfy_memx report of {path}: {data['events']} events over {data['seconds']:.1f} s"
            f", {data['processes']} process(es)")
    if data["malformed_lines"]:
        head += f"; {data['malformed_lines']} malformed line(s) skipped"
    lines = [head, "", "per model"]
    for row in data["models"]:
        lines += _model_lines(row, data["processes"] > 1, report.first_time)
    if not data["models"]:
        lines.append("  (no model events)")
    _section(lines, "leaks by package and holder pattern", data["leak_patterns"], "(no classified holder chains)",
             lambda row: f"{row['package']}: {row['pattern']} ({row['models']} model(s), {row['chains']} chain(s))"
                         f" - {row['suggestion']}")
    _section(lines, "reload time by cause (an unload whose weights were loaded again later)", data["reload_causes"],
             "(no reloads)", lambda row: f"{row['cause']} caused {row['reloads']} reload(s) of {row['model']}, "
                                         f"{row['seconds']:.1f} s ({format_bytes(row['bytes'])})")
    if data["thrash_warnings"]:
        lines.append(f"  {data['thrash_warnings']} thrash warning(s): a model reloaded in every one of the last prompts")
    lines += _releases_section(data)
    lines += ["", "per package"]
    for row in data["packages"]:
        lines.append(f"  {row['package']}")
        lines.append("    " + _tally_text(row))
    if not data["packages"]:
        lines.append("  (no model events)")
    return "\n".join(lines)


def _model_lines(row, several, first_time):
    """A model's lines: who loaded (and held) it, its tally, its leaks with their chains and fixes, its releases."""
    name = f"{row['model_id']}" + (f" (pid {row['pid']})" if several else "")
    held = f", held by package {row['holder_package']}" if row.get("holder_package") else ""
    if row["status"] == "released":
        held = held.replace(", held by", ", was held by") + ", released"
    lines = [f"  {name}  {row['model']}  {_built_text(row.get('created_by'))}loaded by package {row['package']}{held}"
             f"  peak resident {format_bytes(row['peak_resident_bytes'])}", "    " + _tally_text(row, of_model=True)]
    if row["leak_sightings"] > 1:
        lines.append(f"    seen leaked in {row['leak_sightings']} prompts")
    for leak in row["leak_reports"]:
        again = "" if leak["reason"] == "new" else f", searched again: {leak['reason']}"
        lines.append(f"    leak ({leak['stage']}{again})" + ("" if leak["chains"] else ": no chains recorded"))
        for chain in leak["chains"]:
            lines.append(f"      held by {chain['path']}  [package {chain.get('holder_package') or chain['package']}, "
                         f"{chain['root_kind']}]")
            if "pattern" in chain:
                lines.append(f"        fix ({chain['pattern']}): {chain['suggestion']}")
    lines.extend("    " + _release_text(release, first_time, row["model_id"]) for release in row["release_log"])
    return lines


def _built_text(created_by):
    """``built by package P (Class, node N), `` when the log has the model's ``created`` event, else nothing."""
    if not created_by or not created_by.get("package"):
        return ""
    node = ", ".join(part for part in (created_by.get("class_type"),
                                       f"node {created_by['node_id']}" if created_by.get("node_id") else None) if part)
    return f"built by package {created_by['package']}" + (f" ({node})" if node else "") + ", "


def _releases_section(data):
    """The section of the memory releases gave back: per holding package, the total, the tries that cut nothing."""
    lines = []
    _section(lines, "memory given back by releases (a pack's cache entry cut, no restart), by holding package",
             data["released_by_package"], "(no release)",
             lambda row: f"{row['package']}: {row['releases']} release(s), {row['models']} model(s) freed, "
                         f"{format_bytes(row['released_bytes'])} given back")
    if data["releases"]:
        lines.append(f"  total {format_bytes(data['released_bytes'])} given back by {len(data['releases'])} "
                     "release(s)")
    if data["release_tries_not_cut"]:
        tries = ", ".join(f"{outcome} {count}" for outcome, count in data["release_tries_not_cut"].items())
        lines.append(f"  releases that cut nothing: {tries}")
    return lines


def _release_text(release, first_time, model_id):
    """One line of a model's release: when (seconds since the log's first event), by what, the cut, the outcome."""
    when = f"+{release['time'] - first_time:.1f} s" if first_time else "?"
    trigger = {"http": "the Release button or POST /memx/models/{id}/release", "free": "free --release",
               "auto": "COMFY_MEMX_RELEASE=auto"}.get(release["trigger"], release["trigger"])
    if model_id in release["died"]:
        outcome = f"freed; {format_bytes(release['released_bytes'])} given back by this release"
    else:
        outcome = "cut, but the model was still held by something else"
    return f"released at {when} by {trigger}: cut {release['cut']} (package {release['package']}); {outcome}"


def _tally_text(row, of_model=False):
    """One tally line.  A package's says the leaks it holds, the releases that cut its cache entries (the bytes
    given back) and, apart, how many of its loads leaked (whoever holds them); a model's says only how often it
    leaked, by stage (it holds nothing and loads nothing itself), and that a release freed it."""
    unloads = ", ".join(f"{reason} {count}" for reason, count in row["unloads"].items()) or "none"
    leaks = ", ".join(f"{stage} {count}" for stage, count in row["leaks"].items()) or "none"
    leaked_loads = ", ".join(f"{stage} {count}" for stage, count in row.get("leaked_loads", {}).items()) or "none"
    if of_model:
        leak_text = f"leaked {leaks}" + (", then released (no longer leaked)" if row.get("status") == "released"
                                         else "")
    else:
        released = (f"; released {row['released_models']} model(s), {format_bytes(row['released_bytes'])} given back"
                    if row.get("releases") else "")
        leak_text = f"leaks held {leaks}{released}; its loads that leaked {leaked_loads}"
    return (f"loads {row['loads']} ({format_bytes(row['load_bytes'])}, {_gbps(row['load_gb_per_s'])}); "
            f"unloads {unloads} ({format_bytes(row['unload_bytes'])}, {_gbps(row['unload_gb_per_s'])}); "
            f"{leak_text}; pin evictions {row['pin_evictions']} ({format_bytes(row['pin_evicted_bytes'])})")


def _gbps(rate):
    return "no timed copy" if rate is None else f"{rate:.3f} GB/s"   # (on CPU nothing is copied to a device)


# Marker style of each kind of event on the timeline (one legend entry per kind).
MARKERS = {
    "load": {"marker": "^", "markersize": 7, "markerfacecolor": "white", "markeredgecolor": "black"},
    "unload": {"marker": "v", "markersize": 7, "markerfacecolor": "black", "markeredgecolor": "black"},
    "leak": {"marker": "X", "markersize": 11, "markerfacecolor": "red", "markeredgecolor": "darkred"},
    "release": {"marker": "D", "markersize": 8, "markerfacecolor": "limegreen", "markeredgecolor": "darkgreen"},
}
_LANE = 0.8          # height of a lane's band at the largest resident size of the log
_MODEL_COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                 "tab:cyan", "tab:gray", "navy", "darkgoldenrod", "teal")   # no red: red marks leaks


def _time_scale(span):
    """(divisor, unit) for the x axis: seconds, minutes or hours, whichever reads best for ``span`` seconds."""
    if span >= 2 * 3600:
        return 3600.0, "hours"
    if span >= 10 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _level(points, when):
    """Resident bytes just after ``when`` on a step timeline (0 before its first point)."""
    level = 0
    for at, resident in points:
        if at > when:
            break
        level = resident
    return level


def _leak_chain(referrer):
    """One referrer of a leak event as the report keeps it (its holding package and pattern when it has them)."""
    chain = {"path": str(referrer.get("path")), "package": referrer.get("package"),
             "root_kind": referrer.get("root_kind")}
    if referrer.get("holder_package"):
        chain["holder_package"] = referrer["holder_package"]
    if referrer.get("pattern"):
        chain.update(pattern=referrer["pattern"], suggestion=referrer.get("suggestion"))
    return chain


def draw_timeline(report):
    """A matplotlib Figure of the log: one lane per model, resident bytes over time, loads, unloads and leaks marked.

    Each model's lane holds one step line (gid ``model:<pid>:<model_id>``) whose height is its resident bytes,
    scaled so that the largest resident size of the whole log fills the lane; the line runs from the model's first
    event to the right edge of the plot, past the end of the log (dotted line), since a model stays resident until an
    unload says otherwise; a model loaded once and never unloaded is a band from its load to the edge; a model that
    a release freed ends at that release.  Loads (white triangle up), unloads (black triangle down), leaks (red
    cross, with the leak stage written next to it) and releases (green diamond) are markers on the lane, one artist
    per kind (gid ``marks:<kind>``), each named in the legend.
    """
    from matplotlib.figure import Figure

    keys = sorted(set(report.models) | set(report.timeline) | set(report.marks))
    start = report.first_time or 0.0
    span = (report.last_time - start) if report.last_time is not None else 0.0
    scale, unit = _time_scale(span)
    pad = span * 0.06 if span > 0 else 1.0
    peak = max([resident for points in report.timeline.values() for _, resident in points] + [1])
    frame = types.SimpleNamespace(start=start, span=span, scale=scale, right=span + pad, peak=peak, lanes=len(keys),
                   several=len({pid for pid, _ in keys}) > 1)

    figure = Figure(figsize=(11, 1.6 + 0.5 * max(len(keys), 2)))
    axes = figure.add_subplot()
    marks = {kind: ([], []) for kind in MARKERS}
    leak_labels = []
    labels = [_draw_lane(axes, report, lane, key, frame, marks, leak_labels) for lane, key in enumerate(keys)]
    for kind, (xs, ys) in marks.items():
        axes.plot(xs, ys, linestyle="none", gid=f"marks:{kind}", zorder=5, **MARKERS[kind])
    for x, y, text in leak_labels[:20]:
        axes.annotate(text, (x, y), xytext=(7, 5), textcoords="offset points", color="darkred", fontsize=8)
    if report.last_time is not None:
        axes.axvline(span / scale, color="black", linestyle=":", linewidth=1)
    _frame_axes(axes, frame, labels, pad, unit)
    figure.tight_layout()
    return figure


def _draw_lane(axes, report, lane, key, frame, marks, leak_labels):
    """Draw one model's lane (its step line and band), add its marks to ``marks``; return its y-axis label."""
    pid, model_id = key
    start, scale, peak = frame.start, frame.scale, frame.peak
    base = frame.lanes - 1 - lane            # first model on top
    color = _MODEL_COLORS[lane % len(_MODEL_COLORS)]
    points = report.timeline.get(key, [])
    own_marks = report.marks.get(key, [])
    first = min([at for at, _ in points] + [at for at, _, _ in own_marks] + [report.last_time or start])
    row = report.models.get(key, {})
    freed_at = [release["time"] for release in row.get("releases", ()) if model_id in release["died"]]
    end = (freed_at[-1] - start) if freed_at else frame.right   # a released model's lane ends at its release
    times = [first - start] + [at - start for at, _ in points] + [end]
    levels = [0] + [resident for _, resident in points]
    levels.append(levels[-1])
    heights = [base + _LANE * level / peak for level in levels]
    axes.plot([t / scale for t in times], heights, drawstyle="steps-post", color=color, linewidth=2,
              solid_capstyle="butt", gid=f"model:{pid}:{model_id}", label=model_id)
    axes.fill_between([t / scale for t in times], base, heights, step="post", color=color, alpha=0.25,
                      linewidth=0)
    axes.axhline(base, color="lightgrey", linewidth=0.6, zorder=0)
    for at, kind, detail in own_marks:
        marks[kind][0].append((at - start) / scale)
        marks[kind][1].append(base + _LANE * _level(points, at) / peak)
        if kind == "leak":
            leak_labels.append(((at - start) / scale, marks[kind][1][-1], f"leak ({detail})"))
    name = f"{model_id} (pid {pid})" if frame.several else model_id
    return f"{name}  {row.get('package', '?')}  peak {format_bytes(row.get('peak_resident', 0))}"


def _frame_axes(axes, frame, labels, pad, unit):
    """Lane labels, limits, axis title and the legend of the markers."""
    from matplotlib.lines import Line2D

    lanes, scale = frame.lanes, frame.scale
    axes.set_yticks([lanes - 1 - lane + _LANE / 2 for lane in range(lanes)])
    axes.set_yticklabels(labels, fontsize=8)
    axes.set_ylim(-0.35, max(lanes, 1) - 0.05)
    axes.set_xlim(-(pad if frame.span > 0 else 0.05) / scale, frame.right / scale)
    axes.set_xlabel(f"{unit} since the first event")
    axes.set_title(f"comfy_memx: resident bytes per model (a full lane = {format_bytes(frame.peak)})", fontsize=10,
                   loc="left")
    handles = [Line2D([], [], linestyle="none", label=kind, **MARKERS[kind]) for kind in MARKERS]
    handles.append(Line2D([], [], color="black", linestyle=":", linewidth=1, label="end of the log"))
    axes.legend(handles=handles, loc="lower right", bbox_to_anchor=(1, 1), ncol=len(handles), fontsize=8,
                frameon=False, borderaxespad=0.3, handletextpad=0.3, columnspacing=1.2)
    if not lanes:
        axes.text(0.5, 0.5, "no model events", transform=axes.transAxes, ha="center", va="center")


def write_timeline(report, png_path):
    """Draw :func:`draw_timeline` into ``png_path`` by ``core.private``'s rules (created 0600: it names models and
    packages; no link followed, an existing file only when it is this user's and private enough:
    ``core.private.Refused`` otherwise); raises ImportError without matplotlib."""
    from comfy_memx.core.private import create_private
    figure = draw_timeline(report)
    with create_private(png_path, binary=True) as png:
        figure.savefig(png, format="png", dpi=100)


def main(argv):
    """Entry point of ``python -m comfy_memx report``; returns the exit status."""
    description = __doc__.splitlines()[0].replace("``", "")   # --help is plain text, not reStructuredText
    parser = argparse.ArgumentParser(prog="python -m comfy_memx report", description=description)
    parser.add_argument("events", metavar="EVENTS.jsonl", help="an event log written with COMFY_MEMX_EVENTS")
    parser.add_argument("--png", metavar="timeline.png", help="also draw resident bytes per model over time")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    try:
        report = read_events(args.events)
    except OSError as exc:
        print(f"comfy_memx report: cannot read {args.events}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        print(json.dumps(report.as_dict(), indent=2) if args.json else format_text(report, args.events))
        sys.stdout.flush()
    except BrokenPipeError:   # ``report ... | head``: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if args.png is None:
        return 0
    try:
        write_timeline(report, args.png)
    except ImportError:
        print(f"comfy_memx report: --png needs matplotlib; {PLOT_HINT}", file=sys.stderr)
        return 1
    except Refused as exc:
        print(f"comfy_memx report: --png refused: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"comfy_memx report: cannot write {args.png}: {exc}", file=sys.stderr)
        return 1
    print(f"timeline written to {args.png}", file=sys.stderr)
    return 0
