"""The verdict of a ``release`` soak: survivors by the pack's census, RSS growth against the leaked bytes, images
compared byte for byte, the latency ratio, the release receipts, every target met or missed, and the summary.

The rules (``RELEASE_*`` in :mod:`bench.soak.config`; ``lag`` = ``RELEASE_LAG`` = 2):

* survivors are the pack's modules alive in the census at the end (a ``WeakSet`` inside the server, after a full
  collection). With release (``auto``): none may be alive except the models of the last ``lag`` prompts, which
  ComfyUI has not warned about yet (the last prompt's patcher is still in ComfyUI's output cache; the one before is
  collected at the next model load). Without release (``off``, and ``plain``): every key the workload asked for is
  alive, once: one survivor per leak prompt (a reuse prompt finds its model still cached). ``fixed`` (the pack that
  keeps nothing) follows the ``auto`` rule;
* RSS growth of a server: the median VmRSS after the last ``RELEASE_RSS_WINDOW`` prompts minus the median after
  the ``RELEASE_RSS_WINDOW`` prompts starting at the warm-up prompt (``ceil(prompts * warmup)``); the leaked bytes
  are the model bytes of the leak prompts between the middles of those two windows. With release: growth <=
  ``fixed``'s growth + ``RELEASE_RSS_SLACK_MODELS`` models' bytes, checked at >= ``PERF_CHECK_MIN_PROMPTS`` prompts
  and reported below that (``auto``'s RSS rises by about 15 MiB over its first ~80 prompts and stays flat after,
  which a short run's window cannot tell from growth; the models alive at a sample, one or two, move it by a model's
  bytes too). Without release, at any length: growth >= ``RELEASE_LEAK_RSS_FRACTION`` of the leaked bytes (the
  soak measures something);
* images: for every prompt the four servers' PNG files have the same SHA-256, and a reuse prompt's file equals its
  original prompt's on every server (the same workflow before and after a release gives the same output);
* latency: the median over prompts of ``auto``'s end-to-end latency over ``plain``'s for the same prompt
  (``RELEASE_LATENCY_TARGET``; checked at >= ``PERF_CHECK_MIN_PROMPTS`` prompts, reported below that);
* releases: ``auto``'s event log holds a ``release`` receipt with outcome ``released`` (and ``died``) for every model
  built except the last ``lag`` (entries dropped with them, ``other_entries_dropped``, count too); ``off``'s holds none.
"""

import math
import statistics

from bench.soak.config import (MIB, PERF_CHECK_MIN_PROMPTS, RELEASE_LAG, RELEASE_LATENCY_TARGET,
                               RELEASE_LEAK_RSS_FRACTION, RELEASE_RSS_SLACK_MODELS, RELEASE_RSS_WINDOW,
                               RELEASE_SERVERS)
from bench.soak.measurements import format_value, paired_median_ratio
from bench.soak.release_workload import LEAK, REUSE, distinct_keys, recent_keys
from bench.soak.verdict import Targets, table_lines, target_lines


def growth_window(prompts, warmup, window=RELEASE_RSS_WINDOW):
    """``(first, last)``: the after-prompt samples of prompts ``first .. first + window - 1`` and
    ``last - window + 1 .. last`` bound the growth window; None when the run is too short for two windows."""
    first = max(1, int(math.ceil(prompts * warmup)))
    last = prompts - 1
    if last - window + 1 < first + window:
        return None
    return first, last


def rss_growth(samples, prompts, warmup, window=RELEASE_RSS_WINDOW):
    """RSS growth in bytes over the growth window from ``(prompt_index, vmrss, ...)`` samples (see the module
    docstring), or None when the run is too short or samples are missing."""
    bounds = growth_window(prompts, warmup, window)
    if bounds is None:
        return None
    first, last = bounds
    by_index = {sample[0]: sample[1] for sample in samples if sample[1] is not None}
    start = [by_index[i] for i in range(first, first + window) if i in by_index]
    end = [by_index[i] for i in range(last - window + 1, last + 1) if i in by_index]
    if len(start) < (window + 1) // 2 or len(end) < (window + 1) // 2:
        return None
    return statistics.median(end) - statistics.median(start)


