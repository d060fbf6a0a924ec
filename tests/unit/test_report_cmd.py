"""``python -m comfy_memx report``: per model and per package, malformed lines counted and skipped, the PNG, and
the ``release`` events (a released model is no longer leaked; bytes given back per holding package)."""

import builtins
import json
import subprocess
import sys

import pytest

from comfy_memx.cli import report
from memx_helpers import mode_of, umask

OWNER = {"prompt_id": "p1", "node_id": "1", "class_type": "LeakyLoader", "package": "leaky_pack"}
CORE = {"prompt_id": "p1", "node_id": "4", "class_type": "SimSampler", "package": "core"}


def ev(event, t, **fields):
    return json.dumps({"event": event, "time": 1000.0 + t, "pid": 7, **fields})


def identity(model_id, owner, model="BaseModel"):
    return {"model": model, "model_id": model_id, "patcher_id": 1, "model_bytes": 4_000_000, "device": "cuda:0",
            "owner": owner}


GOOD = [
    ev("load", 0, **identity("BaseModel#1", OWNER), bytes=4_000_000, loaded_bytes=4_000_000, seconds=0.002,
       gb_per_s=2.0),
    ev("load", 1, **identity("SDXL#1", CORE, "SDXL"), bytes=2_000_000, loaded_bytes=2_000_000, seconds=0.001,
       gb_per_s=2.0),
    ev("unload", 2, **identity("BaseModel#1", OWNER), reason="memory_pressure", bytes=1_000_000, partial=True,
       refcounts={"patcher": 1, "module": 2}, extra_referrers=0, seconds=0.001, gb_per_s=1.0),
    ev("unload", 3, **identity("BaseModel#1", OWNER), reason="free_request", bytes=3_000_000, partial=False,
       refcounts={"patcher": 0, "module": 2}, extra_referrers=1, seconds=0.003, gb_per_s=1.0),
    ev("leak", 4, model="BaseModel", model_id="BaseModel#1", owner=OWNER, stage="rooted",
       referrers=[{"path": "leaky_pack.LeakyLoader._cache['a']", "package": "leaky_pack",
                   "root_kind": "class_attribute"}], search={"seconds": 0.1, "objects_visited": 3, "complete": True}),
    ev("pin_evict", 5, model="BaseModel", model_id="BaseModel#1", bytes=500, reason="cap", policy="mru",
       scope="process", for_model_id="SDXL#1"),
    ev("pin_refused", 6, model="SDXL", model_id="SDXL#1", bytes=10, reason="over_cap"),
]
MALFORMED = [
    "{not json",
    "[1, 2, 3]",
    json.dumps({"time": 1000.0, "model_id": "X#1"}),                       # no event name
    ev("load", 7, **identity(5, OWNER), bytes=1, loaded_bytes=1, seconds=0.1),   # model_id not a string
    ev("unload", 8, **identity("BaseModel#1", OWNER), reason="other", bytes="many", seconds=0.1),
    json.dumps({"event": "load", "model_id": "BaseModel#1"}),              # no time
    '{"event": "load", "time": 1001.0, "model_id": "Trunc',                # a line cut short by a crash
]


