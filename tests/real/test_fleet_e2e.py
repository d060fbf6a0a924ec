"""End to end for fleets: real ComfyUI 0.33.0 under comfy_memx with a leaking pack, a real Prometheus on
loopback scraping its ``/metrics`` every second with comfy_memx's alert rules loaded, prompts run, and then, through
Prometheus's HTTP API: the rooted-leak alert fires naming the holding package, the survivor alert fires after a
``/memx/free`` with the leak alive, a run of failed scrapes (the ComfyUI process stopped) neither resolves nor pages
again any alert, a release through the route ends the released model's alerts for good while a refused release
raises its own, no core-patch or inactivity alert fires, and every query of the shipped Grafana dashboard returns
data over the run (except the queries listed in :data:`EMPTY_QUERIES`, with why).

Opt-in like the other real-ComfyUI tests; skipped, with the reason, unless all of these hold:

* ``COMFY_MEMX_REAL_COMFYUI`` names a ComfyUI 0.33.0 tree (among others, os.pathsep-separated);
* ``COMFY_MEMX_REAL_PYTHON`` is an interpreter with ComfyUI's requirements that imports comfy_memx and
  prometheus_client (without it ``/metrics`` answers 501);
* a ``prometheus`` binary is on ``PATH`` (Debian's ``prometheus`` package) or named by ``COMFY_MEMX_PROMETHEUS``.

The scenario (one server, leak mode strict, ``COMFY_MEMX_RELEASE=ask``, packs ``memx_test_nodes`` and
``memx_unload_nodes``, ``--cpu``): a tiny model kept by ``MemxLeakyCache`` then replaced (ComfyUI warns: a rooted leak
held by ``memx_test_nodes``), two prompts that see the leak again, four prompts whose ``MemxUnloadAllModels`` unloads
the model the next prompt reloads (reloads charged to ``memx_unload_nodes``), a model whose torch module
``memx_list_keeper`` (of ``tests/real_comfy/culprit_packs/``) appends to its module-level list, and ``/memx/free``
with both alive (survivors; ComfyUI never warns about the second, which the free takes out of its loaded list: a
rooted leak found after the free, held by ``memx_list_keeper``).  Then the ComfyUI process is stopped for
:data:`GAP_S` seconds (SIGSTOP, then SIGCONT: every scrape meanwhile times out and marks the series stale), the
list keeper's model is released through ``POST /memx/models/{id}/release`` (the list entry is cut, the model dies),
and a release of the other leak names a holder path it does not have (refused).  The ``loader`` patch is disabled
(``COMFY_MEMX_DISABLE=loader``), so that the skipped-sites panel has a site to show and the core-patch alert is seen
to stay quiet for a site outside its list.

The rules are the shipped template rendered with a shorter bridge for failed scrapes and a shorter
``keep_firing_for`` (:data:`RULE_OVERRIDES`), so that a resolution is seen within the run; every other threshold is
the shipped one.
"""

import math
import os
import signal
import subprocess
import time
from urllib.parse import quote

import pytest

from bench.harness import prom
from fleet_queries import alert_names, dashboard_exprs, grafana_free
from test_real_comfyui import (PYTHON_ENV, TREES_ENV, configured_python, configured_trees, drive)

from comfy_memx.core.comfyui import version_of_tree
from comfy_memx.fleet import rules

VERSION = "0.33.0"
HOLDER = "memx_test_nodes"      # the pack whose MemxLeakyCache keeps the leaked module (and whose loader loaded it)
UNLOADER_PACK = "memx_unload_nodes"
FREE_HOLDER = "memx_list_keeper"  # keeps a module ComfyUI never warns about: found after the free
FREE_HOLDER_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "real_comfy",
                               "culprit_packs", FREE_HOLDER)