def leaked_bytes(items, prompts, warmup, bytes_per_model, window=RELEASE_RSS_WINDOW):
    """Bytes of the models the leak prompts between the middles of the two RSS windows build (what a pack that
    keeps everything adds over the growth window), or None when the run is too short."""
    bounds = growth_window(prompts, warmup, window)
    if bounds is None:
        return None
    first, last = bounds
    lo, hi = first + (window - 1) / 2, last - (window - 1) / 2
    return bytes_per_model * sum(1 for item in items if item["kind"] == LEAK and lo < item["index"] <= hi)


def survivors(census, items, released, lag=RELEASE_LAG):
    """The survivor verdict of one server's census: with ``released`` (auto, fixed) no module alive but the last
    ``lag`` prompts' ("stale" lists the others); without, exactly every key of the workload, once each."""
    if not isinstance(census, dict) or not isinstance(census.get("alive"), list):
        return {"ok": False, "alive": None, "error": "no census"}
    alive = census["alive"]
    result = {"alive": len(alive), "alive_bytes": census.get("alive_bytes"), "held": census.get("held")}
    if released:
        recent = set(recent_keys(items, lag))
        stale = sorted(key for key in alive if key not in recent)
        result.update(ok=not stale, stale=len(stale), stale_keys=stale[:20],
                      recent_alive=sorted(key for key in alive if key in recent))
    else:
        want = distinct_keys(items)
        missing = sorted(set(want) - set(alive))
        extra = sorted(key for key in set(alive) if alive.count(key) > 1 or key not in want)
        result.update(ok=not missing and not extra, expected=len(want), missing=missing[:20], extra=extra[:20])
    return result


def compare_images(items, images_by_server):
    """Whether every prompt saved the same PNG bytes on every server, and every reuse prompt the same bytes as its
    original prompt: counts and the first differences."""
    differing, missing, reuse_differing, compared, reuses = [], [], [], 0, 0
    labels = list(images_by_server)
    count = min((len(images) for images in images_by_server.values()), default=0)
    for item in items[:count]:
        index = item["index"]
        hashes = {label: images_by_server[label][index] for label in labels}
        if any(value is None for value in hashes.values()):
            missing.append(index)
            continue
        compared += 1
        if len(set(hashes.values())) > 1:
            differing.append({"index": index, "key": item["key"], "hashes": {k: v[:12] for k, v in hashes.items()}})
        if item["kind"] == REUSE:
            reuses += 1
            for label in labels:
                original = images_by_server[label][item["origin"]]
                if original != hashes[label]:
                    reuse_differing.append({"index": index, "origin": item["origin"], "server": label})
    ok = count == len(items) and not differing and not missing and not reuse_differing
    return {"ok": ok, "prompts_compared": compared, "reuses_compared": reuses, "differing": len(differing),
            "missing": len(missing), "reuse_differing": len(reuse_differing), "differing_examples": differing[:5],
            "missing_examples": missing[:10], "reuse_differing_examples": reuse_differing[:5]}


def latency_ratio(numerator, denominator):
    """Median of per-prompt ratios of two servers' end-to-end seconds (prompts either failed are left out)."""
    return paired_median_ratio(list(numerator), list(denominator))


def analyse(report):
    """Add the derived figures to a release report: ``figures`` (per server: survivors, RSS growth; leaked bytes,
    images, latency ratios, releases)."""
    items = report.get("workload_items") or []
    servers = report.get("servers") or {}
    workload = report.get("workload") or {}
    per_model = workload.get("model_bytes") or 0
    prompts, warmup = report.get("prompts", 0), workload.get("warmup", 0.2)
    figures = {"model_bytes": per_model, "lag": RELEASE_LAG, "servers": {}}
    for label in RELEASE_SERVERS:
        server = servers.get(label) or {}
        figures["servers"][label] = {
            "survivors": survivors(server.get("census"), items, released=label in ("auto", "fixed")),
            "rss_growth": rss_growth(server.get("rss_after") or [], prompts, warmup),
        }
    figures["leaked_bytes"] = leaked_bytes(items, prompts, warmup, per_model)
    figures["rss_window"] = growth_window(prompts, warmup)
    if all(label in servers and servers[label].get("prompts_run") for label in RELEASE_SERVERS):
        figures["images"] = compare_images(items, {label: servers[label].get("images") or []
                                                   for label in RELEASE_SERVERS})
    else:
        figures["images"] = {"ok": False, "error": "not every server ran"}
    figures.update(_latency_figures(servers))
    figures["releases"] = _release_figures(servers, prompts)
    report["figures"] = figures
    return figures


