import json
import os

from comfy_memx.core.events import EventLog


def test_events_are_json_lines_with_event_time_pid(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))
    log.emit("load", model="M", bytes=3)
    log.emit("unload", model="M", reason="other")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["load", "unload"]
    assert all(line["pid"] == os.getpid() and isinstance(line["time"], float) for line in lines)


def test_unwritable_path_is_reported_once_and_never_raises(tmp_path, caplog):
    log = EventLog(str(tmp_path / "missing-dir" / "events.jsonl"))
    for _ in range(3):
        log.emit("load", model="M")
    warnings = [r for r in caplog.records if "cannot write events" in r.getMessage()]
    assert len(warnings) == 1
    assert not log.wanted


def test_nobody_listening_means_no_work():
    log = EventLog(None)
    assert log.emit("load") is None
    seen = log.subscribe(lambda e: None) and []
    log.subscribe(seen.append)
    log.emit("load", model="M")
    assert seen[0]["model"] == "M"
