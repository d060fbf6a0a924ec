"""The event stream: one JSON object per line in ``COMFY_MEMX_EVENTS``, plus in-process subscribers.

Every event has ``event``, ``time`` (unix seconds) and ``pid``.  Writing never blocks ComfyUI for long and never
fails it.  The file behaves like a log file:

* opened by ``core.private``'s rules: created with mode 0600 whatever the umask (its ``free`` lines name the
  callers' addresses), no link followed that another user made, the file itself never a link, an existing file
  used only when ``fstat`` says it is this user's regular file that group and others cannot write (and private, in
  a folder others can write); the same checks refuse a bad ``COMFY_MEMX_EVENTS`` at start-up (``core.config``),
  and a file that turns into something refused later (a FIFO, socket or device included: opened without blocking)
  switches the file off with one warning;
* renamed or deleted (logrotate) is noticed at the next line, as ``logging.handlers.WatchedFileHandler`` does: the
  path is compared with the open file (device and inode) and reopened;
* each line is one ``os.write`` of the whole line to a descriptor opened with ``O_APPEND``; a write cut short (the
  disk filled up mid-line) is cut back to the line's start, so the file never holds a partial line (a partial last
  line left by a crash before comfy_memx is closed with a newline when the file is opened);
* out of space (``ENOSPC``, ``EDQUOT``, ``EFBIG``): one warning, the events are dropped and counted, a write is
  tried again at most once per :data:`RETRY_S`, and when one succeeds an ``events_dropped`` line says how many were
  lost; any other error switches the file off with one warning while ComfyUI runs on;
* no file I/O on the server's event loop: an event emitted while a loop named by :meth:`EventLog.avoid_loop` runs on
  this thread (ComfyUI's server loop, named by ``surface.routes.register``) is handed to a writer thread; the prompt
  worker's own loop (ComfyUI runs each prompt in one) writes directly, line by line, as before;
* events written for HTTP requests (:meth:`EventLog.emit_request`) are limited to ``request_rate`` lines per
  second; the rest are dropped from the file and counted (``events_dropped`` with ``reason: "rate"``).  The limit
  is the file's only: every subscriber (the metrics' counters, the timeline) still sees every event, so a counter
  never misses a free or a release that the file had no room for.

Lock rule (docs/architecture.md, "Threads and locks"): the file lock is re-entrant.  Opening the file or writing a
line may allocate and so run a garbage collection whose callbacks could emit an event on the same thread; that event is
written whole, before or after the interrupted line, never inside it.
"""

import collections
import errno
import json
import logging
import os
import sys
import threading
import time
import weakref

from comfy_memx.core.errors import internal_error
from comfy_memx.core.private import open_private

log = logging.getLogger("comfy_memx")

RETRY_S = 1.0          # while the disk is full, a write is tried again at most this often
NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
# read and write: the last byte of an existing file is read from this descriptor, never from the path again
OPEN_FLAGS = (os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
              | getattr(os, "O_NOCTTY", 0))
QUEUE_LIMIT = 10000    # lines waiting for the writer thread; beyond it they are dropped and counted