def _latency_figures(servers):
    """The paired latency ratios between the servers (end to end, and ComfyUI's execution auto/plain)."""
    e2e = {label: (servers.get(label) or {}).get("e2e_s") or [] for label in RELEASE_SERVERS}
    exec_s = {label: (servers.get(label) or {}).get("exec_s") or [] for label in RELEASE_SERVERS}
    return {"latency_ratio": latency_ratio(e2e["auto"], e2e["plain"]),
            "latency_ratios": {f"{a}/{b}": latency_ratio(e2e[a], e2e[b])
                               for a, b in (("auto", "plain"), ("off", "plain"), ("auto", "off"), ("auto", "fixed"),
                                            ("plain", "fixed"))},
            "exec_ratio": latency_ratio(exec_s["auto"], exec_s["plain"])}


def _release_figures(servers, prompts):
    """What auto's receipts released against what it had to (every model built but the last prompts'); off's
    receipt count."""
    auto_releases = (servers.get("auto") or {}).get("releases") or {}
    return {
        "auto": auto_releases, "off": ((servers.get("off") or {}).get("releases") or {}).get("count", 0),
        "released": auto_releases.get("by_outcome", {}).get("released", 0),
        "died": auto_releases.get("died", 0),
        "other_entries_dropped": auto_releases.get("other_entries_dropped", 0),
        "built_on_auto": prompts,
        "needed": max(0, prompts - RELEASE_LAG),
    }


_REPORTED_ONLY = f"reported only (checked at >= {PERF_CHECK_MIN_PROMPTS} prompts)"


def evaluate_release(report, check):
    """The targets of a release report (shape of :func:`bench.soak.verdict.evaluate`: ``name``, ``value``,
    ``limit``, ``met``, ``hard``, ``checked``, ``note``)."""
    figures = report.get("figures") or analyse(report)
    prompts = report.get("prompts", 0)
    targets = Targets(check, check and prompts >= PERF_CHECK_MIN_PROMPTS)
    _run_targets(targets, report, report.get("servers") or {}, prompts)
    _survivor_targets(targets, figures["servers"])
    _release_targets(targets, figures)
    _rss_targets(targets, figures)
    ratio = figures["latency_ratio"]
    targets.add("median of paired latencies auto / plain", None if ratio is None else round(ratio, 3),
                RELEASE_LATENCY_TARGET, None if ratio is None else ratio <= RELEASE_LATENCY_TARGET, hard=False,
                note=None if targets.perf_checked else _REPORTED_ONLY)
    return targets


def _run_targets(targets, report, servers, prompts):
    """Every prompt ran on every server, none failed, no comfy_memx traceback, valid event logs."""
    runs = {label: (servers.get(label) or {}).get("prompts_run", 0) for label in RELEASE_SERVERS}
    targets.add("all prompts ran on every server", " ".join(f"{k} {v}" for k, v in runs.items()), prompts,
                all(v == prompts for v in runs.values()) and not report.get("error"), note=report.get("error"))
    failed = {label: (servers.get(label) or {}).get("failed", 0) for label in RELEASE_SERVERS}
    targets.add("failed prompts", " ".join(f"{k} {v}" for k, v in failed.items()), 0, not any(failed.values()))
    bad = {label: ((servers.get(label) or {}).get("log") or {}).get("comfy_memx_tracebacks", 0)
           + len(((servers.get(label) or {}).get("log") or {}).get("internal_errors", [])) for label in ("off", "auto")}
    targets.add("comfy_memx tracebacks + internal errors", " ".join(f"{k} {v}" for k, v in bad.items()), 0,
                not any(bad.values()))
    _event_log_target(targets, servers)