@pytest.fixture
def events_file(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = GOOD[:3] + MALFORMED[:4] + GOOD[3:] + ["", "   "] + MALFORMED[4:]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def run_json(path, capsys):
    assert report.main([str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_per_model_and_per_package_figures(events_file, capsys):
    data = run_json(events_file, capsys)
    assert data["events"] == len(GOOD) and data["malformed_lines"] == len(MALFORMED)
    assert data["other_events"] == 1 and data["processes"] == 1 and data["seconds"] == 6.0
    base, sdxl = data["models"]
    assert (base["model_id"], base["model"], base["package"]) == ("BaseModel#1", "BaseModel", "leaky_pack")
    assert base["loads"] == 1 and base["load_bytes"] == 4_000_000 and base["load_gb_per_s"] == 2.0
    assert base["unloads"] == {"free_request": 1, "memory_pressure": 1} and base["unload_bytes"] == 4_000_000
    assert base["unload_gb_per_s"] == 1.0 and base["peak_resident_bytes"] == 4_000_000
    assert base["leaks"] == {"rooted": 1} and base["pin_evictions"] == 1 and base["pin_evicted_bytes"] == 500
    [leak] = base["leak_reports"]
    assert leak["stage"] == "rooted" and leak["chains"] == [{"path": "leaky_pack.LeakyLoader._cache['a']",
                                                             "package": "leaky_pack", "root_kind": "class_attribute"}]
    assert (sdxl["model_id"], sdxl["package"], sdxl["loads"], sdxl["unloads"]) == ("SDXL#1", "core", 1, {})
    packages = {row["package"]: row for row in data["packages"]}
    assert set(packages) == {"core", "leaky_pack"}
    assert packages["leaky_pack"]["loads"] == 1 and packages["leaky_pack"]["leaks"] == {"rooted": 1}
    assert packages["core"]["load_bytes"] == 2_000_000 and packages["core"]["load_gb_per_s"] == 2.0


def test_text_report_names_models_packages_chains_and_the_skipped_lines(events_file, capsys):
    assert report.main([str(events_file)]) == 0
    text = capsys.readouterr().out
    assert f"{len(GOOD)} events" in text and f"{len(MALFORMED)} malformed line(s) skipped" in text
    assert "BaseModel#1  BaseModel  loaded by package leaky_pack, held by package leaky_pack  peak resident 3.8 MiB" \
        in text
    assert "unloads free_request 1, memory_pressure 1 (3.8 MiB, 1.000 GB/s)" in text
    assert "held by leaky_pack.LeakyLoader._cache['a']  [package leaky_pack, class_attribute]" in text
    assert "\nper package\n  core\n" in text


def test_the_package_table_credits_a_leak_to_the_package_that_holds_it_not_the_one_that_loaded_it(tmp_path, capsys):
    loader = {"prompt_id": "p1", "node_id": "2", "class_type": "UBApplyModel", "package": "ComfyUI-UtilityBelt"}
    lines = [
        {"event": "load", "time": 1.0, "pid": 7, "model": "StyleNet", "model_id": "StyleNet#1", "owner": loader,
         "bytes": 1000, "seconds": 0.001, "device": "cuda:0", "copied": True},
        {"event": "leak", "time": 2.0, "pid": 7, "model": "StyleNet", "model_id": "StyleNet#1", "owner": loader,
         "stage": "rooted", "reason": "new", "holder_package": "StyleMixer",
         "referrers": [{"path": "StyleMixer.StyleMixer._cache[(1328, 1328)]", "package": "StyleMixer",
                        "holder_package": "StyleMixer", "root_kind": "class_attribute", "pattern": "class_cache",
                        "suggestion": "cache per instance"}]},
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    data = run_json(path, capsys)
    packages = {row["package"]: row for row in data["packages"]}
    assert packages["StyleMixer"]["leaks"] == {"rooted": 1} and packages["StyleMixer"]["loads"] == 0
    assert packages["ComfyUI-UtilityBelt"]["leaks"] == {} and packages["ComfyUI-UtilityBelt"]["loads"] == 1
    assert packages["ComfyUI-UtilityBelt"]["leaked_loads"] == {"rooted": 1}
    [model] = data["models"]
    assert model["package"] == "ComfyUI-UtilityBelt" and model["holder_package"] == "StyleMixer"
    assert [(p["package"], p["pattern"]) for p in data["leak_patterns"]] == [("StyleMixer", "class_cache")]
    assert report.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "loaded by package ComfyUI-UtilityBelt, held by package StyleMixer" in text
    assert "  StyleMixer\n    loads 0" in text and "leaks held rooted 1" in text
    # the model's own line agrees with the packages': it leaked (rooted 1), never "its loads that leaked none"
    model_line = text.split("StyleNet#1  StyleNet")[1].splitlines()[1]
    assert "; leaked rooted 1;" in model_line and "that leaked" not in model_line, model_line
    assert "its loads that leaked rooted 1" in text.split("  ComfyUI-UtilityBelt\n")[1].splitlines()[0]


def test_events_of_several_processes_stay_apart(tmp_path, capsys):
    path = tmp_path / "two.jsonl"
    other = GOOD[0].replace('"pid": 7', '"pid": 8')
    path.write_text(GOOD[0] + "\n" + other + "\n", encoding="utf-8")
    data = run_json(path, capsys)
    assert [(m["pid"], m["model_id"], m["loads"]) for m in data["models"]] == [(7, "BaseModel#1", 1),
                                                                              (8, "BaseModel#1", 1)]
    assert data["packages"][0]["loads"] == 2


def test_events_that_copied_nothing_claim_no_transfer_rate(tmp_path, capsys):
    """Under --cpu the events say copied: false; their bytes count, their seconds make no GB/s."""
    path = tmp_path / "cpu.jsonl"
    lines = [ev("load", 0, **identity("BaseModel#1", OWNER), bytes=4_000_000, loaded_bytes=4_000_000, seconds=0.002,
                gb_per_s=None, copied=False),
             ev("unload", 1, **identity("BaseModel#1", OWNER), reason="free_request", bytes=4_000_000,
                partial=False, refcounts={"patcher": 0, "module": 1}, extra_referrers=0, seconds=0.001,
                gb_per_s=None, copied=False),
             ev("load", 2, **identity("SDXL#1", OWNER, "SDXL"), bytes=2_000_000, loaded_bytes=2_000_000,
                seconds=0.001, gb_per_s=2.0, copied=True)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = run_json(path, capsys)
    base, sdxl = (next(m for m in data["models"] if m["model_id"] == name) for name in ("BaseModel#1", "SDXL#1"))
    assert base["load_bytes"] == 4_000_000 and base["load_gb_per_s"] is None and base["unload_gb_per_s"] is None
    assert sdxl["load_gb_per_s"] == 2.0
    [package] = data["packages"]
    assert package["load_bytes"] == 6_000_000 and package["load_gb_per_s"] == 2.0   # the copying load alone
    assert report.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "loads 1 (3.8 MiB, no timed copy)" in text, text


def test_unreadable_file_is_exit_status_2(tmp_path, capsys):
    assert report.main([str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_png_without_matplotlib_prints_the_report_and_a_hint(events_file, tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError("no matplotlib here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    png = tmp_path / "timeline.png"
    assert report.main([str(events_file), "--png", str(png)]) == 1
    out = capsys.readouterr()
    assert "per model" in out.out and report.PLOT_HINT in out.err and not png.exists()


def test_png_timeline(events_file, tmp_path, capsys):
    png = tmp_path / "timeline.png"
    with umask(0o022):
        assert report.main([str(events_file), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert mode_of(png) == 0o600                   # it names models and packages: this user's only


def timeline_of(lines):
    """(report, its timeline figure, the figure's one axes, artists by gid); matplotlib is in the test extra."""
    r = report.EventReport()
    for line in lines:
        r.add_line(line)
    figure = report.draw_timeline(r)
    figure.canvas.draw()
    (axes,) = figure.axes
    return r, figure, axes, {line.get_gid(): line for line in axes.get_lines() if line.get_gid()}


def visible_width_px(axes, line):
    """How many pixels of the x axis ``line`` covers inside the axes' limits."""
    low, high = axes.get_xlim()
    xs = [float(x) for x in line.get_xdata()]
    left, right = max(min(xs), low), min(max(xs), high)
    if right <= left:
        return 0.0
    (x0, _), (x1, _) = axes.transData.transform([(left, 0), (right, 0)])
    return x1 - x0


def points(line):
    return list(zip((float(x) for x in line.get_xdata()), (float(y) for y in line.get_ydata())))


def test_timeline_has_one_visible_lane_per_model_and_marks_loads_unloads_and_leaks():
    r, figure, axes, by_gid = timeline_of(GOOD)
    models = [line for gid, line in by_gid.items() if gid.startswith("model:")]
    assert sorted(line.get_gid() for line in models) == ["model:7:BaseModel#1", "model:7:SDXL#1"]
    assert r.models[(7, "SDXL#1")]["tally"].loads == 1 and not r.models[(7, "SDXL#1")]["tally"].unloads
    low, high = axes.get_ylim()
    lanes = {}
    for line in models:
        ys = [y for _, y in points(line)]
        assert line.get_visible() and line.get_linewidth() >= 1.5 and line.get_alpha() in (None, 1.0)
        assert visible_width_px(axes, line) >= 0.3 * axes.bbox.width, line.get_gid()
        assert low < min(ys) <= max(ys) < high
        assert max(ys) > min(ys), "resident bytes must lift the line off its lane's base"
        lanes[line.get_gid()] = (min(ys), max(ys))
    (a_low, a_high), (b_low, b_high) = lanes.values()
    assert a_high < b_low or b_high < a_low, "two models share a lane"

    # the single load of SDXL#1 (t = 1 s) stays resident to the end of the log (t = 6 s) and beyond
    sdxl = points(by_gid["model:7:SDXL#1"])
    assert sdxl[0][0] <= 1.0 and sdxl[-1][0] > 6.0 and sdxl[-1][1] == max(y for _, y in sdxl)

    base_low, base_high = lanes["model:7:BaseModel#1"]
    unloads, leaks, loads = (points(by_gid[f"marks:{kind}"]) for kind in ("unload", "leak", "load"))
    assert [x for x, _ in unloads] == [2.0, 3.0] and all(base_low <= y <= base_high for _, y in unloads)
    assert unloads[0][1] > unloads[1][1] == base_low      # 3 MB left after the partial unload, then none
    assert [x for x, _ in leaks] == [4.0] and base_low <= leaks[0][1] <= base_high
    assert [x for x, _ in loads] == [0.0, 1.0]
    for kind in ("load", "unload", "leak"):
        marker = by_gid[f"marks:{kind}"]
        assert marker.get_visible() and marker.get_marker() not in (None, "", "None", " ")
        assert marker.get_markersize() >= 6 and marker.get_linestyle() in ("None", "none", "", " ")
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert {"load", "unload", "leak"} <= set(legend)
    assert any("leak (rooted)" == text.get_text() for text in axes.texts)
    ticks = [label.get_text() for label in axes.get_yticklabels()]
    assert any(t.startswith("BaseModel#1") and "leaky_pack" in t for t in ticks)
    assert any(t.startswith("SDXL#1") and "core" in t for t in ticks)


def test_a_log_of_one_load_still_draws_a_visible_lane():
    r, figure, axes, by_gid = timeline_of([GOOD[0]])
    line = by_gid["model:7:BaseModel#1"]
    assert visible_width_px(axes, line) >= 0.3 * axes.bbox.width
    assert len(points(by_gid["marks:load"])) == 1 and points(by_gid["marks:leak"]) == []


def test_a_model_loaded_by_the_last_event_of_the_log_is_visible():
    late = ev("load", 6, **identity("Late#1", CORE, "Late"), bytes=1_000, loaded_bytes=1_000, seconds=0.001)
    r, figure, axes, by_gid = timeline_of(GOOD[:2] + [late])
    assert visible_width_px(axes, by_gid["model:7:Late#1"]) >= 20
    several = timeline_of([GOOD[0], GOOD[0].replace('"pid": 7', '"pid": 8')])[3]
    assert {"model:7:BaseModel#1", "model:8:BaseModel#1"} <= set(several)


def test_resident_bytes_timeline_steps():
    r = report.EventReport()
    for line in GOOD:
        r.add_line(line)
    assert r.timeline[(7, "BaseModel#1")] == [(1000.0, 4_000_000), (1002.0, 3_000_000), (1003.0, 0)]


def test_the_launcher_runs_the_report_command(events_file):
    out = subprocess.run([sys.executable, "-m", "comfy_memx", "report", str(events_file)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "per package" in out.stdout


def test_reload_time_is_grouped_by_cause_and_model_and_sightings_are_not_new_leaks():
    from comfy_memx.cli import report
    owner = {"prompt_id": "p", "node_id": "3", "class_type": "KSampler", "package": "core"}
    cause = {"cause": "ComfyUI-Unload-Model/UnloadAllModels", "package": "ComfyUI-Unload-Model",
             "reason": "unload_all"}
    lines = [
        {"event": "load", "time": 1.0, "model": "BaseModel", "model_id": "BaseModel#1", "owner": owner,
         "bytes": 100, "seconds": 2.0, "reload": None},
        {"event": "load", "time": 2.0, "model": "BaseModel", "model_id": "BaseModel#1", "owner": owner,
         "bytes": 100, "seconds": 2.0, "reload": {**cause, "seconds": 2.0, "bytes": 100}},
        {"event": "load", "time": 3.0, "model": "BaseModel", "model_id": "BaseModel#1", "owner": owner,
         "bytes": 100, "seconds": 3.0, "reload": {**cause, "seconds": 3.0, "bytes": 100}},
        {"event": "load", "time": 4.0, "model": "VAE", "model_id": "VAE#1", "owner": owner,
         "bytes": 10, "seconds": 9.0, "reload": {"cause": "core/KSampler loading BaseModel", "seconds": 9.0,
                                                  "bytes": 10}},
        {"event": "leak", "time": 5.0, "model": "VAE", "model_id": "VAE#1", "owner": owner, "stage": "rooted",
         "referrers": [], "reason": "new"},
        {"event": "leak_seen", "time": 6.0, "model": "VAE", "model_id": "VAE#1", "owner": owner, "sightings": 2},
        {"event": "leak", "time": 7.0, "model": "VAE", "model_id": "VAE#1", "owner": owner, "stage": "rooted",
         "referrers": [], "reason": "holders_changed"},
        {"event": "thrash", "time": 8.0, "model": "BaseModel", "model_id": "BaseModel#1"},
    ]
    built = report.EventReport()
    for line in lines:
        built.add_line(json.dumps(line))
    data = built.as_dict()
    assert data["reload_causes"] == [
        {"cause": "core/KSampler loading BaseModel", "model": "VAE", "reloads": 1, "seconds": 9.0, "bytes": 10},
        {"cause": "ComfyUI-Unload-Model/UnloadAllModels", "model": "BaseModel", "reloads": 2, "seconds": 5.0,
         "bytes": 200}]
    vae = next(row for row in data["models"] if row["model_id"] == "VAE#1")
    assert vae["leaks"] == {"rooted": 1} and vae["leak_sightings"] == 2 and len(vae["leak_reports"]) == 2
    text = report.format_text(built, "e.jsonl")
    assert "ComfyUI-Unload-Model/UnloadAllModels caused 2 reload(s) of BaseModel, 5.0 s (200 B)" in text
    assert data["thrash_warnings"] == 1 and "1 thrash warning(s)" in text


RELEASED = ev("release", 5, model="BaseModel", model_id="BaseModel#1", trigger="auto", outcome="released",
              package="leaky_pack", pattern="class_cache", path="leaky_pack.LeakyLoader._cache['a']",
              cut="leaky_pack.LeakyLoader._cache['a']", bytes=4_000_000, died=True,
              models=[{"model": "BaseModel", "model_id": "BaseModel#1", "bytes": 4_000_000, "died": True},
                      {"model": "Vae", "model_id": "Vae#2", "bytes": 1_000, "died": False}],
              released_bytes=4_000_000)
NOT_CUT = ev("release", 5.5, model="SDXL", model_id="SDXL#1", trigger="http", outcome="in_use", package="pack_x",
             bytes=2_000_000, died=False, reason="prompt p1, which loaded it, is still running")


def test_a_released_model_is_reported_released_with_the_bytes_given_back_per_holding_package():
    r = report.EventReport()
    for line in GOOD[:5] + [RELEASED, NOT_CUT]:
        r.add_line(line)
    data = r.as_dict()
    assert data["malformed_lines"] == 0 and data["other_events"] == 0
    by_id = {row["model_id"]: row for row in data["models"]}
    base, vae, sdxl = by_id["BaseModel#1"], by_id["Vae#2"], by_id["SDXL#1"]
    assert base["status"] == "released" and base["released_bytes"] == 4_000_000 and base["leaks"] == {"rooted": 1}
    assert vae["status"] is None and vae["releases"] == 1 and vae["released_bytes"] == 0   # cut, still held
    assert sdxl["status"] is None and sdxl["releases"] == 0
    assert data["released_by_package"] == [{"package": "leaky_pack", "releases": 1, "models": 1,
                                            "released_bytes": 4_000_000}]
    assert data["released_bytes"] == 4_000_000 and data["release_tries_not_cut"] == {"in_use": 1}
    assert r.timeline[(7, "BaseModel#1")][-1] == (1005.0, 0)
    text = report.format_text(r, "events.jsonl")
    assert "BaseModel#1  BaseModel  loaded by package leaky_pack, was held by package leaky_pack, released" in text
    assert "leaked rooted 1, then released (no longer leaked)" in text
    assert ("released at +5.0 s by COMFY_MEMX_RELEASE=auto: cut leaky_pack.LeakyLoader._cache['a'] (package "
            "leaky_pack); freed; 3.8 MiB given back by this release") in text
    assert "Vae#2" in text and "cut, but the model was still held by something else" in text
    assert "leaky_pack: 1 release(s), 1 model(s) freed, 3.8 MiB given back" in text
    assert "releases that cut nothing: in_use 1" in text
    assert "leaks held rooted 1; released 1 model(s), 3.8 MiB given back" in text


def test_a_release_line_of_the_wrong_shape_is_counted_as_malformed():
    r = report.EventReport()
    r.add_line(ev("release", 1, outcome="released", models=[{"model_id": 5}]))
    r.add_line(ev("release", 1, outcome="released", model_id="M#1", bytes="lots", died=True))
    assert r.as_dict()["malformed_lines"] == 2 and r.releases == []


def test_a_released_models_lane_ends_at_its_release_and_the_release_is_marked():
    r, figure, axes, by_gid = timeline_of(GOOD[:2] + GOOD[4:5] + [RELEASED, ev("load", 9, **identity(
        "SDXL#1", CORE, "SDXL"), bytes=1, loaded_bytes=2_000_001, seconds=0.001)])
    base = points(by_gid["model:7:BaseModel#1"])
    assert base[-1][0] == pytest.approx(5.0), base          # no band past the release
    assert points(by_gid["model:7:SDXL#1"])[-1][0] > 9.0     # a model never released runs on past the log's end
    assert [x for x, _ in points(by_gid["marks:release"])] == [5.0, 5.0]   # BaseModel#1 and Vae#2
    assert "release" in {text.get_text() for text in axes.get_legend().get_texts()}


def test_a_model_a_pack_built_and_core_loaded_says_who_built_it(tmp_path, capsys):
    # a pack's loader built the checkpoint, ComfyUI's KSampler loaded it: "loaded by core" alone blamed core
    builder = {"prompt_id": "p1", "node_id": "3", "class_type": "CachedCheckpointLoader", "package": "LeakyLoader",
               "via": None}
    sampler = {"prompt_id": "p1", "node_id": "5", "class_type": "KSampler", "package": "core"}
    lines = [
        {"event": "created", "time": 1.0, "pid": 7, "model": "BaseModel", "model_id": "BaseModel#1", "bytes": 1000,
         "created_by": builder},
        {"event": "load", "time": 2.0, "pid": 7, "model": "BaseModel", "model_id": "BaseModel#1", "owner": sampler,
         "bytes": 1000, "seconds": 0.001, "device": "cpu", "copied": False},
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    data = run_json(path, capsys)
    [model] = data["models"]
    assert model["package"] == "core" and model["created_by"] == {key: builder[key] for key in
                                                                   ("prompt_id", "node_id", "class_type", "package")}
    assert report.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert ("BaseModel#1  BaseModel  built by package LeakyLoader (CachedCheckpointLoader, node 3), "
            "loaded by package core") in text, text
