"""The servers: base folders, the checkpoint, starting and stopping both ComfyUI servers
(``bench.harness.drive``), running prompts, the pollers, ``/memx/free`` and the final checks."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time

from bench.soak.config import (CHECKPOINT_NAME, FINAL_RESERVE_S, FREE_ALL, HISTORY_POLL_S, METRICS_UNAVAILABLE,
                               PACK_NAME, PACK_SOURCE, ROOT, SERVERS, SLOTS, WORKFLOW_PATH, WORKLOAD_REUSE)
from bench.harness import drive
from bench.soak.workload import build_workload, census_prompt, expected_held, load_workflow
from bench.soak.measurements import (describe, median_or_none, read_proc_memory, rss_growth_per_100, scan_log, thin,
                                     validate_event_file)
from bench.soak.verdict import census_from_history, compare, kept_alive_verdict, unexpected_survivors


def default_cache_dir():
    explicit = os.environ.get("COMFY_MEMX_SOAK_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "comfy_memx-soak")


def ensure_checkpoint(options, log, timeout=900.0):
    """The checkpoint to use: ``--checkpoint``, or the cached one, built with make_checkpoint.py when absent."""
    if options.checkpoint:
        return os.path.abspath(options.checkpoint), 0.0
    path = os.path.join(default_cache_dir(), CHECKPOINT_NAME)
    if os.path.isfile(path) and os.path.getsize(path) > 0:
        return path, 0.0
    log(f"building the random-weight checkpoint {path} with {options.python} (about 25 s) ...")
    started = time.monotonic()
    drive.ensure_checkpoint(options.python, os.path.abspath(options.comfyui), path, timeout=max(1.0, timeout))
    return path, time.monotonic() - started


def prepare_base(base, checkpoint):
    """A ComfyUI base folder: the pack in custom_nodes, the checkpoint linked into models/checkpoints."""
    for name in ("custom_nodes", "input", "output", "temp", "user", os.path.join("models", "checkpoints")):
        os.makedirs(os.path.join(base, name), exist_ok=True)
    shutil.copytree(PACK_SOURCE, os.path.join(base, "custom_nodes", PACK_NAME), dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    link = os.path.join(base, "models", "checkpoints", CHECKPOINT_NAME)
    if not os.path.lexists(link):
        try:
            os.symlink(checkpoint, link)
        except OSError:
            os.link(checkpoint, link)
    return ["--base-directory", base, "--database-url", "sqlite:///" + os.path.join(base, "user", "comfyui.db")]


def check_importable(python, module="comfy_memx"):
    """None when ``python`` can import ``module`` (with this environment's PYTHONPATH), else the error text."""
    env = drive.inherited_env()
    try:
        result = subprocess.run([python, "-c", f"import {module}"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=120, env=env, cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"
    if result.returncode == 0:
        return None
    return result.stdout.strip()[-1000:] or f"exit status {result.returncode}"


def stop_servers(servers, report):
    """Stop every soak server, recording each one's exit code and how it stopped (or why not) in ``report["stops"]``;
    one that fails to stop does not keep the others running."""
    for server in servers:
        try:
            report.setdefault("stops", {})[server.label] = {"exit_code": server.comfy.stop(),
                                                           "method": server.comfy.stop_method}
        except Exception as error:
            report.setdefault("stops", {})[server.label] = {"error": repr(error)}


class SoakProcess:
    """The ComfyUI process of one soak server: launched from ``argv`` and ``env`` in the tree, logging to
    ``base/server.log``; its events file (if any) starts empty, so that a reused --work-dir validates this run's only."""

    def launch(self, argv, env, options, base, port, events_path):
        """Set up the process (not started): ``comfy``, ``url``, ``log_path``; forget a previous run's events."""
        self.argv = argv
        self.log_path = os.path.join(base, "server.log")
        self.comfy = drive.ComfyServer(argv, os.path.abspath(options.comfyui), env, self.log_path, port)
        self.url = self.comfy.base_url
        if events_path and os.path.exists(events_path):
            os.unlink(events_path)
        self.boot_s = None
        self.stats = None

    @property
    def pid(self):
        return self.comfy.process.pid if self.comfy.process is not None else None

    def start(self):
        self.started = time.monotonic()
        self.comfy.start()

    def wait_ready(self, timeout):
        self.stats = self.comfy.wait_ready(timeout)
        self.boot_s = time.monotonic() - self.started
        return self.stats is not None


class Server(SoakProcess):
    """One soak server: its ComfyUI process, its prompt records, RSS samples, poll and free results."""

    def __init__(self, label, options, base, port, events_path=None):
        self.label = label
        self.base = base
        self.port = port
        self.events_path = events_path
        self.records = []
        self.rss_after = []        # (prompt_index, VmRSS, RssAnon) after each prompt
        self.rss_timeline = []     # (seconds since start, prompts done, VmRSS, RssAnon)
        self.prompt_ids = {}       # ComfyUI prompt id -> workload index
        self.polls = {"models": [], "metrics": []}
        self.frees = []
        self.free_thread = None
        self.free_skipped = 0
        self.lock = threading.Lock()
        comfy_args = prepare_base(base, options.checkpoint_path)
        launcher = "module" if label == "memx" else "plain"
        argv, extra = drive.server_command(options.python, os.path.abspath(options.comfyui), launcher, port, comfy_args)
        env = drive.inherited_env()
        env.update(extra)
        env["PYTHONUNBUFFERED"] = "1"
        if label == "memx":
            env["COMFY_MEMX_LEAK_MODE"] = options.leak_mode
            env["COMFY_MEMX_EVENTS"] = events_path
        self.launch(argv, env, options, base, port, events_path)

    def sample(self, clock_start, prompts_done):
        vmrss, anon = read_proc_memory(self.pid)
        if vmrss is not None:
            with self.lock:
                self.rss_timeline.append((round(time.monotonic() - clock_start, 2), prompts_done, vmrss, anon))
        return vmrss, anon


def wait_history(server, prompt_id, deadline, poll=HISTORY_POLL_S):
    """Poll /history/<id> every ``poll`` seconds until the prompt completed; return its entry or None."""
    while time.monotonic() < deadline and server.comfy.alive():
        status, body = drive.http_call("GET", f"{server.url}/history/{prompt_id}", timeout=10.0)
        if status == 200 and isinstance(body, dict) and prompt_id in body:
            entry = body[prompt_id]
            if entry.get("status", {}).get("completed") is not None or entry.get("outputs"):
                return entry
        time.sleep(poll)
    return None


def exec_seconds(entry):
    """ComfyUI's own execution time of a prompt from its history messages' timestamps (ms), or None."""
    stamps = {}
    for message in (entry or {}).get("status", {}).get("messages", []):
        if isinstance(message, list) and len(message) == 2 and isinstance(message[1], dict):
            stamps[message[0]] = message[1].get("timestamp")
    start, end = stamps.get("execution_start"), stamps.get("execution_success")
    if isinstance(start, (int, float)) and isinstance(end, (int, float)):
        return (end - start) / 1000.0
    return None


def run_prompt(server, item, deadline, on_submitted=None, poll=HISTORY_POLL_S):
    """Submit one workload prompt and wait for it (polling its history every ``poll`` seconds); returns its record
    (``ok``, ``e2e_s``, ``exec_s``, ...) and the history entry."""
    started = time.monotonic()
    status, body = drive.submit_prompt(server.comfy, item["prompt"], client_id=f"memx-soak-{server.label}")
    prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
    record = {"index": item["index"], "kind": item["kind"], "prompt_id": prompt_id, "ok": False}
    if status != 200 or not prompt_id:
        record["error"] = f"POST /prompt answered {status}: {str(body)[:500]}"
        return record, None
    server.prompt_ids[prompt_id] = item["index"]
    if on_submitted is not None:
        on_submitted()
    entry = wait_history(server, prompt_id, deadline, poll)
    record["e2e_s"] = time.monotonic() - started
    if entry is None:
        record["error"] = "no history entry before the deadline" + ("" if server.comfy.alive() else " (server exited)")
        return record, None
    run_status = entry.get("status", {})
    record["ok"] = run_status.get("status_str") == "success"
    record["exec_s"] = exec_seconds(entry)
    if not record["ok"]:
        errors = [m for m in run_status.get("messages", []) if m and m[0] == "execution_error"]
        record["error"] = json.dumps(errors, default=str)[:2000] or run_status.get("status_str")
    return record, entry


def poll_loop(server, stop, interval, metrics_path):
    """GET /memx/models and the metrics path every ``interval`` seconds until ``stop`` is set."""
    while not stop.wait(interval):
        if not server.comfy.alive():
            return
        for key, path in (("models", "/memx/models"), ("metrics", metrics_path)):
            started = time.monotonic()
            status, body = drive.http_call("GET", server.url + path, timeout=30.0)
            entry = {"status": status, "s": round(time.monotonic() - started, 4)}
            if key == "models" and status == 200 and isinstance(body, list):
                entry["rows"] = len(body)
                entry["leaked"] = sum(1 for row in body if isinstance(row, dict) and row.get("state") == "leaked")
            elif key == "metrics" and status == 200 and isinstance(body, str):
                entry["bytes"] = len(body)
            elif status == 0 or status >= 500:
                entry["error"] = str(body)[:300]
            with server.lock:
                server.polls[key].append(entry)


def post_free(server, index, memx):
    """POST /memx/free (memx) or ComfyUI's /free (plain) with both flags; records the answer."""
    started = time.monotonic()
    if memx:
        status, body = drive.http_call("POST", f"{server.url}/memx/free?timeout=60", dict(FREE_ALL), timeout=120.0)
    else:
        status, body = drive.http_call("POST", f"{server.url}/free", dict(FREE_ALL), timeout=30.0)
    record = {"index": index, "status": status, "s": round(time.monotonic() - started, 3)}
    if memx and isinstance(body, dict):
        record.update(receipt_status=body.get("status"), waited_s=body.get("waited_s"),
                      survivors=[s.get("model_id") for s in body.get("survivors") or []],
                      unexpected=[{"model_id": s.get("model_id"), "model": s.get("model"), "reason": s.get("reason"),
                                   "owner": s.get("owner")} for s in unexpected_survivors(body)])
    elif status == 0 or status >= 400:
        record["error"] = str(body)[:300]
    with server.lock:
        server.frees.append(record)
    return body


def start_free(server, index, memx):
    """Send a free request in the background (at most one in flight per server; otherwise it is skipped)."""
    if server.free_thread is not None and server.free_thread.is_alive():
        server.free_skipped += 1
        return
    thread = threading.Thread(target=post_free, args=(server, index, memx), daemon=True,
                              name=f"soak-free-{server.label}")
    server.free_thread = thread
    thread.start()


def rss_loop(servers, stop, clock_start, progress, loadavg):
    while not stop.wait(1.0):
        loadavg.append(os.getloadavg()[0])
        for server in servers:
            if server.comfy.alive():
                server.sample(clock_start, progress[server.label])


def pick_metrics_path(server):
    """/metrics when it is comfy_memx's (or answers 501 for a missing prometheus_client), else /memx/metrics."""
    status, body = drive.http_call("GET", server.url + "/metrics", timeout=30.0)
    if status == 200 and isinstance(body, str) and "comfy_memx_" in body:
        return "/metrics"
    if status == METRICS_UNAVAILABLE:
        return "/metrics"
    return "/memx/metrics"


def summarize_server(server, prompts, warmup, memx):
    """One server's figures for the report: prompts and failures, latency, RSS, its polls and free requests."""
    records = server.records
    ok = [r for r in records if r["ok"]]
    summary = {
        "command": server.argv, "port": server.port, "pid": server.pid,
        "boot_s": None if server.boot_s is None else round(server.boot_s, 2),
        "prompts_run": len(records), "failed": len(records) - len(ok),
        "failures": [{"index": r["index"], "error": r.get("error")} for r in records if not r["ok"]][:10],
        "latency": {"e2e": describe([r.get("e2e_s") for r in ok]), "exec": describe([r.get("exec_s") for r in ok])},
        "log_path": server.log_path,
    }
    for kind in ("t2i", "t2i+pack"):
        summary["latency"][f"e2e_{kind}"] = describe([r.get("e2e_s") for r in ok if r["kind"] == kind])
    summary["rss"] = _rss_summary(server, prompts, warmup)
    polls = {key: _poll_summary(key, entries) for key, entries in server.polls.items()}
    polls["server_errors"] = _server_errors(server) if memx else 0
    summary["polls"] = polls
    summary["frees"] = _free_summary(server, memx)
    return summary


def _rss_summary(server, prompts, warmup):
    """VmRSS first, last and highest, its growth per 100 prompts (and RssAnon's), thinned sample lists."""
    after = server.rss_after
    timeline = server.rss_timeline
    rss_values = [v for _, v, _ in after if v is not None]
    return {
        "first": rss_values[0] if rss_values else None, "last": rss_values[-1] if rss_values else None,
        "max": max((t[2] for t in timeline), default=None),
        "growth_mib_per_100": rss_growth_per_100([(i, v) for i, v, _ in after], prompts, warmup),
        "anon_growth_mib_per_100": rss_growth_per_100([(i, a) for i, _, a in after], prompts, warmup),
        "after_prompt": thin([list(t) for t in after], 600),
        "timeline": thin([list(t) for t in timeline], 600),
    }


def _count_statuses(records):
    """``{status as text: how many}`` of poll or free records."""
    statuses = {}
    for record in records:
        statuses[str(record["status"])] = statuses.get(str(record["status"]), 0) + 1
    return statuses


def _poll_summary(key, entries):
    """One poller's figures: answers by status, their times, and the rows (models) or sizes (metrics) seen."""
    summary = {"count": len(entries), "status": _count_statuses(entries),
               "max_s": max((e["s"] for e in entries), default=None),
               "median_s": median_or_none([e["s"] for e in entries])}
    if key == "models":
        rows = [e["rows"] for e in entries if "rows" in e]
        summary.update(rows_first=rows[0] if rows else None, rows_last=rows[-1] if rows else None,
                       rows_max=max(rows, default=None))
    if key == "metrics":
        sizes = [e["bytes"] for e in entries if "bytes" in e]
        summary.update(bytes_first=sizes[0] if sizes else None, bytes_last=sizes[-1] if sizes else None)
    return summary


def _server_errors(server):
    """Answers of the comfy_memx server's polls and frees that were server errors (a 501 for missing metrics is
    not one)."""
    polled = sum(1 for entries in server.polls.values() for entry in entries
                 if entry["status"] >= 500 and entry["status"] != METRICS_UNAVAILABLE)
    return polled + sum(1 for record in server.frees if record["status"] >= 500)


def _free_summary(server, memx):
    """The free requests: how many, skipped while one was in flight, by status, the last records; for comfy_memx
    the unexpected survivors of the receipts and how long each free waited."""
    frees = {"count": len(server.frees), "skipped_in_flight": server.free_skipped,
             "status": _count_statuses(server.frees), "records": server.frees[-60:]}
    if memx:
        frees["unexpected_survivors"] = sum(len(r.get("unexpected", [])) for r in server.frees)
        waited = [r["waited_s"] for r in server.frees if isinstance(r.get("waited_s"), (int, float))]
        frees["waited_s"] = describe(waited)
    return frees


def pick_ports(count, port_base=None):
    """``count`` distinct ports: ``port_base`` and the ones after it, or free ports."""
    ports = []
    for _ in range(count):
        port = port_base + len(ports) if port_base else drive.free_port()
        while port in ports:
            port = drive.free_port()
        ports.append(port)
    return ports


def start_servers(servers, options, deadline, log):
    """Start every server, then wait until each answers /system_stats (raising for the first that does not)."""
    for server in servers:
        server.start()
    for server in servers:
        if not server.wait_ready(min(options.boot_timeout, max(1.0, deadline - time.monotonic()))):
            raise RuntimeError(f"{server.label} server did not answer /system_stats"
                               + ("" if server.comfy.alive() else " (it exited)") + f"; log: {server.log_path}")
    log("servers up: " + ", ".join(f"{s.label} {s.url} ({s.boot_s:.1f} s)" for s in servers)
        + f"; {options.prompts} prompts each")


def run_workload(workload, options, deadline, report, clock, log, plan):
    """Run every prompt of ``workload`` on the servers ``plan.order(item)`` names, one at a time, through
    ``plan.run(server, item, prompt_deadline)``; stop when only the final checks' reserve is left (the reason in
    ``report["error"]``) and log progress every minute (``plan.progress()``, after the prompt count).

    Raises when a server exited during its prompt."""
    last_report = time.monotonic()
    for item in workload:
        if time.monotonic() >= deadline - FINAL_RESERVE_S:
            report["error"] = (f"--timeout {options.timeout:g} s reached after {item['index']} prompts "
                               f"({FINAL_RESERVE_S:g} s of it are kept for the final checks)")
            return
        for server in plan.order(item):
            plan.run(server, item, min(deadline - FINAL_RESERVE_S, time.monotonic() + options.prompt_timeout))
            if not server.comfy.alive():
                raise RuntimeError(f"{server.label} server exited during prompt {item['index']}; "
                                   f"log: {server.log_path}")
        if time.monotonic() - last_report > 60:
            last_report = time.monotonic()
            log(f"  {item['index'] + 1}/{options.prompts} prompts, {time.monotonic() - clock:.0f} s; "
                + plan.progress())


class _SoakPlan:
    """How the soak runs a prompt: on both servers, memx first for even prompts; a free request every
    ``free_every`` prompts; the RSS after each prompt."""

    def __init__(self, servers, options, clock, progress):
        self.servers, self.options, self.clock, self.done = servers, options, clock, progress

    def order(self, item):
        return self.servers if item["index"] % 2 == 0 else self.servers[::-1]

    def run(self, server, item, prompt_deadline):
        free_now = (item["index"] + 1) % self.options.free_every == 0
        is_memx = server is self.servers[0]
        hook = (lambda s=server, m=is_memx: start_free(s, item["index"], m)) if free_now else None
        record, _ = run_prompt(server, item, prompt_deadline, hook)
        server.records.append(record)
        self.done[server.label] = item["index"] + 1
        vmrss, anon = server.sample(self.clock, item["index"] + 1)
        server.rss_after.append((item["index"], vmrss, anon))

    def progress(self):
        return ", ".join(f"{s.label} {s.records[-1].get('e2e_s') or 0:.2f} s" for s in self.servers)


def soak_report(options):
    """The soak report before the run: what runs, on what, in which order."""
    return {"tool": "bench/soak.py", "comfyui": os.path.abspath(options.comfyui), "python": options.python,
            "prompts": options.prompts, "leak_mode": options.leak_mode, "error": None,
            "no_plain": bool(options.no_plain), "latency_target": getattr(options, "latency_target", None),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "loadavg_start": os.getloadavg(),
            "workload": {"workflow": os.path.relpath(WORKFLOW_PATH, ROOT), "pack": PACK_NAME,
                         "slots": [s for s, _ in SLOTS], "generations": options.generations,
                         "workload": getattr(options, "workload", WORKLOAD_REUSE),
                         "free_every": options.free_every, "poll_interval_s": options.poll_interval,
                         "order": "prompt i runs on both servers, one at a time: memx first for even i, plain "
                                  "first for odd i; pack nodes in odd prompts" if not options.no_plain
                                  else "memx server only (--no-plain); pack nodes in odd prompts"},
            "servers": {}, "comparison": {}}


def run_soak(options, log=print):
    """Run the whole soak; returns the report (the servers are always stopped)."""
    wall_start = time.monotonic()
    deadline = wall_start + options.timeout
    report = soak_report(options)
    workload = build_workload(options.prompts, load_workflow(), options.generations,
                              workload=getattr(options, "workload", WORKLOAD_REUSE))
    work = options.work_dir or tempfile.mkdtemp(prefix="memx-soak-")
    os.makedirs(work, exist_ok=True)
    report["work_dir"] = work
    servers = []
    stop = threading.Event()
    threads = []
    labels = SERVERS[:1] if options.no_plain else SERVERS
    loadavg = []
    finals = {}
    try:
        options.checkpoint_path, built_s = ensure_checkpoint(options, log, min(900.0, deadline - time.monotonic()))
        report["checkpoint"] = options.checkpoint_path
        report["checkpoint_build_s"] = round(built_s, 1)
        for label, port in zip(labels, pick_ports(2, options.port_base)):
            base = os.path.join(work, label)
            events = os.path.join(base, "events.jsonl") if label == "memx" else None
            servers.append(Server(label, options, base, port, events))
        start_servers(servers, options, deadline, log)
        report["comfyui_version"] = (servers[0].stats or {}).get("system", {}).get("comfyui_version")
        clock, plan = _start_samplers(servers, options, stop, loadavg, report, threads)
        run_workload(workload, options, deadline, report, clock, log, plan)
        stop.set()
        for server in servers:
            if server.free_thread is not None:
                server.free_thread.join(timeout=max(1.0, min(120.0, deadline - 150.0 - time.monotonic())))
        finals = final_checks(servers[0], servers[1] if len(servers) > 1 else None, options, deadline)
    except (Exception, KeyboardInterrupt, SystemExit) as error:  # record it; the servers are still stopped below
        report["error"] = f"{type(error).__name__}: {error}"
        report["interrupted"] = not isinstance(error, Exception)
    finally:
        stop.set()
        stop_servers(servers, report)
        for thread in threads:
            thread.join(timeout=5.0)
    _finish_report(report, servers, options, finals, workload, wall_start, loadavg)
    return report


def _start_samplers(servers, options, stop, loadavg, report, threads):
    """Start the RSS sampler and one poller per server (the metrics path picked first), adding them to ``threads``;
    returns the run's clock and its :class:`_SoakPlan`."""
    clock = time.monotonic()
    progress = {server.label: 0 for server in servers}
    metrics_path = pick_metrics_path(servers[0])
    report["workload"]["metrics_path"] = metrics_path
    threads.append(threading.Thread(target=rss_loop, args=(servers, stop, clock, progress, loadavg), daemon=True))
    for server in servers:
        threads.append(threading.Thread(target=poll_loop, args=(server, stop, options.poll_interval, metrics_path),
                                        daemon=True))
    for thread in threads:
        thread.start()
    return clock, _SoakPlan(servers, options, clock, progress)


def _finish_report(report, servers, options, finals, workload, wall_start, loadavg):
    """After the servers stopped: each one's summary, log scan and events, the comparison and the verdicts."""
    report["wall_s"] = round(time.monotonic() - wall_start, 1)
    report["loadavg_end"] = os.getloadavg()
    report["loadavg_1m_during"] = describe(loadavg)
    for server in servers:
        summary = summarize_server(server, options.prompts, options.warmup, server.label == "memx")
        summary["log"] = scan_log(drive.read_text(server.log_path))
        if server.label == "memx":
            summary["events"] = validate_event_file(server.events_path)
        summary["stop"] = report.get("stops", {}).get(server.label)
        report["servers"][server.label] = summary
    for label in SERVERS:
        report["servers"].setdefault(label, {})
    report["comparison"] = compare(servers)
    report["final"] = {key: value for key, value in finals.items() if key != "receipt"}
    report["final_receipt"] = finals.get("receipt")
    report["kept_alive"] = kept_alive_verdict(report, finals, workload, servers, expected_held(workload))


def final_checks(memx, plain, options, deadline):
    """End of the run: free everything, then census both servers and read /memx/models once more."""
    finals = {}

    def left(reserve):
        return max(5.0, deadline - reserve - time.monotonic())

    wait = min(120.0, left(120.0))
    status, receipt = drive.http_call("POST", f"{memx.url}/memx/free?timeout={wait:.0f}", dict(FREE_ALL),
                                  timeout=wait + 30.0)
    finals["free_status"] = status
    finals["receipt"] = receipt if isinstance(receipt, dict) else {"raw": str(receipt)[:2000]}
    if plain is not None:
        plain_status, _ = drive.http_call("POST", f"{plain.url}/free", dict(FREE_ALL), timeout=30.0)
        finals["plain_free_status"] = plain_status
        time.sleep(3.0)  # plain's /free answers before its worker acts; memx's answered after
    nonce = options.prompts + 1
    for server in (memx, plain) if plain is not None else (memx,):
        item = {"index": nonce, "kind": "census", "prompt": census_prompt(nonce)}
        record, entry = run_prompt(server, item, time.monotonic() + min(120.0, left(60.0)))
        finals[f"census_{server.label}"] = census_from_history(entry) if record["ok"] else None
        if not record["ok"]:
            finals[f"census_{server.label}_error"] = record.get("error")
    status, rows = drive.http_call("GET", f"{memx.url}/memx/models", timeout=30.0)
    if status == 200 and isinstance(rows, list):
        finals["models_after"] = [{"model_id": r.get("model_id"), "model": r.get("model"), "state": r.get("state"),
                                   "package": (r.get("owner") or {}).get("package")} for r in rows]
    else:
        finals["models_after_status"] = status
    return finals
