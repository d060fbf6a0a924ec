"""The verdict of a ``pack-keeps`` soak: survivors by the pack's census and by comfy_memx's ``/memx/models``, RSS
growth at the troughs of the free cycles against plain ComfyUI's and against what the packs kept, images compared
byte for byte, the release receipts, every target met or missed, and the summary.

The rules (``KEEPS_*`` in :mod:`bench.soak.config`):

* survivors: every prompt's model is older than the last free (the workload's last prompt is followed by one). With
  release (``auto``) none of them may be alive at the end, neither in the pack's census (the witnessed modules,
  after a full collection) nor among ``/memx/models``'s rows that a workload prompt built or loaded; the census runs
  once no release ``auto`` queued is pending any more, or their number stopped moving for 30 s (no prompt comes to
  wake ComfyUI's worker: what an idle server gives back after a free). Without release (``off``) the census shows
  exactly what the packs hold (every key of an unbounded cache, Inspire-Pack's newest five) and ``/memx/models`` at
  least one row per held key; ``plain`` (caches off) holds none;
* RSS growth of a server, at the troughs of the free cycles: its VmRSS once settled after each free (ComfyUI's
  cache is empty then, so the troughs hold the process, what the packs keep and what the allocator kept); growth =
  the median of the last ``KEEPS_RSS_WINDOW`` troughs minus the median of the first ones (fewer troughs: half of
  them each). With release: growth <= plain's growth + ``KEEPS_RSS_SLACK_MODELS`` models' bytes (a model's bytes:
  its UNet, VAE and CLIP as the witness measured them in the server). Without release: growth >=
  ``KEEPS_KEPT_RSS_FRACTION`` of the bytes the packs came to hold more
  between the middle troughs of the two windows;
* images: for every prompt the three servers' PNG files have the same SHA-256;
* releases: ``auto``'s event log holds a ``release`` receipt with outcome ``released`` (its model died) for at least
  every cache entry the packs held at a free (``entries_to_release``); ``off``'s holds none;
* every prompt ran and succeeded, every ``/memx/free`` answered a finished receipt, no comfy_memx traceback or
  internal error in a log, valid event logs.

The latency of the servers is reported (paired per prompt), not judged: ``bench.soak``'s other workloads measure
what comfy_memx costs per prompt.
"""

import statistics

from bench.soak.config import (KEEPS_KEPT_RSS_FRACTION, KEEPS_RSS_SLACK_MODELS, KEEPS_RSS_WINDOW, KEEPS_SERVERS,
                               MIB)
from bench.soak.keeps_workload import KEEP, held_keys
from bench.soak.measurements import format_value, paired_median_ratio
from bench.soak.release_verdict import compare_images
from bench.soak.verdict import Targets, table_lines, target_lines


def troughs(server):
    """``[(prompt index, VmRSS)]``: the server's RSS once settled after each free (the free that followed that
    prompt), the troughs of the free cycles."""
    return [(sample[0], sample[1]) for sample in server.get("rss_after_free") or [] if sample[1] is not None]


