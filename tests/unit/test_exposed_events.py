"""The events file behaves like a log file: regular files only, reopened after logrotate, a full disk
costs one warning and counted drops but never a partial line, writing resumes when space returns, no file I/O on
an asyncio event loop, and events written for HTTP requests are rate-limited with the drops counted."""

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from comfy_memx.core import config, events as eventsmod
from comfy_memx.core.errors import ConfigError
from comfy_memx.core.events import EventLog


def lines_of(path):
    text = open(path, encoding="utf-8").read()
    assert text == "" or text.endswith("\n"), "a partial last line"
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_a_path_that_is_not_a_regular_file_fails_at_startup_naming_the_option(tmp_path, kind):
    path = tmp_path / "events.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        import socket
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    else:
        path = "/dev/null"
    with pytest.raises(ConfigError) as info:
        config.parse({"COMFY_MEMX_EVENTS": str(path)}, launcher=True)
    message = str(info.value)
    assert "COMFY_MEMX_EVENTS" in message and "--events" in message and "not a regular file" in message
    with pytest.raises(ConfigError) as info:   # COMFY_MEMX=1 or the node pack: no launcher option to name
        config.parse({"COMFY_MEMX_EVENTS": str(path)})
    message = str(info.value)
    assert "COMFY_MEMX_EVENTS" in message and "--events" not in message and "not a regular file" in message


def test_the_launcher_exits_2_for_a_fifo(tmp_path):
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    main = tmp_path / "main.py"
    main.write_text("print('ComfyUI ran')\n")
    done = subprocess.run([sys.executable, "-m", "comfy_memx", "--events", str(fifo), str(main)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--events" in done.stderr and "FIFO" in done.stderr and "ComfyUI ran" not in done.stdout


@pytest.mark.parametrize("reader", [False, True])
def test_a_fifo_that_appears_later_switches_the_file_off_without_blocking(tmp_path, caplog, reader):
    path = tmp_path / "events.jsonl"
    os.mkfifo(path)
    held = os.open(path, os.O_RDONLY | os.O_NONBLOCK) if reader else None
    try:
        log = EventLog(str(path))
        for _ in range(3):
            log.emit("load", model="M")  # returns: O_NONBLOCK open, then fstat says FIFO (or no reader: ENXIO)
        assert not log.stats()["writing"]
        assert len([r for r in caplog.records if "cannot write events" in r.getMessage()]) == 1
    finally:
        if held is not None:
            os.close(held)


@pytest.mark.parametrize("how", ["renamed", "deleted"])
def test_a_rotated_file_is_reopened(tmp_path, how):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))
    log.emit("load", model="before")
    if how == "renamed":
        os.rename(path, tmp_path / "events.jsonl.1")
    else:
        os.unlink(path)
    log.emit("load", model="after")
    log.close()
    assert [line["model"] for line in lines_of(path)] == ["after"]
    if how == "renamed":
        assert [line["model"] for line in lines_of(tmp_path / "events.jsonl.1")] == ["before"]


def test_a_partial_last_line_from_a_crash_is_closed_before_the_first_event(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"event":"load","time":1,"pid":1}\n{"event":"lo')
    log = EventLog(str(path))
    log.emit("unload", model="M")
    log.close()
    rows = path.read_text().splitlines()
    assert json.loads(rows[-1])["event"] == "unload" and rows[-2] == '{"event":"lo'


@contextlib.contextmanager
def tiny_filesystem(tmp_path, size="16k"):
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) to make a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_costs_one_warning_counted_drops_no_partial_line_and_writing_resumes(tmp_path, caplog,
                                                                                         monkeypatch):
    monkeypatch.setattr(eventsmod, "RETRY_S", 0.0)
    with tiny_filesystem(tmp_path) as mount:
        path = mount / "events.jsonl"
        filler = mount / "filler"
        log = EventLog(str(path))
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)  # fill the file system up
        try:
            while os.write(fd, b"x" * 1024) == 1024:
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        payload = "y" * 3000
        for index in range(30):
            log.emit("load", model="M", index=index, payload=payload)
        dropped = log.stats()["dropped"].get("no_space", 0)
        assert dropped > 0 and log.stats()["stalled"]
        assert len([r for r in caplog.records if "dropped and counted" in r.getMessage()]) == 1
        rows = lines_of(path)   # whole lines only
        os.unlink(filler)       # space returns
        log.emit("load", model="M", index=99)
        log.close()
        after = lines_of(path)
        assert after[:len(rows)] == rows
        assert after[-2]["event"] == "events_dropped" and after[-2]["dropped"] == {"no_space": dropped}
        assert after[-1]["index"] == 99 and not log.stats()["stalled"]
        assert any("writable again" in r.getMessage() for r in caplog.records)


def test_events_emitted_on_the_server_loop_are_written_by_another_thread(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))
    writers = []
    real_write = EventLog._write

    def spy(self, line):
        writers.append(eventsmod._running_loop_in(self.avoided_loops))
        return real_write(self, line)
    monkeypatch.setattr(EventLog, "_write", spy)

    async def on_loop():
        log.avoid_loop(asyncio.get_running_loop())   # as routes.register does for ComfyUI's server loop
        log.emit("free", status="done")
    asyncio.run(on_loop())
    log.emit("load", model="M")   # off the loop: written here
    log.close()
    assert sorted(line["event"] for line in lines_of(path)) == ["free", "load"]
    assert writers == [False, False]  # both written, neither while the server loop ran on the writing thread


def test_events_emitted_on_another_loop_are_written_at_once(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path))

    async def prompt():   # ComfyUI runs each prompt in an event loop of the worker's own
        log.emit("load", model="M")
        return lines_of(path)
    assert [line["event"] for line in asyncio.run(prompt())] == ["load"]


def test_request_events_are_rate_limited_and_the_drops_counted(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(str(path), request_rate=5)
    started = time.monotonic()
    written = sum(log.emit_request("free", status="done") is not None for _ in range(200))
    elapsed = time.monotonic() - started
    assert written <= 5 + int(elapsed * 5) + 1
    assert log.stats()["dropped"]["rate"] == 200 - written
    log.emit("load", model="M")  # the next line written says what was dropped
    log.close()
    rows = lines_of(path)
    assert rows[-2]["event"] == "events_dropped" and rows[-2]["dropped"] == {"rate": 200 - written}
    assert rows[-1]["event"] == "load"