# Grafana's variables as the dashboard would send them with "All" selected, and a rate window over a few scrapes.
VARIABLES = {"$job": prom.JOB, "$instance": ".*", "$__rate_interval": "30s"}
# Queries that cannot fill here: nothing is copied between devices with --cpu (loads and unloads claim no GB/s),
# nothing is pinned, so pinned bytes stay 0 and no pin is evicted or refused; and the growth fits need a process
# older than the run (30 minutes for the short fit).
EMPTY_QUERIES = {
    ("Load GB/s on $instance", "A"): "loads copy no bytes with --cpu (gb_per_s is null): the histogram stays at zero",
    ("Offload GB/s on $instance", "A"): "unloads copy no bytes with --cpu: the histogram stays at zero",
    ("Pinned memory against the cap", "A"): "nothing is pinned with --cpu: pinned bytes stay 0 (B, the caps, has data)",
    ("Pin evictions and refusals", "A"): "nothing is pinned with --cpu: no pin_evict event",
    ("Pin evictions and refusals", "B"): "nothing is pinned with --cpu: no pin_refused event",
    ("Unexplained RSS growth per hour (the alert's fits)", "A"): "the 2h fit counts from 2h35m of uptime",
    ("Unexplained RSS growth per hour (the alert's fits)", "B"): "the 15m fit counts from 30 minutes of uptime",
}
# Failed scrapes are bridged for 20 s (the shipped 2 minutes would outlast the run), alerts keep firing 10 s.
RULE_OVERRIDES = {"scrape_gap": "20s", "keep_firing": "10s"}
GAP_S = 8.0       # seconds the ComfyUI process is stopped: every scrape meanwhile fails (1 s timeout)
# Recording rules and exported series read at the end of the run (instant queries).
RECORDED = {
    "leaked_fraction": 'comfy_memx:leaked_bytes:host_fraction{package="%s"}' % HOLDER,
    "rss_unexplained": "comfy_memx:rss_unexplained_bytes",
    "uptime": "comfy_memx:uptime_seconds",
    "rss_fraction": "comfy_memx:rss:host_fraction",
    "growth": "comfy_memx:rss_unexplained_growth:bytes_per_hour",
    "fast_growth": "comfy_memx:rss_unexplained_fast_growth:bytes_per_hour",
    "frees_handoff": 'comfy_memx_frees_total{origin="handoff"}',
}
SETTLE_S = 90.0   # at most this long for Prometheus to see what the server did (polled, not slept)


def tree_0330():
    found = [tree for tree in configured_trees() if version_of_tree(tree) == VERSION]
    return found[0] if found else None


def skip_reason():
    """Why this module cannot run here, or None."""
    if not configured_trees() or not configured_python():
        return f"set {TREES_ENV} (with a ComfyUI {VERSION} tree) and {PYTHON_ENV} to run against real ComfyUI"
    if tree_0330() is None:
        return f"no ComfyUI {VERSION} tree in {TREES_ENV}"
    if prom.find_binary() is None:
        return "no prometheus binary (apt-get install prometheus, or set COMFY_MEMX_PROMETHEUS)"
    probe = subprocess.run([configured_python(), "-c", "import comfy_memx, prometheus_client"],
                           capture_output=True, text=True, timeout=120, cwd="/", env=drive.inherited_env())
    if probe.returncode != 0:
        return (f"{configured_python()} cannot import comfy_memx and prometheus_client "
                f"(pip install --no-deps comfy_memx prometheus_client): {probe.stderr.strip()[-300:]}")
    return None


def leak_prompt():
    return {"1": drive.loader_node("memx-fleet-leak"), "2": drive.sampler_node("1", 1),
            "3": drive.leaky_cache_node("1", "fleet")}


def kept_prompt():
    return {"1": drive.loader_node("memx-fleet-kept"), "2": drive.sampler_node("1", 7),
            "3": {"class_type": "KeepListKeeper", "inputs": {"model": ["1", 0]}}}


def rooted_packages(alerts):
    return sorted(alert["labels"]["package"] for alert in firing(alerts, "ComfyMemxRootedLeak"))


def plain_prompt(seed):
    return {"1": drive.loader_node("memx-fleet-other"), "2": drive.sampler_node("1", seed)}


def unloading_prompt(seed):
    """A sampler run on one model and ``MemxUnloadAllModels`` fed through a probe whose label changes every prompt
    (so that ComfyUI's cache runs the unloader again): the next prompt reloads what this one unloaded."""
    return {"1": drive.loader_node("memx-fleet-reload"), "2": drive.sampler_node("1", seed),
            "4": {"class_type": "MemxWeightProbe", "inputs": {"value": ["1", 0], "model": ["1", 0],
                                                             "label": f"fleet-{seed}"}},
            "5": {"class_type": "MemxUnloadAllModels", "inputs": {"value": ["4", 0]}}}