def _event_log_target(targets, servers):
    """Every line of the comfy_memx servers' event logs is a valid event."""
    events = {label: (servers.get(label) or {}).get("events") or {} for label in ("off", "auto")}
    targets.add("event logs valid",
                " ".join(f"{k} {e.get('valid', 0)}/{e.get('lines', 0)}" for k, e in events.items()),
                "all", all(e.get("lines", 0) > 0 and e.get("invalid", 0) == 0 for e in events.values()))


def _survivor_targets(targets, alive):
    """The census rules: auto keeps nothing but the last prompts' models, off (and plain) every key once."""
    auto_s, off_s = alive["auto"]["survivors"], alive["off"]["survivors"]
    targets.add("survivors with release (auto), older than the last prompts", auto_s.get("stale"),
                f"0 (the last {RELEASE_LAG} prompts' models exempt)", bool(auto_s.get("ok")),
                note=f"alive {auto_s.get('alive')}, of the last {RELEASE_LAG} prompts {auto_s.get('recent_alive')}")
    targets.add("survivors without release (off): every key, once", f"{off_s.get('alive')}/{off_s.get('expected')}",
                "one per leak prompt", bool(off_s.get("ok")))
    plain_s, fixed_s = alive["plain"]["survivors"], alive["fixed"]["survivors"]
    targets.add("survivors, plain ComfyUI (pack as written) / fixed pack (workload sanity)",
                f"{plain_s.get('alive')} / {fixed_s.get('alive')}", "plain: every key; fixed: last prompts only",
                bool(plain_s.get("ok")) and bool(fixed_s.get("ok")))


def _release_targets(targets, figures):
    """auto released every model but the last prompts' (and they died), off released none, the images agree."""
    releases = figures["releases"]
    auto_r = releases["auto"] or {}
    cut = releases["released"] + releases["other_entries_dropped"]
    targets.add("models released on auto (every model built but the last prompts')",
                f"{releases['released']} + {releases['other_entries_dropped']} entries dropped with them (died "
                f"{releases['died']})", f">= {releases['needed']}",
                cut >= releases["needed"] and releases["died"] >= releases["released"],
                note="outcomes " + ", ".join(f"{k} {v}" for k, v in (auto_r.get("by_outcome") or {}).items()))
    targets.add("release receipts on off", releases["off"], 0, releases["off"] == 0)
    images = figures["images"]
    targets.add("images identical (every prompt on every server; reuse = original)",
                f"{images.get('prompts_compared', 0)} prompts, {images.get('reuses_compared', 0)} reuses; differing "
                f"{images.get('differing', '-')}, reuse differing {images.get('reuse_differing', '-')}, missing "
                f"{images.get('missing', '-')}", "0 differing", bool(images.get("ok")), note=images.get("error"))


def _rss_targets(targets, figures):
    """RSS growth: auto's within the fixed pack's and two models, off's at least half the leaked bytes."""
    alive = figures["servers"]
    growth = {label: alive[label]["rss_growth"] for label in RELEASE_SERVERS}
    limit = None if growth["fixed"] is None else growth["fixed"] + RELEASE_RSS_SLACK_MODELS * figures["model_bytes"]
    targets.add("RSS growth with release (auto) <= fixed pack's + 2 models, MiB", _mib(growth["auto"]),
                None if limit is None else round(limit / MIB, 1),
                None if growth["auto"] is None or limit is None else growth["auto"] <= limit, hard=False,
                note="run too short for two RSS windows" if growth["auto"] is None else (
                    None if targets.perf_checked else _REPORTED_ONLY))
    leaked = figures["leaked_bytes"]
    floor = None if leaked is None else RELEASE_LEAK_RSS_FRACTION * leaked
    targets.add("RSS growth without release (off) >= half the leaked bytes, MiB", _mib(growth["off"]),
                None if floor is None else round(floor / MIB, 1),
                None if growth["off"] is None or floor is None else growth["off"] >= floor,
                note=None if leaked is None else f"leaked {leaked / MIB:.0f} MiB over the window")


