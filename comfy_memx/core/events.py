"""The event stream: one JSON object per line in ``COMFY_MEMX_EVENTS``, plus in-process subscribers.

Every event has ``event``, ``time`` (unix seconds) and ``pid``.  Writing never blocks ComfyUI for long and never
fails it: each line is one buffered write plus a flush, and a path that cannot be opened or written is reported once
and then ignored while ComfyUI runs on.

Lock rule (README, "Threads and locks"): the file lock is re-entrant.  Opening the file or writing a line may
allocate and so run a garbage collection whose callbacks could emit an event on the same thread; that event is
written whole, before or after the interrupted line, never inside it.
"""

import json
import logging
import os
import threading
import time

from comfy_memx.core.errors import internal_error

log = logging.getLogger("comfy_memx")


class EventLog:
    """Fan-out of events to an optional JSONL file and to subscriber callbacks (metrics, tests)."""

    def __init__(self, path=None):
        self.path = path
        self._file = None
        self._broken = False
        self._lock = threading.RLock()
        self._subscribers = []

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

    def emit(self, event, **fields):
        """Record one event; returns the dict that was written (or None when nobody listens)."""
        if not self.wanted:
            return None
        record = {"event": event, "time": round(time.time(), 6), "pid": os.getpid(), **fields}
        for callback in list(self._subscribers):
            try:
                callback(record)
            except Exception as exc:
                internal_error(f"event subscriber {getattr(callback, '__name__', callback)!r}", exc)
        if self.path is not None and not self._broken:
            self._write(record)
        return record

    def _write(self, record):
        line = json.dumps(record, default=str, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                if self._file is None:
                    self._file = open(self.path, "a", encoding="utf-8")
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                self._broken = True
                log.warning("comfy_memx: cannot write events to %s (%s); event logging is off, ComfyUI continues",
                            self.path, exc)

    def close(self):
        """Close the file (tests, shutdown); later events reopen it."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass
                self._file = None
