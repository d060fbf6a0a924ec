"""The verdict: survivors of the receipts against the pack's held models, the census of both servers, every target
met or missed, the exit status and the summary table."""

from bench.soak.config import (LATENCY_TARGET, MIB, NET_CLASS_NAME, PACK_NAME, PERF_CHECK_MIN_PROMPTS,
                               RSS_TARGET_MIB_PER_100)
from bench.soak.measurements import format_value, median_ratio, paired_median_ratio


def is_pack_model(survivor):
    owner = survivor.get("owner") or {}
    return survivor.get("model") == NET_CLASS_NAME and owner.get("package") == PACK_NAME


def unexpected_survivors(receipt):
    """Survivors of a /memx/free receipt that are not models of the leaking pack (ComfyUI freed them)."""
    survivors = receipt.get("survivors") if isinstance(receipt, dict) else None
    return [s for s in survivors or [] if not is_pack_model(s)]


def check_final_survivors(receipt, prompt_items, held):
    """Compare the final receipt's survivors with the pack's held models.

    ``prompt_items`` maps the memx server's prompt ids to workload items; ``held`` is ``{slot: name}``. Each survivor
    is mapped through its owner's prompt to the (slot, name) that loaded it. Returns ``ok`` (exactly the held models
    survive, nothing else), and the ``unexpected`` / ``missing`` ones.
    """
    survivors = receipt.get("survivors") if isinstance(receipt, dict) else None
    if survivors is None:
        return {"ok": False, "error": "no survivors list in the receipt", "unexpected": [], "missing": sorted(held)}
    found, unexpected = {}, []
    for survivor in survivors:
        owner = survivor.get("owner") or {}
        item = prompt_items.get(owner.get("prompt_id"))
        label = {"model_id": survivor.get("model_id"), "model": survivor.get("model"), "reason": survivor.get("reason"),
                 "package": owner.get("package"), "prompt_index": item["index"] if item else None}
        if not is_pack_model(survivor) or item is None or "slot" not in item:
            unexpected.append(label)
            continue
        label.update(slot=item["slot"], name=item["name"])
        if held.get(item["slot"]) != item["name"] or item["slot"] in found:
            unexpected.append(label)
        else:
            found[item["slot"]] = label
    missing = sorted(set(held) - set(found))
    return {"ok": not unexpected and not missing, "survivors": len(survivors), "matched": sorted(found),
            "unexpected": unexpected, "missing": missing}


def census_from_history(entry):
    """The census record from a census prompt's history entry, or None."""
    for output in (entry or {}).get("outputs", {}).values():
        records = output.get("memx_soak_census") if isinstance(output, dict) else None
        if records:
            return records[0]
    return None


def compare_census(memx, plain, held, plain_ran=True):
    """Nothing kept alive by comfy_memx: memx's census shows exactly the held pack models and the same ComfyUI model
    object counts as the plain server's (without a plain server: no ModelPatcher or BaseModel alive at all)."""
    want = sorted(held.values())
    problems = []
    if not plain_ran and isinstance(memx, dict):
        for key in ("model_patchers", "base_models"):
            if memx.get(key) != 0:
                problems.append(f"{key}: memx {memx.get(key)} != 0 after the final free")
    for label, census in (("memx", memx), ("plain", plain)) if plain_ran else (("memx", memx),):
        if not isinstance(census, dict):
            problems.append(f"{label}: no census")
            continue
        if census.get("alive") != want:
            problems.append(f"{label}: pack models alive {census.get('alive')} != held {want}")
    if isinstance(memx, dict) and isinstance(plain, dict):
        for key in ("model_patchers", "base_models"):
            if memx.get(key) != plain.get(key):
                problems.append(f"{key}: memx {memx.get(key)} != plain {plain.get(key)}")
    return {"ok": not problems, "problems": problems, "memx": memx, "plain": plain, "held": want}



