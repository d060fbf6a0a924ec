import json
import os

import pytest

from comfy_memx.core.events import EventLog
from memx_helpers import mode_of, umask


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


@pytest.mark.parametrize("mask", [0o022, 0o000, 0o277], ids=["umask 022", "umask 000", "umask 277"])
def test_the_events_file_is_created_0600_whatever_the_umask(tmp_path, mask):
    path = tmp_path / "events.jsonl"
    with umask(mask):
        log = EventLog(str(path))
        log.emit("free", origin={"kind": "http", "client": "192.0.2.1"})
        log.close()
        os.rename(path, str(path) + ".1")          # logrotate: the next line creates the file again
        log.emit("free", origin={"kind": "http", "client": "192.0.2.2"})
        log.close()
    assert mode_of(str(path) + ".1") == mode_of(path) == 0o600
    assert json.loads(path.read_text())["origin"]["client"] == "192.0.2.2"


def test_an_events_file_that_already_exists_keeps_its_mode(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("")
    os.chmod(path, 0o640)                          # the user's choice (a log shipper in the file's group)
    log = EventLog(str(path))
    log.emit("load", model="M")
    log.close()
    assert mode_of(path) == 0o640 and json.loads(path.read_text())["event"] == "load"
