"""The ``release`` soak: four real ComfyUI servers side by side on the release pack's workload, to show what
comfy_memx's ``auto`` release does to a pack that keeps every model it builds.

The servers (``RELEASE_SERVERS``), all of the same tree, each with a copy of ``bench/harness/memx_release_nodes`` in
its ``custom_nodes/``:

* ``plain``: ``python main.py``, no comfy_memx, the pack as written (it keeps every model): the latency baseline;
* ``fixed``: ``python main.py``, no comfy_memx, the pack with ``MEMX_RELEASE_NODES_CACHE=off`` (it keeps nothing: the
  pack once its author fixed the leak): ComfyUI's own RSS growth on the same workflow, the memory baseline;
* ``off``: ``python -m comfy_memx main.py``, leak mode strict, ``COMFY_MEMX_RELEASE=off``;
* ``auto``: the same with ``COMFY_MEMX_RELEASE=auto`` and ``COMFY_MEMX_RELEASE_PACKAGES=memx_release_nodes``.

Prompt ``i`` of :func:`~bench.soak.release_workload.build_release_workload` runs on every server, one server at a
time, the order rotating by one server per prompt (so that order effects cancel). After each prompt: its latency
(end to end as the client sees it, and ComfyUI's own execution time), the server's VmRSS/RssAnon, and the SHA-256 of
the PNG file ComfyUI's ``SaveImage`` wrote. At the end: the pack's census prompt on every server (which of its
modules are alive, by ``WeakSet``), ``GET /memx/models`` on the comfy_memx servers, then every server is stopped; the
server logs are scanned for tracebacks and the event logs for ``release`` receipts.
"""

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time

from bench.harness import drive
from bench.soak.config import (RELEASE_CACHE_SWITCH, RELEASE_LAG, RELEASE_PACK_NAME,
                               RELEASE_PACK_SOURCE, RELEASE_SAVE_ID, RELEASE_SERVERS)
from bench.soak.measurements import describe, read_proc_memory, scan_log, thin, validate_event_file
from bench.soak.release_workload import build_release_workload, model_bytes, release_census_prompt
from bench.soak.servers import SoakProcess, pick_ports, run_prompt, run_workload, start_servers, stop_servers

HISTORY_POLL_S = 0.02   # the prompts take a few tenths of a second: poll their history finely