def evaluate(report, check):
    """The targets of a report: list of dicts ``name``, ``value``, ``limit``, ``met`` (True/False/None),
    ``hard`` and ``checked`` (whether it decides the exit status under ``--check``)."""
    memx, plain = report["servers"]["memx"], report["servers"]["plain"]
    plain_ran = not report.get("no_plain")
    comparison = report["comparison"]
    perf_checked = check and report["prompts"] >= PERF_CHECK_MIN_PROMPTS and plain_ran
    targets = Targets(check, perf_checked)
    add = targets.add

    ran = memx.get("prompts_run", 0)
    add("all prompts ran", f"{ran}/{report['prompts']}", report["prompts"],
        ran == report["prompts"] and (not plain_ran or plain.get("prompts_run", 0) == report["prompts"])
        and not report.get("error"), True, report.get("error"))
    add("failed prompts (comfy_memx)", memx.get("failed", 0), 0, memx.get("failed", 0) == 0, True)
    if plain_ran:
        add("failed prompts (plain, workload sanity)", plain.get("failed", 0), 0, plain.get("failed", 0) == 0, True)
    log = memx.get("log", {})
    bad_log = log.get("comfy_memx_tracebacks", 0) + len(log.get("internal_errors", []))
    add("comfy_memx tracebacks + internal errors", bad_log, 0, bad_log == 0, True)
    events = memx.get("events", {})
    add("event log valid", f"{events.get('valid', 0)}/{events.get('lines', 0)} lines",
        "all", events.get("lines", 0) > 0 and events.get("invalid", 0) == 0, True)
    errors = memx.get("polls", {}).get("server_errors", 0)
    add("comfy_memx route errors (5xx)", errors, 0, errors == 0, True)
    alive = report.get("kept_alive", {})
    add("nothing kept alive that ComfyUI freed", alive.get("summary"), "survivors == held pack models",
        alive.get("ok"), True)
    note = None if perf_checked else (
        "not measured (--no-plain)" if not plain_ran else f"reported only (checked at >= {PERF_CHECK_MIN_PROMPTS} prompts)")
    ratio = comparison.get("latency_ratio")
    limit = report.get("latency_target") or LATENCY_TARGET
    add("median latency memx / plain", None if ratio is None else round(ratio, 3), limit,
        None if ratio is None else ratio <= limit, False, note)
    growth = comparison.get("rss_growth_caused_mib_per_100")
    add("RSS growth caused by comfy_memx, MiB/100 prompts", None if growth is None else round(growth, 3),
        RSS_TARGET_MIB_PER_100, None if growth is None else growth <= RSS_TARGET_MIB_PER_100, False, note)
    return targets


class Targets(list):
    """The targets of a soak, in order, each a dict ``name``, ``value``, ``limit``, ``met`` (True/False/None),
    ``hard``, ``checked`` (whether it decides the exit status under ``--check``: a hard target always, a performance
    one only when ``perf_checked``) and ``note``."""

    def __init__(self, check, perf_checked):
        super().__init__()
        self.check, self.perf_checked = check, perf_checked

    def add(self, name, value, limit, met, hard=True, note=None):
        """Append one target."""
        self.append({"name": name, "value": value, "limit": limit, "met": met, "hard": hard,
                     "checked": self.check and (hard or self.perf_checked), "note": note})