class EventLog:
    """Fan-out of events to an optional JSONL file and to subscriber callbacks (metrics, tests)."""

    def __init__(self, path=None, request_rate=20, avoided_loops=None):
        self.path = path
        # event loops on which no file I/O may happen (ComfyUI's server loop); STATE passes one set to every log
        self.avoided_loops = avoided_loops if avoided_loops is not None else weakref.WeakSet()
        self.request_rate = max(1, int(request_rate))
        self.dropped = collections.Counter()   # reason ("no_space", "rate", "queue") -> events not written
        self._fd = None
        self._identity = None                  # (st_dev, st_ino) of the open file
        self._broken = False
        self._stalled_until = None             # monotonic time of the next try while out of space
        self._unreported = collections.Counter()  # drops not yet said in an events_dropped line
        self._lock = threading.RLock()
        self._subscribers = []
        self._bucket = [float(self.request_rate), time.monotonic()]  # tokens, when last filled
        self._queue = collections.deque()
        self._writer = None
        self._wake = threading.Event()

    @property
    def wanted(self):
        """True when someone listens; callers skip building events otherwise."""
        return (self.path is not None and not self._broken) or bool(self._subscribers)

    def subscribe(self, callback):
        """Call ``callback(event_dict)`` for every event from now on; returns ``callback`` for later unsubscribe."""
        self._subscribers.append(callback)
        return callback

    def unsubscribe(self, callback):
        """Stop calling ``callback``; unknown callbacks are ignored."""
        if callback in self._subscribers:
            self._subscribers.remove(callback)

    def avoid_loop(self, loop):
        """Never write the events file while ``loop`` runs on the emitting thread (lines go to a writer thread)."""
        if loop is not None:
            self.avoided_loops.add(loop)

    def emit(self, event, **fields):
        """Record one event; returns the dict that was written (or None when nobody listens)."""
        return self._emit(event, fields, to_file=True)

    def _emit(self, event, fields, to_file):
        if not self.wanted:
            return None
        record = {"event": event, "time": round(time.time(), 6), "pid": os.getpid(), **fields}
        for callback in list(self._subscribers):
            try:
                callback(record)
            except Exception as exc:
                internal_error(f"event subscriber {getattr(callback, '__name__', callback)!r}", exc)
        if to_file and self.path is not None and not self._broken:
            line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
            if _running_loop_in(self.avoided_loops):
                self._hand_over(line)
            else:
                self._write(line)
        return record

    def emit_request(self, event, **fields):
        """:meth:`emit` for an event caused by an HTTP request: at most ``request_rate`` of them per second are
        written to the file; beyond that its line is dropped and counted, while the subscribers (the metrics'
        counters) still see it.  Returns the event when its line was written (or there is no file), else None."""
        if not self.wanted:
            return None
        if self.path is None or self._broken:
            return self._emit(event, fields, to_file=False)
        with self._lock:
            tokens, filled = self._bucket
            now = time.monotonic()
            tokens = min(float(self.request_rate), tokens + (now - filled) * self.request_rate)
            allowed = tokens >= 1.0
            self._bucket[:] = [tokens - 1.0 if allowed else tokens, now]
            if not allowed:
                self.dropped["rate"] += 1
                self._unreported["rate"] += 1
        record = self._emit(event, fields, to_file=allowed)
        return record if allowed else None

    def stats(self):
        """What the file did: ``path``, ``writing`` (False once switched off), ``stalled`` (out of space now) and
        ``dropped`` ({reason: events})."""
        return {"path": self.path, "writing": self.path is not None and not self._broken,
                "stalled": self._stalled_until is not None, "dropped": dict(self.dropped)}

    # -- the file --------------------------------------------------------------------------------------------------

    def _write(self, line):
        data = line.encode("utf-8")
        with self._lock:
            if self._broken:
                return
            now = time.monotonic()
            if self._stalled_until is not None and now < self._stalled_until:
                self._drop("no_space")
                return
            try:
                self._ensure_open()
                if self._unreported:
                    self._write_dropped()
                self._write_line(data)
            except OSError as exc:
                if exc.errno in NO_SPACE:
                    self._out_of_space(exc)
                else:
                    self._switch_off(exc)
            else:
                if self._stalled_until is not None:
                    self._stalled_until = None
                    log.warning("comfy_memx: events file %s is writable again; %d event(s) were dropped meanwhile",
                                self.path, self.dropped["no_space"])

    def _write_line(self, data):
        start = os.lseek(self._fd, 0, os.SEEK_END)
        written = 0
        try:
            written = os.write(self._fd, data)
        finally:
            if 0 < written < len(data):
                self._cut_back(start, written)
        if written < len(data):
            raise OSError(errno.ENOSPC, "short write (no space left on device?)")

    def _cut_back(self, start, written):
        """Remove the part of a line that was written (only when nothing else was appended after it)."""
        try:
            if os.fstat(self._fd).st_size == start + written:
                os.ftruncate(self._fd, start)
        except OSError:
            pass

    def _write_dropped(self):
        counts, self._unreported = dict(self._unreported), collections.Counter()
        record = {"event": "events_dropped", "time": round(time.time(), 6), "pid": os.getpid(),
                  "dropped": counts, "total": dict(self.dropped)}
        try:
            self._write_line((json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8"))
        except OSError:
            self._unreported.update(counts)
            raise

    def _drop(self, reason):
        self.dropped[reason] += 1
        self._unreported[reason] += 1

    def _out_of_space(self, exc):
        first = self._stalled_until is None
        self._stalled_until = time.monotonic() + RETRY_S
        self._drop("no_space")
        if first:
            log.warning("comfy_memx: cannot write events to %s (%s); events are dropped and counted until there is "
                        "room again, ComfyUI continues", self.path, exc.strerror or exc)

    def _switch_off(self, exc):
        self._broken = True
        self._close_fd()
        log.warning("comfy_memx: cannot write events to %s (%s); event logging is off, ComfyUI continues (check "
                    "COMFY_MEMX_EVENTS / --events)", self.path, getattr(exc, "strerror", None) or exc)

    def _ensure_open(self):
        """Open the file, or reopen it when the path no longer names the open file (renamed or deleted)."""
        if self._fd is not None:
            try:
                info = os.stat(self.path)
                if (info.st_dev, info.st_ino) == self._identity:
                    return
            except FileNotFoundError:
                pass
            self._close_fd()
        fd = open_private(self.path, OPEN_FLAGS)   # core.private.Refused (an OSError) switches the file off
        try:
            info = os.fstat(fd)
            _end_with_newline(fd, info.st_size)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._identity = fd, (info.st_dev, info.st_ino)

    def _close_fd(self):
        fd, self._fd, self._identity = self._fd, None, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the writer thread (events emitted on an event loop) --------------------------------------------------------

    def _hand_over(self, line):
        with self._lock:
            if len(self._queue) >= QUEUE_LIMIT:
                self._drop("queue")
                return
            self._queue.append(line)
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._drain_forever, name="comfy_memx-events", daemon=True)
                self._writer.start()
        self._wake.set()

    def _drain_forever(self):
        while True:
            self._wake.wait(1.0)
            self._wake.clear()
            self.flush()
            with self._lock:
                if not self._queue:
                    self._writer = None
                    return

    def flush(self):
        """Write the lines handed to the writer thread now (tests, shutdown)."""
        while True:
            try:
                line = self._queue.popleft()
            except IndexError:
                return
            self._write(line)

    def close(self):
        """Write what is queued and close the file (tests, shutdown); later events reopen it."""
        with self._lock:
            self.flush()
            self._close_fd()


def _end_with_newline(fd, size):
    """A file left with a partial last line (a crash mid-write before comfy_memx) gets a newline first, so the next
    line starts on its own.  The byte is read from ``fd`` itself: the path is never opened again."""
    if size == 0:
        return
    try:
        last = os.pread(fd, 1, size - 1) if hasattr(os, "pread") else _read_at(fd, size - 1)
    except OSError:
        return
    if last not in (b"\n", b""):
        os.write(fd, b"\n")


def _read_at(fd, offset):
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, 1)


def _running_loop_in(loops):
    """Whether the event loop running on this thread is one of ``loops``."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None or not loops:
        return False
    try:
        loop = asyncio.events._get_running_loop()
    except Exception:
        return False
    return loop is not None and loop in loops
