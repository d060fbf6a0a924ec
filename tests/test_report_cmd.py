"""``python -m comfy_memx report``: per model and per package, malformed lines counted and skipped, the PNG."""

import builtins
import json
import subprocess
import sys

import pytest

from comfy_memx.cli import report

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
    assert "BaseModel#1  BaseModel  package leaky_pack  peak resident 3.8 MiB" in text
    assert "unloads free_request 1, memory_pressure 1 (3.8 MiB, 1.000 GB/s)" in text
    assert "held by leaky_pack.LeakyLoader._cache['a']  [package leaky_pack, class_attribute]" in text
    assert "\nper package\n  core\n" in text


def test_events_of_several_processes_stay_apart(tmp_path, capsys):
    path = tmp_path / "two.jsonl"
    other = GOOD[0].replace('"pid": 7', '"pid": 8')
    path.write_text(GOOD[0] + "\n" + other + "\n", encoding="utf-8")
    data = run_json(path, capsys)
    assert [(m["pid"], m["model_id"], m["loads"]) for m in data["models"]] == [(7, "BaseModel#1", 1),
                                                                              (8, "BaseModel#1", 1)]
    assert data["packages"][0]["loads"] == 2


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
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    assert report.main([str(events_file), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resident_bytes_timeline_steps():
    r = report.EventReport()
    for line in GOOD:
        r.add_line(line)
    assert r.timeline[(7, "BaseModel#1")] == [(1000.0, 4_000_000), (1002.0, 3_000_000), (1003.0, 0)]


def test_the_launcher_runs_the_report_command(events_file):
    out = subprocess.run([sys.executable, "-m", "comfy_memx", "report", str(events_file)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "per package" in out.stdout
