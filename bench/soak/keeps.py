"""The ``pack-keeps`` soak: packs that keep ComfyUI's own ``(model, clip, vae)`` under a new key every prompt, on
three real ComfyUI servers of one tree, to show what comfy_memx's ``auto`` release gives back between frees.

The servers (``KEEPS_SERVERS``), each with a copy of ``bench/harness/memx_keeps_nodes`` (and, with ``--inspire``,
ltdrdata's ComfyUI-Inspire-Pack, unmodified) in its ``custom_nodes/``:

* ``plain``: ``python main.py``, no comfy_memx, the packs' caches off (``MEMX_KEEPS_NODES_CACHE=off``; Inspire-Pack's
  loader, which has no such switch, replaced by the pack's dict loader in plain's prompts): ComfyUI's own RSS on
  the same workflow, the memory baseline;
* ``off``: ``python -m comfy_memx main.py``, leak mode ``--leak-mode``, ``COMFY_MEMX_RELEASE=off``: the packs keep
  everything they load;
* ``auto``: the same with ``COMFY_MEMX_RELEASE=auto`` and ``COMFY_MEMX_RELEASE_PACKAGES`` naming the packs.

Prompt ``i`` of :func:`~bench.soak.keeps_workload.build_keeps_workload` runs on every server, one server at a time,
the order rotating by one server per prompt (``--sequential``: one server after the other, each running the whole
workload alone, for checkpoints too large to keep on three servers at once). After each prompt: its latency, the
server's VmRSS/RssAnon and the SHA-256 of the PNG ComfyUI's ``SaveImage`` wrote; after every prompt marked
``free_after`` a free (``POST /memx/free`` on the comfy_memx servers, which waits for the worker and answers a
receipt; ComfyUI's ``POST /free`` on plain) and the RSS once it settled after it (the trough of the free cycle). At
the end of a server's workload (whose last prompt is followed by a free): on ``auto`` a wait while releases it
queued for ComfyUI's worker are still pending in ``/memx/models`` and their number moves (no prompt comes to wake
the worker), then the pack's census prompt (which modules it witnessed are alive, after a full collection),
``GET /memx/models`` on the comfy_memx servers, then the server is stopped; the logs are scanned for tracebacks
and the event logs for ``release`` receipts.
"""

import hashlib
import os
import shutil
import tarfile
import tempfile
import threading
import time

from bench.harness import drive
from bench.soak.config import (FREE_ALL, INSPIRE_PACK_NAME, KEEPS_CACHE_SWITCH, KEEPS_CHECKPOINT_NAME,
                               KEEPS_PACK_NAME, KEEPS_PACK_SOURCE, KEEPS_SAVE_ID, KEEPS_SERVERS,
                               KEEPS_TEXT_CHECKPOINT_NAME)
from bench.soak.keeps_workload import build_keeps_workload, entries_to_release, held_keys, keeps_census_prompt
from bench.soak.measurements import describe, read_proc_memory, scan_log, validate_event_file
from bench.soak.release import release_events, sample_loadavg
from bench.soak.servers import (SoakProcess, default_cache_dir, pick_ports, run_prompt, run_workload, start_servers,
                                stop_servers)

HISTORY_POLL_S = 0.02
FREE_TIMEOUT_S = 120.0
SETTLE_QUIET_S, SETTLE_BOUND_S, SETTLE_POLL_S = 1.5, 30.0, 0.1   # the RSS after a free: quiet this long, at most
SETTLE_TOLERANCE = 2 * 1024 ** 2                                  # that long in all, sampled this often
RELEASE_STALL_S, RELEASE_POLL_S = 30.0, 0.5   # after the last free: auto's queued releases, waited for while moving