def table_lines(rows):
    """``rows`` (the first one the header) in aligned columns, a rule under the header."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        lines.append("  ".join(str(cell).ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if number == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def target_lines(targets):
    """The summary's closing block: each target's verdict, figure, limit and note."""
    lines = ["", "targets:"]
    for target in targets:
        verdict = {True: "met", False: "MISSED", None: "n/a"}[target["met"]]
        note = f"  ({target['note']})" if target.get("note") else ""
        lines.append(f"  [{verdict:6}] {target['name']}: {format_value(target['value'])} (target {target['limit']}){note}")
    return lines


def exit_status(targets):
    return 1 if any(t["checked"] and t["met"] is not True for t in targets) else 0


def format_summary(report):
    """The readable summary: one table of per-server figures, then the targets."""
    memx, plain = report["servers"]["memx"], report["servers"]["plain"]
    comparison = report["comparison"]
    rows = [("figure", "memx", "plain (not run)" if report.get("no_plain") else "plain", "memx/plain")]

    def lat(server, key):
        return server.get("latency", {}).get(key, {}).get("median")

    def rss(server, key):
        value = server.get("rss", {}).get(key)
        return None if value is None else value / MIB

    rows += [
        ("prompts run / failed", f"{memx.get('prompts_run', 0)} / {memx.get('failed', 0)}",
         f"{plain.get('prompts_run', 0)} / {plain.get('failed', 0)}", ""),
        ("median latency, end to end (s)", format_value(lat(memx, "e2e")), format_value(lat(plain, "e2e")),
         format_value(comparison.get("latency_ratio"))),
        ("median ComfyUI execution time (s)", format_value(lat(memx, "exec")), format_value(lat(plain, "exec")),
         format_value(comparison.get("exec_ratio"))),
        ("median latency t2i / t2i+pack (s)",
         f"{format_value(lat(memx, 'e2e_t2i'))} / {format_value(lat(memx, 'e2e_t2i+pack'))}",
         f"{format_value(lat(plain, 'e2e_t2i'))} / {format_value(lat(plain, 'e2e_t2i+pack'))}",
         f"{format_value(comparison.get('latency_ratio_t2i'))} / {format_value(comparison.get('latency_ratio_t2i+pack'))}"),
        ("p90 latency, end to end (s)", format_value(memx.get("latency", {}).get("e2e", {}).get("p90")),
         format_value(plain.get("latency", {}).get("e2e", {}).get("p90")), ""),
        ("VmRSS first / last / max (MiB)",
         f"{format_value(rss(memx, 'first'), 0)} / {format_value(rss(memx, 'last'), 0)} / {format_value(rss(memx, 'max'), 0)}",
         f"{format_value(rss(plain, 'first'), 0)} / {format_value(rss(plain, 'last'), 0)} / {format_value(rss(plain, 'max'), 0)}", ""),
        ("VmRSS growth (MiB/100 prompts)", format_value(memx.get("rss", {}).get("growth_mib_per_100")),
         format_value(plain.get("rss", {}).get("growth_mib_per_100")),
         "caused " + format_value(comparison.get("rss_growth_caused_mib_per_100"))),
        ("RssAnon growth (MiB/100 prompts)", format_value(memx.get("rss", {}).get("anon_growth_mib_per_100")),
         format_value(plain.get("rss", {}).get("anon_growth_mib_per_100")),
         "caused " + format_value(comparison.get("anon_growth_caused_mib_per_100"))),
        ("tracebacks (comfy_memx) / internal errors",
         f"{memx.get('log', {}).get('tracebacks', 0)} ({memx.get('log', {}).get('comfy_memx_tracebacks', 0)})"
         f" / {len(memx.get('log', {}).get('internal_errors', []))}",
         f"{plain.get('log', {}).get('tracebacks', 0)}", ""),
        ("ComfyUI leak warnings / comfy_memx leak lines",
         f"{memx.get('log', {}).get('comfyui_leak_warnings', 0)} / {memx.get('log', {}).get('comfy_memx_leak_lines', 0)}",
         f"{plain.get('log', {}).get('comfyui_leak_warnings', 0)} / -", ""),
    ]
    events = memx.get("events", {})
    by_event = events.get("by_event", {})
    rows.append(("event log lines / KiB / invalid",
                 f"{events.get('lines', 0)} / {events.get('bytes', 0) / 1024:.0f} / {events.get('invalid', 0)}", "-", ""))
    rows.append(("events leak / leak_seen / load / unload",
                 f"{by_event.get('leak', 0)} / {by_event.get('leak_seen', 0)} / {by_event.get('load', 0)} / "
                 f"{by_event.get('unload', 0)}", "-", ""))
    polls = memx.get("polls", {})
    rows.append(("polls /memx/models, /metrics (max s)",
                 f"{polls.get('models', {}).get('count', 0)} ({format_value(polls.get('models', {}).get('max_s'))}), "
                 f"{polls.get('metrics', {}).get('count', 0)} ({format_value(polls.get('metrics', {}).get('max_s'))})",
                 f"{plain.get('polls', {}).get('models', {}).get('count', 0)}, "
                 f"{plain.get('polls', {}).get('metrics', {}).get('count', 0)}", ""))
    frees = memx.get("frees", {})
    rows.append(("/memx/free during prompts: 200 / 202 / other",
                 f"{frees.get('status', {}).get('200', 0)} / {frees.get('status', {}).get('202', 0)} / "
                 f"{sum(v for k, v in frees.get('status', {}).items() if k not in ('200', '202'))}",
                 f"/free: {plain.get('frees', {}).get('count', 0)}", ""))
    lines = [f"soak: ComfyUI {report.get('comfyui_version')} ({report['comfyui']}), comfy_memx "
             f"{memx.get('log', {}).get('comfy_memx_version')}, leak mode {report['leak_mode']}, "
             f"{report['prompts']} prompts per server, {format_value(report.get('wall_s'), 0)} s, load average "
             f"{format_value(report.get('loadavg_1m_during', {}).get('median'), 1)} (median of 1-min samples)"]
    return "\n".join(lines + table_lines(rows) + target_lines(report["targets"]))


def compare(servers):
    comparison = {}
    if len(servers) != 2:
        return comparison
    memx, plain = servers
    ok_pairs = [(a, b) for a, b in zip(memx.records, plain.records) if a["ok"] and b["ok"]]
    comparison["pairs"] = len(ok_pairs)
    comparison["latency_ratio"] = median_ratio([a.get("e2e_s") for a, _ in ok_pairs],
                                               [b.get("e2e_s") for _, b in ok_pairs])
    comparison["latency_ratio_paired"] = paired_median_ratio([a.get("e2e_s") for a, _ in ok_pairs],
                                                             [b.get("e2e_s") for _, b in ok_pairs])
    comparison["exec_ratio"] = median_ratio([a.get("exec_s") for a, _ in ok_pairs], [b.get("exec_s") for _, b in ok_pairs])
    for kind in ("t2i", "t2i+pack"):
        comparison[f"latency_ratio_{kind}"] = median_ratio(
            [a.get("e2e_s") for a, _ in ok_pairs if a["kind"] == kind],
            [b.get("e2e_s") for _, b in ok_pairs if b["kind"] == kind])
    return comparison


def kept_alive_verdict(report, finals, workload, servers, held):
    if not finals or not servers:
        return {"ok": False, "summary": "no final check (the run stopped early)"}
    memx = servers[0]
    items = {pid: workload[index] for pid, index in memx.prompt_ids.items() if index < len(workload)}
    survivors = check_final_survivors(finals.get("receipt"), items, held)
    census = compare_census(finals.get("census_memx"), finals.get("census_plain"), held, plain_ran=len(servers) > 1)
    midrun = report["servers"]["memx"].get("frees", {}).get("unexpected_survivors", 0)
    receipt_done = finals.get("free_status") == 200 and (finals.get("receipt") or {}).get("status") == "done"
    ok = survivors["ok"] and census["ok"] and midrun == 0 and receipt_done
    parts = [f"final survivors {survivors.get('survivors')} (held {len(held)}, unexpected "
             f"{len(survivors.get('unexpected', []))}, missing {len(survivors.get('missing', []))})",
             f"census {'equal' if census['ok'] else 'DIFFERS'}", f"mid-run unexpected {midrun}"]
    if not receipt_done:
        parts.append(f"final /memx/free {finals.get('free_status')} {(finals.get('receipt') or {}).get('status')}")
    return {"ok": ok, "summary": "; ".join(parts), "final_survivors": survivors, "census": census,
            "midrun_unexpected_survivors": midrun, "final_receipt_done": receipt_done}


def compare_rss(report):
    comparison = report["comparison"]
    memx, plain = report["servers"]["memx"], report["servers"]["plain"]
    for key, out in (("growth_mib_per_100", "rss_growth_caused_mib_per_100"),
                     ("anon_growth_mib_per_100", "anon_growth_caused_mib_per_100")):
        a, b = memx.get("rss", {}).get(key), plain.get("rss", {}).get(key)
        comparison[out] = None if a is None or b is None else a - b