def prepare_release_base(base):
    """A ComfyUI base folder with the release pack in ``custom_nodes``; returns ComfyUI's arguments for it."""
    for name in ("custom_nodes", "input", "output", "temp", "user"):
        os.makedirs(os.path.join(base, name), exist_ok=True)
    shutil.copytree(RELEASE_PACK_SOURCE, os.path.join(base, "custom_nodes", RELEASE_PACK_NAME), dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return ["--base-directory", base, "--database-url", "sqlite:///" + os.path.join(base, "user", "comfyui.db")]


def server_env(label, leak_mode, events_path):
    """The environment variables that make server ``label`` what the module docstring says it is."""
    if label == "plain":
        return {}
    if label == "fixed":
        return {RELEASE_CACHE_SWITCH: "off"}
    env = {"COMFY_MEMX_LEAK_MODE": leak_mode, "COMFY_MEMX_EVENTS": events_path, "COMFY_MEMX_RELEASE": label}
    if label == "auto":
        env["COMFY_MEMX_RELEASE_PACKAGES"] = RELEASE_PACK_NAME
    return env


class ReleaseServer(SoakProcess):
    """One server of the release soak: its ComfyUI process, prompt records, after-prompt RSS and image hashes."""

    def __init__(self, label, options, base, port):
        self.label = label
        self.base = base
        self.port = port
        self.memx = label in ("off", "auto")
        self.events_path = os.path.join(base, "events.jsonl") if self.memx else None
        self.records = []
        self.rss_after = []       # (prompt_index, VmRSS, RssAnon)
        self.images = []          # sha256 of each prompt's saved PNG (None when missing)
        self.prompt_ids = {}
        comfy_args = prepare_release_base(base)
        argv, extra = drive.server_command(options.python, os.path.abspath(options.comfyui),
                                           "module" if self.memx else "plain", port, comfy_args)
        env = drive.inherited_env()
        env.pop(RELEASE_CACHE_SWITCH, None)
        env.update(extra)
        env.update(server_env(label, options.leak_mode, self.events_path))
        env["PYTHONUNBUFFERED"] = "1"
        self.env_set = {k: v for k, v in env.items() if k.startswith(("COMFY_MEMX", "MEMX_"))}
        self.launch(argv, env, options, base, port, self.events_path)

    def image_hash(self, entry):
        """SHA-256 of the PNG file the prompt's SaveImage wrote (read from this server's output folder), or None."""
        images = ((entry or {}).get("outputs", {}).get(RELEASE_SAVE_ID) or {}).get("images") or []
        if not images:
            return None
        image = images[0]
        path = os.path.join(self.base, "output", image.get("subfolder") or "", image.get("filename") or "")
        try:
            with open(path, "rb") as handle:
                return hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            return None


def release_events(path):
    """The ``release`` receipts of an event log, summed up: counts by outcome, trigger, pattern and method, how
    many models died, the bytes released, and a few examples (every receipt's fields but the memory figures)."""
    summary = {"count": 0, "by_outcome": {}, "by_trigger": {}, "by_pattern": {}, "by_method": {}, "died": 0,
               "released_bytes": 0, "other_entries_dropped": 0, "examples": [], "not_released": []}
    if not path or not os.path.exists(path):
        return summary
    with open(path, "rb") as handle:
        for raw in handle:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(event, dict) or event.get("event") != "release":
                continue
            summary["count"] += 1
            for key, field in (("by_outcome", "outcome"), ("by_trigger", "trigger"), ("by_pattern", "pattern"),
                               ("by_method", "method")):
                value = str(event.get(field))
                summary[key][value] = summary[key].get(value, 0) + 1
            if event.get("died"):
                summary["died"] += 1
            if event.get("outcome") == "released":
                summary["released_bytes"] += int(event.get("bytes") or 0)
            summary["other_entries_dropped"] += int(event.get("other_entries_dropped") or 0)
            brief = {k: event.get(k) for k in ("model_id", "trigger", "outcome", "package", "pattern", "cut", "method",
                                               "other_entries_dropped", "died", "reason")}
            if len(summary["examples"]) < 8:
                summary["examples"].append(brief)
            if event.get("outcome") != "released" and len(summary["not_released"]) < 20:
                summary["not_released"].append(brief)
    return summary


def census_of(entry):
    """The release pack's census record from a census prompt's history entry, or None."""
    for output in (entry or {}).get("outputs", {}).values():
        records = output.get("memx_release_census") if isinstance(output, dict) else None
        if records:
            return records[0]
    return None


def sample_loadavg(stop, samples, interval=5.0):
    """Append the 1-minute load average to ``samples`` every ``interval`` seconds until ``stop`` is set."""
    while not stop.wait(interval):
        samples.append(os.getloadavg()[0])


def release_report(options, workload):
    """The release soak's report before the run: the workload, its servers and their order."""
    return {"tool": "bench.soak --workload release", "comfyui": os.path.abspath(options.comfyui),
            "python": options.python, "prompts": options.prompts, "leak_mode": options.leak_mode, "error": None,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": os.getloadavg(),
            "workload": {"workload": "release", "pack": RELEASE_PACK_NAME, "reuse_every": options.reuse_every,
                         "features": options.features, "depth": options.depth,
                         "model_bytes": model_bytes(options.features, options.depth), "lag": RELEASE_LAG,
                         "warmup": options.warmup, "servers": list(RELEASE_SERVERS),
                         "leak_prompts": sum(1 for item in workload if item["kind"] == "leak"),
                         "reuse_prompts": sum(1 for item in workload if item["kind"] == "reuse"),
                         "order": "prompt i runs on every server, one at a time, the order rotated by i"},
            "servers": {}}


class _ReleasePlan:
    """How the release soak runs a prompt: on every server, the order rotated by the prompt's index; the image
    hash and the RSS after each prompt."""

    def __init__(self, servers):
        self.servers = servers

    def order(self, item):
        shift = item["index"] % len(self.servers)
        return self.servers[shift:] + self.servers[:shift]

    def run(self, server, item, prompt_deadline):
        record, entry = run_prompt(server, item, prompt_deadline, poll=HISTORY_POLL_S)
        record["image"] = server.image_hash(entry) if record["ok"] else None
        server.records.append(record)
        server.images.append(record["image"])
        vmrss, anon = read_proc_memory(server.pid)
        server.rss_after.append((item["index"], vmrss, anon))

    def progress(self):
        return ", ".join(f"{s.label} {s.records[-1].get('e2e_s') or 0:.2f} s "
                         f"{(s.rss_after[-1][1] or 0) / 2 ** 20:.0f} MiB" for s in self.servers)


def run_release_soak(options, log=print):
    """Run the release soak (see the module docstring); returns the report (the servers are always stopped)."""
    wall_start = time.monotonic()
    deadline = wall_start + options.timeout
    workload = build_release_workload(options.prompts, options.reuse_every, features=options.features,
                                      depth=options.depth)
    report = release_report(options, workload)
    work = options.work_dir or tempfile.mkdtemp(prefix="memx-release-soak-")
    os.makedirs(work, exist_ok=True)
    report["work_dir"] = work
    servers = []
    loadavg = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_loadavg, args=(stop, loadavg), daemon=True)
    finals = {}
    try:
        for label, port in zip(RELEASE_SERVERS, pick_ports(len(RELEASE_SERVERS), options.port_base)):
            servers.append(ReleaseServer(label, options, os.path.join(work, label), port))
        start_servers(servers, options, deadline, log)
        report["comfyui_version"] = (servers[0].stats or {}).get("system", {}).get("comfyui_version")
        sampler.start()
        clock = time.monotonic()
        run_workload(workload, options, deadline, report, clock, log, _ReleasePlan(servers))
        report["prompts_s"] = round(time.monotonic() - clock, 1)
        finals = final_checks(servers, options, deadline)
    except (Exception, KeyboardInterrupt, SystemExit) as error:   # record it; the servers are still stopped below
        report["error"] = f"{type(error).__name__}: {error}"
        report["interrupted"] = not isinstance(error, Exception)
    finally:
        stop.set()
        stop_servers(servers, report)
    report["wall_s"] = round(time.monotonic() - wall_start, 1)
    report["loadavg_end"] = os.getloadavg()
    report["loadavg_1m_during"] = describe(loadavg)
    for server in servers:
        report["servers"][server.label] = summarize_release_server(server, finals.get(server.label, {}))
    report["per_prompt"] = per_prompt_table(workload, servers)
    report["workload_items"] = [{k: item[k] for k in ("index", "kind", "loader", "key", "origin")}
                                for item in workload]
    return report


