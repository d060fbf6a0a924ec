"""Exposed surface: ``report`` skips and counts every line it cannot use, whatever numbers or nesting it holds, and a
skipped line counts nothing."""

import json

import pytest

from comfy_memx.cli import report

GOOD = {"event": "load", "time": 100.0, "pid": 7, "model": "M", "model_id": "M#1", "bytes": 1000,
        "loaded_bytes": 1000, "seconds": 0.5, "owner": {"package": "core"}}


def line(**changes):
    return json.dumps(dict(GOOD, **changes))


@pytest.mark.parametrize("bad", [
    line().replace('"bytes": 1000', '"bytes": 1e999'),
    line().replace('"time": 100.0', '"time": Infinity'),
    line().replace('"seconds": 0.5', '"seconds": NaN'),
    line().replace('"bytes": 1000', '"bytes": ' + "9" * 400),
    line().replace('"time": 100.0', '"time": -Infinity'),
    '{"event": "load", "x": ' + "[" * 100000 + "]" * 100000 + "}",
    '{"event": "load", "x": ' + "{\"a\":" * 5000 + "1" + "}" * 5000 + "}",
    line(reload=[1]),
    line(reload={"seconds": "slow"}),
    line(time="100"),
    line(pid=True),
])
def test_a_line_it_cannot_use_is_skipped_counted_and_counts_nothing(bad):
    events = report.EventReport()
    events.add_line(line())
    events.add_line(bad)
    events.add_line(line(time=101.0))
    data = events.as_dict()
    assert data["malformed_lines"] == 1 and data["events"] == 2
    [model] = data["models"]
    assert model["loads"] == 2 and model["load_bytes"] == 2000 and data["reload_causes"] == []
    text = report.format_text(events, "events.jsonl")
    assert "inf" not in text.split("\n")[0] and "1 malformed line(s) skipped" in text


def test_the_command_survives_a_hostile_log(tmp_path, capsys):
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join([line(), line().replace("1000,", "1e999,", 1), "[" * 200000, line(time=102.0)]) + "\n")
    assert report.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 events" in out and "2 malformed line(s) skipped" in out