def unpack_inspire(source, work):
    """The Inspire-Pack folder to copy into each server: ``source`` itself when it is a folder, else the ``.tar.xz``
    archive unpacked once into ``work`` (its one top folder, ``ComfyUI-Inspire-Pack``)."""
    if os.path.isdir(source):
        return os.path.abspath(source)
    target = os.path.join(work, "packs")
    os.makedirs(target, exist_ok=True)
    with tarfile.open(source, "r:*") as archive:
        archive.extractall(target, filter="data")
    folder = os.path.join(target, INSPIRE_PACK_NAME)
    if not os.path.isfile(os.path.join(folder, "__init__.py")):
        raise RuntimeError(f"--inspire {source}: no {INSPIRE_PACK_NAME}/__init__.py in the archive")
    return folder


def ensure_keeps_checkpoints(options, log, timeout=900.0):
    """``(kept, text, built_seconds)``: the checkpoint the packs load (``--checkpoint``, else the small one without
    CLIP) and the one the shared text encoder comes from (the small one with CLIP), built into the soak's cache
    folder with make_checkpoint.py when absent."""
    started = time.monotonic()
    cache = default_cache_dir()
    tree = os.path.abspath(options.comfyui)
    text = os.path.join(cache, drive.SMALL_CHECKPOINT_NAME)
    if not os.path.isfile(text):
        log(f"building the small checkpoint {text} with {options.python} (about 20 s) ...")
    drive.ensure_checkpoint(options.python, tree, text, timeout=timeout, arch="small", clip=True)
    if options.checkpoint:
        kept = os.path.abspath(options.checkpoint)
    else:
        kept = os.path.join(cache, drive.SMALL_NO_CLIP_CHECKPOINT_NAME)
        if not os.path.isfile(kept):
            log(f"building the small checkpoint without CLIP {kept} ...")
        drive.ensure_checkpoint(options.python, tree, kept, timeout=timeout, arch="small", clip=False)
    return kept, text, time.monotonic() - started