def wait_for(check, timeout=SETTLE_S, interval=0.5):
    """Call ``check`` until it returns something true or ``timeout`` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    value = check()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = check()
    return value


def firing(alerts, name):
    return [alert for alert in alerts if alert["labels"].get("alertname") == name and alert["state"] == "firing"]


def has_data(result):
    """True when a query result holds at least one value that is a number other than 0 (NaN is no data)."""
    for series in result:
        for _, value in series.get("values") or [series.get("value")]:
            number = float(value)
            if not math.isnan(number) and number != 0:
                return True
    return False


def packages_firing(alerts, name):
    return sorted(alert["labels"]["package"] for alert in firing(alerts, name))


def model_id_held_by(session, package):
    """The model_id of the live leaked model that ``package`` holds (from ``/memx/models``)."""
    rows = session.call(f"models_{package}", "GET", "/memx/models")["body"]
    found = [row["model_id"] for row in rows if isinstance(row, dict) and row.get("state") == "leaked"
             and (row.get("leak") or {}).get("holder_package") == package]
    assert len(found) == 1, (package, rows)
    return found[0]


def release(session, name, model_id, body=None):
    return session.call(name, "POST", f"/memx/models/{quote(model_id, safe='')}/release", body or {}, timeout=120)


def stop_for(session, seconds):
    """Stop the ComfyUI process for ``seconds`` (SIGSTOP, then SIGCONT whatever happens): its scrapes fail."""
    pid = session.server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)   # the gap itself: nothing to wait for, the process is stopped
    finally:
        os.kill(pid, signal.SIGCONT)


def scrape_gap(run, server):
    """Stop the server for GAP_S seconds once the alerts fire; keep what Prometheus said before and after."""
    run["before_gap"] = server.alerts()
    run["gap"] = (time.time(), None)
    stop_for(run["session"], GAP_S)
    run["gap"] = (run["gap"][0], time.time())
    # back: a good scrape after the gap, then a few more scrapes and evaluations
    selector = 'up{job="%s"}' % prom.JOB

    def back():
        scraped = [float(r["value"][1]) for r in server.query(f"timestamp({selector})")]
        return scraped and scraped[0] > run["gap"][1] + 5 and [r["value"][1] for r in server.query(selector)] == ["1"]
    assert wait_for(back), server.targets()
    run["after_gap"] = server.alerts()
    run["gap_up"] = server.query_range('up{job="%s"}' % prom.JOB, run["gap"][0] - 2, run["gap"][1] + 2)
    run["gap_alerts_window"] = (run["gap"][0] - 3, run["gap"][1] + 5)
    run["gap_alerts"] = server.query_range('ALERTS{alertstate="firing"}', *run["gap_alerts_window"])


def releases(run, server):
    """Release the list keeper's model (the list entry is cut: it dies), refuse one of the other leak (a holder path
    it does not have), and watch the alerts until the released model's are gone and stay gone."""
    session = run["session"]
    run["released"] = release(session, "release_kept", model_id_held_by(session, FREE_HOLDER))
    run["refused"] = release(session, "release_wrong_path", model_id_held_by(session, HOLDER),
                             {"path": "memx_test_nodes.nowhere['x']"})
    run["release_time"] = time.time()

    def settled():
        alerts = server.alerts()
        done = (FREE_HOLDER not in packages_firing(alerts, "ComfyMemxRootedLeak")
                and FREE_HOLDER not in packages_firing(alerts, "ComfyMemxFreeLeftSurvivors")
                and packages_firing(alerts, "ComfyMemxReleaseFailed") == [HOLDER])
        return alerts if done else None
    run["after_release"] = wait_for(settled) or server.alerts()
    run["resolved_time"] = time.time()
    # no page again for the released model: watched for longer than the bridge and keep_firing_for together
    quiet_s = rules.seconds(RULE_OVERRIDES["scrape_gap"]) + rules.seconds(RULE_OVERRIDES["keep_firing"]) + 5
    run["refired"] = []
    while time.time() < run["resolved_time"] + quiet_s:
        run["refired"] += [a for a in server.alerts() if a["labels"].get("package") == FREE_HOLDER
                           and a["labels"].get("alertname") != "ComfyMemxReleaseFailed"]
        time.sleep(1.0)   # one evaluation per poll over a bounded watch, not a wait for the server


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    """Run the scenario once under a scraping Prometheus; returns what the tests read (the servers are stopped)."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("fleet-e2e")
    rules_path = out / "comfy_memx.rules.yml"
    rules_path.write_text(rules.render(overrides=RULE_OVERRIDES), encoding="utf-8")
    session = drive.Session(tree_0330(), configured_python(), str(out / "comfy"), launcher="module",
                            env={"COMFY_MEMX_LEAK_MODE": "strict", "COMFY_MEMX_DISABLE": "loader",
                                 "COMFY_MEMX_RELEASE": "ask"}, packs=(HOLDER, UNLOADER_PACK, FREE_HOLDER_DIR))
    server = prom.PrometheusServer(str(out / "prometheus"), [f"{drive.HOST}:{session.port}"], [str(rules_path)])
    run = {"session": session, "prometheus": server, "error": None}
    try:
        assert session.start(), f"ComfyUI did not start; log {session.log_path}"
        server.start()
        assert server.wait_ready(60), f"Prometheus did not start: {server.log_text()[-2000:]}"
        up = wait_for(lambda: [t for t in server.targets() if t["health"] == "up"])
        assert up, f"Prometheus does not scrape {session.base_url}/metrics: {server.targets()}"
        run["start"] = time.time()
        steps = [session.prompt("leak", leak_prompt())]
        steps += [session.prompt(f"seen_{seed}", plain_prompt(seed)) for seed in (1, 2)]
        steps += [session.prompt(f"reload_{seed}", unloading_prompt(seed)) for seed in range(4)]
        steps += [session.prompt("kept", kept_prompt())]
        for step in steps:
            assert step["ok"], (step["name"], step.get("error"), step.get("error_messages"), session.log_path)
        run["free"] = session.memx_free("memx_free", timeout=60)
        assert run["free"]["http_status"] == 200, run["free"]
        run["alerts"] = wait_for(lambda: (lambda alerts: alerts if rooted_packages(alerts) == sorted(
            [HOLDER, FREE_HOLDER]) and packages_firing(alerts, "ComfyMemxFreeLeftSurvivors") == sorted(
            [HOLDER, FREE_HOLDER]) else None)(server.alerts())) or server.alerts()
        scrape_gap(run, server)
        releases(run, server)
        run["end"] = time.time()
        run["queries"] = {(title, ref): server.query_range(grafana_free(expr, VARIABLES), run["start"], run["end"])
                          for title, ref, expr in dashboard_exprs()}
        run["rules"] = server.rules()
        run["instant"] = {name: server.query(expr) for name, expr in RECORDED.items()}
        run["model_series"] = server.series("comfy_memx_model_bytes", run["start"] - 60, run["end"])
        run["scrape_seconds"] = server.query_range('scrape_duration_seconds{job="%s"}' % prom.JOB, run["start"],
                                                   run["end"])
        run["events"] = session.events()
    finally:
        session.stop()
        server.stop()
    return run


def test_prometheus_loaded_every_rule_and_evaluates_them_without_error(fleet_run):
    rules = [rule for group in fleet_run["rules"] for rule in group["rules"]]
    assert {rule["name"] for rule in rules if rule["type"] == "alerting"} == set(alert_names())
    assert {rule["name"] for rule in rules if rule["type"] == "recording"} >= {
        expr.split("{")[0] for expr in RECORDED.values() if expr.startswith("comfy_memx:")}
    assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]


def test_the_rooted_leak_alert_fires_naming_the_holding_and_the_loading_package(fleet_run):
    leaks = firing(fleet_run["alerts"], "ComfyMemxRootedLeak")
    assert leaks, (fleet_run["alerts"], fleet_run["prometheus"].log_text()[-2000:])
    labels = [alert["labels"] for alert in leaks]
    assert all(label["loader_package"] == HOLDER and label["job"] == prom.JOB for label in labels), labels
    leak_events = [e for e in fleet_run["events"] if e["event"] == "leak" and e.get("stage") == "rooted"]
    assert [(e.get("holder_package"), e.get("found_by")) for e in leak_events] == [
        (HOLDER, "comfyui_warning"), (FREE_HOLDER, "after_free")], leak_events
    # the one ComfyUI never warned about (the free took it out of its loaded list) fires with its holder too
    assert rooted_packages(fleet_run["alerts"]) == sorted([HOLDER, FREE_HOLDER]), labels


def test_the_survivor_alert_fires_after_a_free_with_the_leak_alive(fleet_run):
    receipt = fleet_run["free"]["body"]
    assert receipt["status"] == "done" and len(receipt["survivors"]) >= 1, receipt
    survivors = firing(fleet_run["alerts"], "ComfyMemxFreeLeftSurvivors")
    instance = f"{drive.HOST}:{fleet_run['session'].port}"
    assert {alert["labels"]["instance"] for alert in survivors} == {instance}
    assert sorted(alert["labels"]["package"] for alert in survivors) == sorted([HOLDER, FREE_HOLDER]), survivors


def test_the_recording_rules_measure_against_the_host_and_skip_a_young_process(fleet_run):
    instant = {name: [series["value"][1] for series in result] for name, result in fleet_run["instant"].items()}
    [leaked] = instant["leaked_fraction"]
    assert 0 < float(leaked) < 0.01, instant              # a tiny model on a host of gigabytes
    [uptime] = instant["uptime"]
    assert 0 < float(uptime) < 3600 and len(instant["rss_unexplained"]) == 1 and len(instant["rss_fraction"]) == 1
    assert instant["growth"] == [] and instant["fast_growth"] == [], instant   # a young process: no fit yet
    assert instant["frees_handoff"] == ["0"], instant      # a known origin, at 0 before its first free


def test_per_model_series_carry_no_model_id(fleet_run):
    series = fleet_run["model_series"]
    assert series and not any("model_id" in labels for labels in series), series[:3]


def test_no_core_patch_skipped_or_inactive_alert_on_a_supported_comfyui(fleet_run):
    skipped = fleet_run["queries"][("Skipped patch sites", "A")]
    assert ("loader", "load_torch_file", "disabled") in {
        (series["metric"]["patch"], series["metric"]["site"], series["metric"]["reason"]) for series in skipped}
    names = {alert["labels"]["alertname"] for alert in fleet_run["alerts"]}
    assert not names & {"ComfyMemxCorePatchSkipped", "ComfyMemxInactive", "ComfyMemxAbsent"}, fleet_run["alerts"]


def test_every_dashboard_query_returns_data_but_those_that_cannot_fill_here(fleet_run):
    empty = sorted(key for key, result in fleet_run["queries"].items() if not has_data(result))
    assert empty == sorted(EMPTY_QUERIES), {key: fleet_run["queries"][key] for key in empty}
    assert not any("labelsToFields" in title for title, _ in fleet_run["queries"])
    filled = {title for (title, _), result in fleet_run["queries"].items() if has_data(result)}
    assert filled == {title for title, _ in fleet_run["queries"]} - {
        "Load GB/s on $instance", "Offload GB/s on $instance", "Pin evictions and refusals",
        "Unexplained RSS growth per hour (the alert's fits)"}


def test_failed_scrapes_neither_resolve_nor_page_again(fleet_run):
    ups = [float(value) for series in fleet_run["gap_up"] for _, value in series["values"]]
    assert 0.0 in ups, fleet_run["gap_up"]   # the stopped server failed its scrapes (its series went stale)
    paging = ("ComfyMemxRootedLeak", "ComfyMemxFreeLeftSurvivors")

    def active(alerts):
        return {(a["labels"]["alertname"], a["labels"]["package"]): a["activeAt"] for a in alerts
                if a["labels"]["alertname"] in paging and a["state"] == "firing"}
    before, after = active(fleet_run["before_gap"]), active(fleet_run["after_gap"])
    assert len(before) == 4 and after == before, (before, after)   # same alerts, active since the same moment
    # and firing at every step from the gap's start to 5 s after its end (one resolved evaluation leaves a hole)
    start, end = fleet_run["gap"]
    window = fleet_run["gap_alerts_window"]
    wanted = [t for t in (window[0] + step for step in range(int(window[1] - window[0]) + 1)) if start <= t <= end + 5]
    holes = {(series["metric"]["alertname"], series["metric"]["package"]):
             [t for t in wanted if round(t, 3) not in {round(float(at), 3) for at, _ in series["values"]}]
             for series in fleet_run["gap_alerts"] if series["metric"]["alertname"] in paging}
    assert len(holes) == 4 and not any(holes.values()), holes


def test_a_release_ends_its_models_alerts_for_good_and_a_refused_one_raises_its_own(fleet_run):
    released = fleet_run["released"]
    assert released["http_status"] == 200 and released["body"]["release"]["outcome"] == "released", released
    refused = fleet_run["refused"]
    assert refused["http_status"] == 422 and refused["body"]["release"]["outcome"] == "refused", refused
    alerts = fleet_run["after_release"]
    assert packages_firing(alerts, "ComfyMemxRootedLeak") == [HOLDER], alerts
    assert packages_firing(alerts, "ComfyMemxFreeLeftSurvivors") == [HOLDER], alerts
    [failed] = firing(alerts, "ComfyMemxReleaseFailed")
    assert failed["labels"]["package"] == HOLDER and failed["labels"]["outcome"] == "refused", failed
    assert fleet_run["refired"] == [], fleet_run["refired"]


def test_reloads_are_charged_to_the_unloading_pack_in_prometheus(fleet_run):
    result = fleet_run["queries"][("Reload seconds per hour by cause package", "A")]
    assert {series["metric"].get("cause_package") for series in result if has_data([series])} == {UNLOADER_PACK}