def final_checks(servers, options, deadline):
    """The census prompt on every server, then ``GET /memx/models`` on the comfy_memx ones."""
    finals = {}
    nonce = options.prompts + 1
    for server in servers:
        result = finals.setdefault(server.label, {})
        item = {"index": nonce, "kind": "census", "prompt": release_census_prompt(nonce)}
        record, entry = run_prompt(server, item, time.monotonic() + max(5.0, min(120.0, deadline - 60.0
                                                                                 - time.monotonic())))
        result["census"] = census_of(entry) if record["ok"] else None
        if not record["ok"]:
            result["census_error"] = record.get("error")
        if server.memx:
            status, rows = drive.http_call("GET", f"{server.url}/memx/models", timeout=30.0)
            if status == 200 and isinstance(rows, list):
                leaked = [r for r in rows if isinstance(r, dict) and r.get("state") == "leaked"]
                result["models_after"] = {"rows": len(rows), "leaked": len(leaked),
                                          "leaked_release": [r.get("release") for r in leaked][:5]}
            else:
                result["models_after"] = {"status": status}
    return finals


def summarize_release_server(server, final):
    """One server's figures for the report (the verdict reads them)."""
    records = server.records
    ok = [r for r in records if r["ok"]]
    summary = {
        "command": server.argv, "env": server.env_set, "port": server.port, "pid": server.pid,
        "boot_s": None if server.boot_s is None else round(server.boot_s, 2),
        "prompts_run": len(records), "failed": len(records) - len(ok),
        "failures": [{"index": r["index"], "error": r.get("error")} for r in records if not r["ok"]][:10],
        "missing_images": sum(1 for r in ok if not r.get("image")),
        "images": list(server.images),
        "latency": {"e2e": describe([r.get("e2e_s") for r in ok]), "exec": describe([r.get("exec_s") for r in ok])},
        "e2e_s": [None if r.get("e2e_s") is None else round(r["e2e_s"], 4) for r in records],
        "exec_s": [r.get("exec_s") for r in records],
        "rss_after": [list(sample) for sample in server.rss_after],
        "log_path": server.log_path,
        "log": scan_log(drive.read_text(server.log_path)),
        "census": final.get("census"), "census_error": final.get("census_error"),
    }
    summary["rss_after_thinned"] = thin(summary["rss_after"], 600)
    if server.memx:
        summary["events"] = validate_event_file(server.events_path)
        summary["releases"] = release_events(server.events_path)
        summary["models_after"] = final.get("models_after")
    return summary


def per_prompt_table(workload, servers):
    """Per prompt: its kind, key and each server's image hash (short) and end-to-end seconds."""
    rows = []
    for position, item in enumerate(workload):
        row = {"index": item["index"], "kind": item["kind"], "key": item["key"], "origin": item["origin"]}
        for server in servers:
            if position < len(server.records):
                record = server.records[position]
                row[server.label] = {"image": record.get("image"), "e2e_s": record.get("e2e_s"), "ok": record["ok"]}
        rows.append(row)
    return rows