def growth_windows(count, window=KEEPS_RSS_WINDOW):
    """How many troughs each end of the growth window averages: ``window``, or half of ``count`` when fewer; 0 when
    there are fewer than two troughs."""
    return min(window, count // 2)


def rss_growth(points, window=KEEPS_RSS_WINDOW):
    """``(growth in bytes, first window's middle, last window's middle)`` over trough ``points`` (see the module
    docstring), or ``(None, None, None)`` with fewer than two troughs."""
    width = growth_windows(len(points), window)
    if width < 1:
        return None, None, None
    first, last = points[:width], points[-width:]
    growth = statistics.median(v for _, v in last) - statistics.median(v for _, v in first)
    return growth, first[(width - 1) // 2][0], last[(width - 1) // 2][0]


def held_at(items, index):
    """How many keys the packs hold without release after prompt ``index``."""
    return len(held_keys(items, index))


def model_bytes_of(servers):
    """One kept model's bytes (its modules' weights as the witness measured them): the median over the keys of the
    first census that has them (off's first), or None."""
    for label in ("off", "auto", "plain"):
        witnessed = ((servers.get(label) or {}).get("census") or {}).get("witnessed_bytes") or {}
        values = [v for v in witnessed.values() if isinstance(v, (int, float)) and v > 0]
        if values:
            return statistics.median(values)
    return None


def census_survivors(census, items, label):
    """The survivor verdict of one server's census: ``auto`` and ``plain`` none of the workload's keys alive; ``off``
    exactly the keys the packs hold."""
    if not isinstance(census, dict) or not isinstance(census.get("alive"), list):
        return {"ok": False, "alive": None, "error": "no census"}
    alive = census["alive"]
    result = {"alive": len(alive), "alive_bytes": census.get("alive_bytes"), "held": census.get("held"),
              "model_patchers": census.get("model_patchers"), "base_models": census.get("base_models")}
    if label == "off":
        want = held_keys(items)
        missing, extra = sorted(set(want) - set(alive)), sorted(set(alive) - set(want))
        result.update(ok=not missing and not extra, expected=len(want), missing=missing[:20], extra=extra[:20])
    else:
        keys = {item["key"] for item in items}
        stale = sorted(key for key in alive if key in keys)
        result.update(ok=not stale, stale=len(stale), stale_keys=stale[:20])
    return result


def rows_survivors(models_after, items, label):
    """The survivor verdict by ``/memx/models``: on ``auto`` no row that a workload prompt loaded; on ``off`` at
    least one per key the packs hold."""
    if not isinstance(models_after, dict) or "from_workload" not in models_after:
        return {"ok": False, "rows": None, "error": f"no /memx/models answer ({models_after})"}
    rows = models_after["from_workload"]
    result = {"rows": rows, "by_model": models_after.get("by_model"), "by_state": models_after.get("by_state")}
    if label == "off":
        result.update(expected_at_least=len(held_keys(items)), ok=rows >= len(held_keys(items)))
    else:
        result.update(ok=rows == 0, prompt_indices=(models_after.get("prompt_indices") or [])[:20])
    return result


def analyse(report):
    """Add the derived figures to a pack-keeps report (``figures``: per server survivors and RSS growth; a model's
    bytes, what the packs kept over the window, images, latency ratios, releases) and return them."""
    items = report.get("workload_items") or []
    servers = report.get("servers") or {}
    per_model = model_bytes_of(servers)
    figures = {"model_bytes": per_model,
               "servers": {label: _server_figures(servers.get(label) or {}, items, label) for label in KEEPS_SERVERS}}
    low, high = figures["servers"]["off"]["window"]
    kept = None if low is None or per_model is None else (held_at(items, high) - held_at(items, low)) * per_model
    figures["kept_bytes"] = kept
    figures["images"] = _images(items, servers)
    e2e = {label: (servers.get(label) or {}).get("e2e_s") or [] for label in KEEPS_SERVERS}
    figures["latency_ratios"] = {f"{a}/{b}": paired_median_ratio(e2e[a], e2e[b])
                                 for a, b in (("off", "plain"), ("auto", "plain"), ("auto", "off"))}
    figures["releases"] = _releases(report, servers)
    report["figures"] = figures
    return figures


def _server_figures(server, items, label):
    """One server's survivors (census; ``/memx/models`` rows on the comfy_memx ones), troughs and RSS growth."""
    points = troughs(server)
    growth, low, high = rss_growth(points)
    figures = {"census": census_survivors(server.get("census"), items, label), "troughs": points,
               "rss_growth": growth, "window": [low, high]}
    if label != "plain":
        figures["rows"] = rows_survivors(server.get("models_after"), items, label)
        figures["release_wait"] = server.get("release_wait")
    return figures


def _images(items, servers):
    """Every prompt's PNG compared across the three servers (when all three ran)."""
    if not all(label in servers and servers[label].get("prompts_run") for label in KEEPS_SERVERS):
        return {"ok": False, "error": "not every server ran"}
    return compare_images([dict(item, kind=KEEP) for item in items],
                          {label: servers[label].get("images") or [] for label in KEEPS_SERVERS})


def _releases(report, servers):
    """auto's receipts, off's receipt count, and how many entries auto had to release."""
    auto_releases = (servers.get("auto") or {}).get("releases") or {}
    return {"auto": auto_releases, "off": ((servers.get("off") or {}).get("releases") or {}).get("count", 0),
            "released": auto_releases.get("by_outcome", {}).get("released", 0), "died": auto_releases.get("died", 0),
            "needed": (report.get("workload") or {}).get("entries_to_release", 0)}


def evaluate_keeps(report, check):
    """The targets of a pack-keeps report (shape of :func:`bench.soak.verdict.evaluate`); all are hard."""
    figures = report.get("figures") or analyse(report)
    targets = Targets(check, check)
    servers = report.get("servers") or {}
    _run_targets(targets, report, servers)
    _survivor_targets(targets, figures["servers"])
    _release_targets(targets, figures)
    _rss_targets(targets, figures)
    return targets


def _per_server(servers, labels, function):
    return {label: function(servers.get(label) or {}) for label in labels}


def _run_targets(targets, report, servers):
    """Every prompt ran on every server and succeeded, the frees answered, no comfy_memx traceback, valid logs."""
    prompts = report.get("prompts", 0)
    runs = _per_server(servers, KEEPS_SERVERS, lambda s: s.get("prompts_run", 0))
    targets.add("all prompts ran on every server", " ".join(f"{k} {v}" for k, v in runs.items()), prompts,
                all(v == prompts for v in runs.values()) and not report.get("error"), note=report.get("error"))
    failed = _per_server(servers, KEEPS_SERVERS, lambda s: s.get("failed", 0))
    targets.add("failed prompts", " ".join(f"{k} {v}" for k, v in failed.items()), 0, not any(failed.values()))
    _free_target(targets, servers, (report.get("workload") or {}).get("frees"))
    _log_targets(targets, servers)


def _free_target(targets, servers, expected):
    """Every ``/memx/free`` answered 200 with a finished receipt, one per free of the workload."""
    frees = _per_server(servers, ("off", "auto"), lambda s: s.get("frees") or [])
    bad = {label: sum(1 for f in records if f.get("status") != 200 or f.get("receipt_status") != "done")
           for label, records in frees.items()}
    targets.add("/memx/free receipts finished (off, auto)",
                " ".join(f"{k} {len(frees[k]) - bad[k]}/{len(frees[k])}" for k in frees), f"{expected} each",
                all(len(records) == expected for records in frees.values()) and not any(bad.values()))


def _log_targets(targets, servers):
    """No comfy_memx traceback or internal error in the comfy_memx servers' logs; their event logs are valid."""
    logs = _per_server(servers, ("off", "auto"), lambda s: s.get("log") or {})
    errors = {label: log.get("comfy_memx_tracebacks", 0) + len(log.get("internal_errors", []))
              for label, log in logs.items()}
    targets.add("comfy_memx tracebacks + internal errors", " ".join(f"{k} {v}" for k, v in errors.items()), 0,
                not any(errors.values()))
    events = _per_server(servers, ("off", "auto"), lambda s: s.get("events") or {})
    targets.add("event logs valid", " ".join(f"{k} {e.get('valid', 0)}/{e.get('lines', 0)}" for k, e in events.items()),
                "all", all(e.get("lines", 0) > 0 and e.get("invalid", 0) == 0 for e in events.values()))


def _survivor_targets(targets, per):
    """auto: nothing older than the last free alive (census and /memx/models); off holds what the packs keep; plain
    holds nothing."""
    auto_census, auto_rows = per["auto"]["census"], per["auto"]["rows"]
    wait = per["auto"].get("release_wait") or {}
    targets.add("survivors older than the last free on auto, by the pack's census", auto_census.get("stale"), 0,
                bool(auto_census.get("ok")), note=auto_census.get("error") or (
                    f"first: {auto_census.get('stale_keys')[:5]}; releases still queued after the last free: "
                    f"{wait.get('pending_at_end')} of {wait.get('pending_at_start')} after {wait.get('waited_s')} s"
                    if auto_census.get("stale") else None))
    targets.add("survivors older than the last free on auto, by /memx/models", auto_rows.get("rows"), 0,
                bool(auto_rows.get("ok")), note=auto_rows.get("error") or (
                    f"by model {auto_rows.get('by_model')}" if auto_rows.get("rows") else None))
    off_census, off_rows = per["off"]["census"], per["off"]["rows"]
    targets.add("without release (off) the packs hold every key they kept (census; /memx/models rows)",
                f"{off_census.get('alive')}/{off_census.get('expected')}; rows {off_rows.get('rows')}",
                "the keys exactly; a row per key", bool(off_census.get("ok")) and bool(off_rows.get("ok")),
                note=off_census.get("error") or off_rows.get("error"))
    plain = per["plain"]["census"]
    targets.add("plain ComfyUI (caches off) holds no workload model", plain.get("alive"), 0, bool(plain.get("ok")),
                note=plain.get("error"))


def _release_targets(targets, figures):
    """auto released every entry held at a free (and its models died), off released none, the images agree."""
    releases = figures["releases"]
    outcomes = (releases["auto"] or {}).get("by_outcome") or {}
    targets.add("entries released on auto (every entry the packs held at a free; models died)",
                f"{releases['released']} (died {releases['died']})", f">= {releases['needed']}",
                releases["released"] >= releases["needed"] and releases["died"] >= releases["released"],
                note="outcomes " + (", ".join(f"{k} {v}" for k, v in outcomes.items()) or "none"))
    targets.add("release receipts on off", releases["off"], 0, releases["off"] == 0)
    images = figures["images"]
    targets.add("images identical (every prompt on the three servers)",
                f"{images.get('prompts_compared', 0)} prompts; differing {images.get('differing', '-')}, missing "
                f"{images.get('missing', '-')}", "0 differing", bool(images.get("ok")), note=images.get("error"))


def _rss_targets(targets, figures):
    """RSS growth at the troughs: auto's within plain's and two models, off's at least half of what was kept."""
    per = figures["servers"]
    growth = {label: per[label]["rss_growth"] for label in KEEPS_SERVERS}
    model = figures["model_bytes"]
    limit = None if growth["plain"] is None or model is None else growth["plain"] + KEEPS_RSS_SLACK_MODELS * model
    targets.add(f"RSS growth with release (auto) <= plain's + {KEEPS_RSS_SLACK_MODELS} models, MiB",
                _mib(growth["auto"]),
                None if limit is None else round(limit / MIB, 1),
                None if growth["auto"] is None or limit is None else growth["auto"] <= limit,
                note=f"a model {_mib(model)} MiB; troughs {len(per['auto']['troughs'])}")
    kept = figures["kept_bytes"]
    floor = None if kept is None else KEEPS_KEPT_RSS_FRACTION * kept
    targets.add("RSS growth without release (off) >= half of what the packs kept, MiB", _mib(growth["off"]),
                None if floor is None else round(floor / MIB, 1),
                None if growth["off"] is None or floor is None else growth["off"] >= floor,
                note=None if kept is None else f"kept {kept / MIB:.0f} MiB between troughs "
                                               f"{per['off']['window'][0]} and {per['off']['window'][1]}")


def _mib(value):
    return None if value is None else round(value / MIB, 1)


def format_keeps_summary(report):
    """The readable summary: per-server figures in one table, the latency ratios and receipts, then the targets."""
    figures = report.get("figures") or {}
    servers = report.get("servers") or {}
    workload = report.get("workload") or {}
    lines = [f"pack-keeps soak: ComfyUI {report.get('comfyui_version')} ({report.get('comfyui')}), comfy_memx "
             f"{(servers.get('auto') or {}).get('log', {}).get('comfy_memx_version')}, {report.get('prompts')} "
             f"prompts per server, loaders {'/'.join(workload.get('loaders') or [])}, a free after every "
             f"{workload.get('free_every')} prompts and the last ({workload.get('frees')} frees), checkpoint "
             f"{report.get('checkpoint')}, models of {format_value(_mib(figures.get('model_bytes')), 1)} MiB, "
             f"{format_value(report.get('wall_s'), 0)} s, load average "
             f"{format_value((report.get('loadavg_1m_during') or {}).get('median'), 1)}"]
    lines += table_lines(_server_rows(servers, figures.get("servers") or {}))
    ratios = figures.get("latency_ratios") or {}
    auto_r = (figures.get("releases") or {}).get("auto") or {}
    lines += ["", "latency ratios (median of paired prompts): "
              + ", ".join(f"{k} {format_value(v)}" for k, v in ratios.items()),
              "auto's receipts by pattern: "
              + ", ".join(f"{k} {v}" for k, v in (auto_r.get("by_pattern") or {}).items())
              + "; by trigger: " + ", ".join(f"{k} {v}" for k, v in (auto_r.get("by_trigger") or {}).items())]
    return "\n".join(lines + target_lines(report.get("targets") or []))


def _server_rows(servers, per):
    """The per-server table: a header, then one row per figure with a cell per server."""

    def cells(function):
        return tuple(format_value(function(servers.get(label) or {}, per.get(label) or {})) for label in KEEPS_SERVERS)

    def trough_ends(figures):
        points = figures.get("troughs") or []
        return "/".join(format_value(points[i][1] / MIB if points else None, 0) for i in (0, -1))

    def receipts(server):
        releases = server.get("releases")
        if releases is None:
            return "-"
        return f"{releases.get('count', 0)} ({releases.get('by_outcome', {}).get('released', 0)})"

    return [("figure",) + KEEPS_SERVERS,
            ("prompts run / failed",) + cells(lambda s, f: f"{s.get('prompts_run', 0)} / {s.get('failed', 0)}"),
            ("median latency, end to end (s)",) + cells(lambda s, f: s.get("latency", {}).get("e2e", {}).get("median")),
            ("troughs VmRSS first / last (MiB)",) + cells(lambda s, f: trough_ends(f)),
            ("RSS growth at the troughs (MiB)",) + cells(lambda s, f: _mib(f.get("rss_growth"))),
            ("workload models alive at the end (census)",) + cells(lambda s, f: (f.get("census") or {}).get("alive")),
            ("workload rows in /memx/models at the end",) + cells(lambda s, f: (f.get("rows") or {}).get("rows")),
            ("tracebacks (comfy_memx)",) + cells(lambda s, f: f"{s.get('log', {}).get('tracebacks', 0)} "
                                                            f"({s.get('log', {}).get('comfy_memx_tracebacks', 0)})"),
            ("release receipts (released)",) + cells(lambda s, f: receipts(s))]