def prepare_keeps_base(base, tree, packs, checkpoints):
    """A ComfyUI base folder with ``packs`` (folders) in ``custom_nodes`` and ``checkpoints`` (``{name: file}``)
    linked into ``models/checkpoints``; returns ComfyUI's arguments for it: that base folder, and no prompt in the
    saved PNGs (plain's prompts name another loader for Inspire-Pack's, and the files must compare by pixels)."""
    for name in drive.BASE_SUBDIRS:
        os.makedirs(os.path.join(base, name), exist_ok=True)
    for pack in packs:
        shutil.copytree(pack, os.path.join(base, "custom_nodes", os.path.basename(os.path.normpath(pack))),
                        dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, path in checkpoints.items():
        link = os.path.join(base, "models", "checkpoints", name)
        if not os.path.lexists(link):
            os.symlink(os.path.abspath(path), link)
    return drive.base_dir_args(tree, base) + ["--disable-metadata"]


def keeps_packages(inspire):
    """The packages whose caches ``auto`` may cut (``COMFY_MEMX_RELEASE_PACKAGES``)."""
    return ",".join([KEEPS_PACK_NAME] + ([INSPIRE_PACK_NAME] if inspire else []))


def keeps_server_env(label, leak_mode, events_path, inspire, settings=()):
    """The environment variables that make server ``label`` what the module docstring says it is (the comfy_memx
    ones also get ``settings``, ``(name, value)`` pairs of ``--memx-env``)."""
    if label == "plain":
        return {KEEPS_CACHE_SWITCH: "off"}
    env = {"COMFY_MEMX_LEAK_MODE": leak_mode, **dict(settings), "COMFY_MEMX_EVENTS": events_path,
           "COMFY_MEMX_RELEASE": label}
    if label == "auto":
        env["COMFY_MEMX_RELEASE_PACKAGES"] = keeps_packages(inspire)
    return env


class KeepsServer(SoakProcess):
    """One server of the pack-keeps soak: its ComfyUI process, prompt records, RSS after each prompt and free,
    image hashes and free receipts."""

    def __init__(self, label, options, base, port, packs, checkpoints):
        self.label = label
        self.base = base
        self.port = port
        self.memx = label != "plain"
        self.events_path = os.path.join(base, "events.jsonl") if self.memx else None
        self.records = []
        self.rss_after = []        # (prompt_index, VmRSS, RssAnon) after each prompt
        self.rss_after_free = []   # (prompt_index, VmRSS, RssAnon) once settled after the free that followed it
        self.census_rss = None     # (VmRSS, RssAnon) after the census prompt
        self.images = []
        self.frees = []
        self.prompt_ids = {}
        tree = os.path.abspath(options.comfyui)
        comfy_args = prepare_keeps_base(base, tree, packs, checkpoints)
        argv, extra = drive.server_command(options.python, tree, "module" if self.memx else "plain", port,
                                           comfy_args)
        env = drive.inherited_env()
        env.pop(KEEPS_CACHE_SWITCH, None)
        env.update(extra)
        env.update(keeps_server_env(label, options.leak_mode, self.events_path, bool(options.inspire),
                                    getattr(options, "memx_env", ())))
        env["PYTHONUNBUFFERED"] = "1"
        self.env_set = {k: v for k, v in env.items() if k.startswith(("COMFY_MEMX", "MEMX_"))}
        self.launch(argv, env, options, base, port, self.events_path)

    def image_hash(self, entry):
        """SHA-256 of the PNG file the prompt's SaveImage wrote (read from this server's output folder), or None."""
        images = ((entry or {}).get("outputs", {}).get(KEEPS_SAVE_ID) or {}).get("images") or []
        if not images:
            return None
        path = os.path.join(self.base, "output", images[0].get("subfolder") or "", images[0].get("filename") or "")
        try:
            with open(path, "rb") as handle:
                return hashlib.sha256(handle.read()).hexdigest()
        except OSError:
            return None

    def free(self, index):
        """A free after prompt ``index``: ``/memx/free`` (waiting for the worker) or ComfyUI's ``/free``; records
        the receipt's figures and the RSS right after it."""
        started = time.monotonic()
        if self.memx:
            status, body = drive.http_call("POST", f"{self.url}/memx/free?timeout={FREE_TIMEOUT_S:g}", dict(FREE_ALL),
                                           timeout=FREE_TIMEOUT_S + 60.0)
        else:
            status, body = drive.http_call("POST", f"{self.url}/free", dict(FREE_ALL), timeout=30.0)
        record = {"index": index, "status": status, "s": round(time.monotonic() - started, 3)}
        if self.memx and isinstance(body, dict):
            record.update(receipt_brief(body))
        elif status == 0 or status >= 400:
            record["error"] = str(body)[:300]
        vmrss, anon, record["rss_settled"] = settled_memory(self.pid)
        self.frees.append(record)
        self.rss_after_free.append((index, vmrss, anon))


def settled_memory(pid, quiet_s=SETTLE_QUIET_S, bound_s=SETTLE_BOUND_S, tolerance=SETTLE_TOLERANCE):
    """``(VmRSS, RssAnon, settled)`` of process ``pid`` once its VmRSS has stayed within ``tolerance`` bytes for
    ``quiet_s`` seconds (a free's unloads, cache reset and collection have run their course; ComfyUI's own ``/free``
    answers before its worker acts), or after ``bound_s`` seconds of change with ``settled`` false."""
    started = time.monotonic()
    vmrss, anon = read_proc_memory(pid)
    quiet_since = started
    while vmrss is not None and time.monotonic() - started < bound_s:
        time.sleep(SETTLE_POLL_S)
        now_rss, now_anon = read_proc_memory(pid)
        if now_rss is None:
            break
        if abs(now_rss - vmrss) > tolerance:
            quiet_since = time.monotonic()
        vmrss, anon = now_rss, now_anon
        if time.monotonic() - quiet_since >= quiet_s:
            return vmrss, anon, True
    return vmrss, anon, False


def receipt_brief(receipt):
    """The figures of a ``/memx/free`` receipt the soak keeps: status, what was freed, the survivors (by holder
    package and how they were found) and the releases it ran."""
    survivors = [row for row in receipt.get("survivors") or [] if isinstance(row, dict)]
    return {"receipt_status": receipt.get("status"), "waited_s": receipt.get("waited_s"),
            "freed": len(receipt.get("freed") or []), "survivors": len(survivors),
            "survivor_bytes": receipt.get("survivor_bytes"),
            "survivor_holders": sorted({str(((row.get("leak") or {}).get("holder") or {}).get("package"))
                                        for row in survivors}),
            "releases": len(receipt.get("releases") or []), "release_bytes": receipt.get("release_bytes")}


class _KeepsPlan:
    """How the soak runs a prompt on a server: plain its plain prompt; the image hash, the RSS after it, and the
    free (with the RSS after it) where the prompt is marked ``free_after``; the order of the servers rotated by the
    prompt's index."""

    def __init__(self, servers):
        self.servers = servers

    def order(self, item):
        shift = item["index"] % len(self.servers)
        return self.servers[shift:] + self.servers[:shift]

    def run(self, server, item, prompt_deadline):
        run_item = item if server.memx else dict(item, prompt=item["plain_prompt"])
        record, entry = run_prompt(server, run_item, prompt_deadline, poll=HISTORY_POLL_S)
        record["image"] = server.image_hash(entry) if record["ok"] else None
        server.records.append(record)
        server.images.append(record["image"])
        vmrss, anon = read_proc_memory(server.pid)
        server.rss_after.append((item["index"], vmrss, anon))
        if item["free_after"]:
            server.free(item["index"])

    def progress(self):
        return ", ".join(f"{s.label} {s.records[-1].get('e2e_s') or 0:.2f} s "
                         f"{(s.rss_after[-1][1] or 0) / 2 ** 20:.0f} MiB" for s in self.servers if s.records)


def keeps_report(options, workload, loaders):
    """The pack-keeps soak's report before the run: the workload, its servers and their order."""
    return {"tool": "bench.soak --workload pack-keeps", "comfyui": os.path.abspath(options.comfyui),
            "python": options.python, "prompts": options.prompts, "leak_mode": options.leak_mode, "error": None,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": os.getloadavg(),
            "workload": {"workload": "pack-keeps", "packs": keeps_packages(options.inspire).split(","),
                         "loaders": list(loaders), "free_every": options.free_every,
                         "frees": sum(1 for item in workload if item["free_after"]),
                         "servers": list(KEEPS_SERVERS), "sequential": bool(options.sequential),
                         "memx_env": dict(getattr(options, "memx_env", ())),
                         "held_at_end_without_release": len(held_keys(workload)),
                         "entries_to_release": entries_to_release(workload),
                         "order": "one server after the other, each running every prompt" if options.sequential
                         else "prompt i runs on every server, one at a time, the order rotated by i"},
            "servers": {}}


def keeps_loaders(options):
    """The loaders the prompts take in turn: the pack's dict and lru_cache loaders, and Inspire-Pack's with
    ``--inspire``."""
    return ("dict", "lru", "inspire") if options.inspire else ("dict", "lru")


def run_keeps_soak(options, log=print):
    """Run the pack-keeps soak (see the module docstring); returns the report (the servers are always stopped)."""
    wall_start = time.monotonic()
    deadline = wall_start + options.timeout
    loaders = keeps_loaders(options)
    workload = build_keeps_workload(options.prompts, loaders, options.free_every)
    report = keeps_report(options, workload, loaders)
    work = options.work_dir or tempfile.mkdtemp(prefix="memx-keeps-soak-")
    os.makedirs(work, exist_ok=True)
    report["work_dir"] = work
    servers, finals, loadavg = [], {}, []
    stop = threading.Event()
    sampler = threading.Thread(target=sample_loadavg, args=(stop, loadavg), daemon=True)
    try:
        kept, text, built_s = ensure_keeps_checkpoints(options, log, min(900.0, deadline - time.monotonic()))
        report.update(checkpoint=kept, text_checkpoint=text, checkpoint_build_s=round(built_s, 1))
        packs = [KEEPS_PACK_SOURCE] + ([unpack_inspire(options.inspire, work)] if options.inspire else [])
        checkpoints = {KEEPS_CHECKPOINT_NAME: kept, KEEPS_TEXT_CHECKPOINT_NAME: text}
        for label, port in zip(KEEPS_SERVERS, pick_ports(len(KEEPS_SERVERS), options.port_base)):
            servers.append(KeepsServer(label, options, os.path.join(work, label), port, packs, checkpoints))
        sampler.start()
        groups = [[server] for server in servers] if options.sequential else [servers]
        for group in groups:
            _run_group(group, workload, options, deadline, report, log, finals)
    except (Exception, KeyboardInterrupt, SystemExit) as error:   # record it; the servers are still stopped below
        report["error"] = f"{type(error).__name__}: {error}"
        report["interrupted"] = not isinstance(error, Exception)
    finally:
        stop.set()
        stop_servers([server for server in servers if server.comfy.alive()], report)   # those a failure left
    report["wall_s"] = round(time.monotonic() - wall_start, 1)
    report["loadavg_end"] = os.getloadavg()
    report["loadavg_1m_during"] = describe(loadavg)
    for server in servers:
        report["servers"][server.label] = summarize_keeps_server(server, finals.get(server.label, {}))
    report["workload_items"] = [{k: item[k] for k in ("index", "loader", "key", "free_after")} for item in workload]
    return report


def _run_group(group, workload, options, deadline, report, log, finals):
    """Start the servers of ``group``, run the workload on them, run their final checks, stop them."""
    try:
        start_servers(group, options, deadline, log)
        report.setdefault("comfyui_version", (group[0].stats or {}).get("system", {}).get("comfyui_version"))
        clock = time.monotonic()
        run_workload(workload, options, deadline, report, clock, log, _KeepsPlan(group))
        report.setdefault("prompts_s", {})["+".join(s.label for s in group)] = round(time.monotonic() - clock, 1)
        for server in group:
            finals[server.label] = final_checks(server, options, deadline)
    finally:
        stop_servers(group, report)


def pending_releases(rows, prompt_ids):
    """The ``/memx/models`` rows of workload models that ``auto`` is still to release: leaked, releasable, never
    tried (comfy_memx queues each such release for ComfyUI's prompt worker)."""
    return [row for row in rows if isinstance(row, dict) and row.get("state") == "leaked"
            and ((row.get("release") or {}).get("possible") and not (row.get("release") or {}).get("last"))
            and (prompt_ids.get(((row.get("created_by") or {}) if isinstance(row.get("created_by"), dict) else {})
                                .get("prompt_id")) is not None
                 or prompt_ids.get((row.get("owner") or {}).get("prompt_id")) is not None)]


def wait_for_releases(server, stall_s=RELEASE_STALL_S, poll_s=RELEASE_POLL_S):
    """After the last free, with no prompt to come: wait while ``auto`` still has releases queued for the worker and
    their number keeps moving (at most ``stall_s`` seconds without a change). Returns what was pending at the start
    and at the end and how long it waited (a release the worker is never woken for stays pending: the census then
    counts its model)."""
    started = last_change = time.monotonic()
    first = last = None
    while True:
        status, rows = drive.http_call("GET", f"{server.url}/memx/models", timeout=30.0)
        pending = len(pending_releases(rows, server.prompt_ids)) if status == 200 and isinstance(rows, list) else None
        first = pending if first is None else first
        if pending != last:
            last, last_change = pending, time.monotonic()
        if pending == 0 or time.monotonic() - last_change >= stall_s or not server.comfy.alive():
            return {"pending_at_start": first, "pending_at_end": pending,
                    "waited_s": round(time.monotonic() - started, 2)}
        time.sleep(poll_s)


def final_checks(server, options, deadline):
    """After the workload (whose last prompt was followed by a free): on ``auto`` the wait for its releases, then
    the census prompt, the RSS after it, and ``GET /memx/models`` on a comfy_memx server."""
    final = {}
    if server.label == "auto":
        final["release_wait"] = wait_for_releases(server)
    nonce = options.prompts + 1
    item = {"index": nonce, "kind": "census", "prompt": keeps_census_prompt(nonce)}
    record, entry = run_prompt(server, item, time.monotonic() + max(5.0, min(120.0, deadline - 60.0
                                                                             - time.monotonic())))
    server.census_rss = read_proc_memory(server.pid)
    final["census"] = keeps_census_of(entry) if record["ok"] else None
    if not record["ok"]:
        final["census_error"] = record.get("error")
    if server.memx:
        status, rows = drive.http_call("GET", f"{server.url}/memx/models", timeout=30.0)
        final["models_after"] = (models_after(rows, server.prompt_ids) if status == 200 and isinstance(rows, list)
                                 else {"status": status})
    return final


def keeps_census_of(entry):
    """The pack's census record from a census prompt's history entry, or None."""
    for output in (entry or {}).get("outputs", {}).values():
        records = output.get("memx_keeps_census") if isinstance(output, dict) else None
        if records:
            return records[0]
    return None


def models_after(rows, prompt_ids):
    """The ``/memx/models`` rows alive at the end that a workload prompt built or loaded (the ``prompt_id`` of their
    ``created_by`` or ``owner`` is one of ``prompt_ids``, ComfyUI prompt id -> workload index): how many, by model
    class, state and the package that built them, and the first few."""
    mine = []
    for row in rows:
        if not isinstance(row, dict):
            continue
        created_by = row.get("created_by") if isinstance(row.get("created_by"), dict) else {}
        index = prompt_ids.get(created_by.get("prompt_id"), prompt_ids.get((row.get("owner") or {}).get("prompt_id")))
        if index is None:
            continue
        mine.append({"model_id": row.get("model_id"), "model": row.get("model"), "state": row.get("state"),
                     "bytes": row.get("bytes"), "prompt_index": index,
                     "created_by": created_by.get("package"),
                     "found_by": (row.get("leak") or {}).get("found_by"),
                     "holder_package": ((row.get("leak") or {}).get("holder") or {}).get("package"),
                     "release": (row.get("release") or {}).get("last")})
    counts = {"by_model": {}, "by_state": {}, "by_creator": {}}
    for row in mine:
        for key, field in (("by_model", "model"), ("by_state", "state"), ("by_creator", "created_by")):
            counts[key][str(row[field])] = counts[key].get(str(row[field]), 0) + 1
    return {"rows": len(rows), "from_workload": len(mine), **counts,
            "prompt_indices": sorted({row["prompt_index"] for row in mine}), "examples": mine[:8]}


def summarize_keeps_server(server, final):
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
        "rss_after": [list(sample) for sample in server.rss_after],
        "rss_after_free": [list(sample) for sample in server.rss_after_free],
        "census_rss": list(server.census_rss) if server.census_rss else None,
        "frees": server.frees,
        "log_path": server.log_path,
        "log": scan_log(drive.read_text(server.log_path)),
        "census": final.get("census"), "census_error": final.get("census_error"),
    }
    if server.memx:
        summary["events"] = validate_event_file(server.events_path)
        summary["releases"] = release_events(server.events_path)
        summary["models_after"] = final.get("models_after")
        summary["release_wait"] = final.get("release_wait")
    return summary