def _mib(value):
    return None if value is None else round(value / MIB, 1)


def format_release_summary(report):
    """The readable summary: per-server figures in one table, the cross-server figures, then the targets."""
    figures = report.get("figures") or {}
    servers = report.get("servers") or {}
    workload = report.get("workload") or {}
    lines = [f"release soak: ComfyUI {report.get('comfyui_version')} ({report.get('comfyui')}), comfy_memx "
             f"{(servers.get('auto') or {}).get('log', {}).get('comfy_memx_version')}, {report.get('prompts')} "
             f"prompts per server ({workload.get('leak_prompts')} leak, {workload.get('reuse_prompts')} reuse), "
             f"models of {format_value((workload.get('model_bytes') or 0) / MIB, 1)} MiB, {format_value(report.get('wall_s'), 0)} s, "
             f"load average {format_value((report.get('loadavg_1m_during') or {}).get('median'), 1)}"]
    lines += table_lines(_server_rows(servers, figures.get("servers") or {}))
    lines += _cross_server_lines(figures)
    return "\n".join(lines + target_lines(report.get("targets") or []))


def _server_rows(servers, per):
    """The per-server table: a header, then one row per figure with a cell per server."""

    def cells(function):
        return tuple(format_value(function(servers.get(label) or {}, per.get(label) or {})) for label in RELEASE_SERVERS)

    rows = [("figure",) + RELEASE_SERVERS]
    rows += [
        ("prompts run / failed",) + cells(lambda s, f: f"{s.get('prompts_run', 0)} / {s.get('failed', 0)}"),
        ("median latency, end to end (s)",) + cells(lambda s, f: s.get("latency", {}).get("e2e", {}).get("median")),
        ("median ComfyUI execution (s)",) + cells(lambda s, f: s.get("latency", {}).get("exec", {}).get("median")),
        ("p90 latency, end to end (s)",) + cells(lambda s, f: s.get("latency", {}).get("e2e", {}).get("p90")),
        ("VmRSS first / last (MiB)",) + cells(lambda s, f: "/".join(
            format_value(None if not s.get("rss_after") or s["rss_after"][i][1] is None else s["rss_after"][i][1] / MIB, 0)
            for i in (0, -1))),
        ("RSS growth over the window (MiB)",) + cells(lambda s, f: _mib(f.get("rss_growth"))),
        ("pack models alive at the end",) + cells(lambda s, f: (f.get("survivors") or {}).get("alive")),
        ("tracebacks (comfy_memx)",) + cells(lambda s, f: f"{s.get('log', {}).get('tracebacks', 0)} "
                                                        f"({s.get('log', {}).get('comfy_memx_tracebacks', 0)})"),
        ("ComfyUI leak warnings",) + cells(lambda s, f: s.get("log", {}).get("comfyui_leak_warnings", 0)),
        ("release receipts (released)",) + cells(
            lambda s, f: "-" if "releases" not in s else
            f"{s['releases'].get('count', 0)} ({s['releases'].get('by_outcome', {}).get('released', 0)})"),
    ]
    return rows


def _cross_server_lines(figures):
    """The RSS window and what leaked over it, the latency ratios, auto's receipts by pattern and method."""
    window = figures.get("rss_window")
    leaked = figures.get("leaked_bytes")
    ratios = figures.get("latency_ratios") or {}
    auto_r = ((figures.get("releases") or {}).get("auto") or {})
    return [
        "",
        f"RSS window: after prompts {window[0] if window else '-'}.. to ..{window[1] if window else '-'}; "
        f"leaked over it without release: {format_value(None if leaked is None else leaked / MIB, 0)} MiB",
        "latency ratios (median of paired prompts): " + ", ".join(f"{k} {format_value(v)}" for k, v in ratios.items())
        + f"; ComfyUI execution auto/plain {format_value(figures.get('exec_ratio'))}",
        "auto's receipts by pattern: " + ", ".join(f"{k} {v}" for k, v in (auto_r.get("by_pattern") or {}).items())
        + "; by method: " + ", ".join(f"{k} {v}" for k, v in (auto_r.get("by_method") or {}).items()),
    ]
