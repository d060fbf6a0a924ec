"""A small file shared by this user's ComfyUI processes on one host: who is alive and what each one holds.

:class:`HostRegistry` keeps one entry per live process, ``{pid: {"bytes": int, "start": ticks, "data": {...}}}``:
``bytes`` is what the process reserved of a shared resource (the host-scope pin budget uses it for pinned bytes),
``data`` any small JSON-able facts a process publishes about itself (for instances that hand the GPU to each
other: device, port, state), ``start`` the process start time that tells a live process from a reused pid.

Every access takes an exclusive ``fcntl.flock`` on the file, drops the entries of processes that are gone (dead,
zombie, or a reused pid whose start time differs) and writes the result back, so a killed process's share is
reclaimed by the next access of any other.  The file is created with owner-only permissions (0600) and refused
if another user owns it.  POSIX only (needs ``fcntl``).  Standard library only; no Python lock is taken here (the
file lock is a kernel lock, released when the descriptor closes).

API: :meth:`HostRegistry.publish` (register this process: bytes and/or data), :meth:`HostRegistry.peers` (the
live processes with their bytes and data), :meth:`HostRegistry.withdraw` (leave), and
:meth:`HostRegistry.transaction` (read-modify-write of the ``{pid: bytes}`` view, for budgets that must decide
under the file lock).
"""

import contextlib
import dataclasses
import json
import logging
import os
import sys
import tempfile

from comfy_memx.core.errors import ConfigError

log = logging.getLogger("comfy_memx")

REGISTRY_NAME = "comfy_memx-pins"


@dataclasses.dataclass(frozen=True)
class Peer:
    """One live process in the registry: its ``pid``, the ``bytes`` it reserved and the ``data`` it published."""

    pid: int
    bytes: int
    data: dict


class HostRegistry:
    """The registry file at ``path`` (default :func:`default_registry_path`); see the module docstring."""

    def __init__(self, path=None):
        try:
            import fcntl  # noqa: F401  (checked here so that host scope fails at startup, not on the first pin)
        except ImportError:
            raise ConfigError("COMFY_MEMX_PIN_SCOPE=host needs fcntl (Linux or macOS); use process") from None
        self.path = path or default_registry_path()

    # -- the public API ---------------------------------------------------------------------------------------

    def publish(self, nbytes=None, **data):
        """Register this process (or update its entry): set its reserved ``nbytes`` when given, and merge ``data``
        (JSON-able values; a value of None removes that key) into what it publishes.  Returns its :class:`Peer`."""
        pid = os.getpid()
        with self._records() as records:
            record = records.setdefault(pid, {"bytes": 0, "start": _own_start(), "data": {}})
            if nbytes is not None:
                record["bytes"] = int(nbytes)
            merged = dict(record.get("data") or {})
            for key, value in data.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            record["data"] = merged
            return Peer(pid, record["bytes"], dict(merged))

    def peers(self, include_self=False):
        """The live processes of the registry as ``{pid: Peer}`` (this process too with ``include_self``)."""
        own = os.getpid()
        with self._records() as records:
            return {pid: Peer(pid, record["bytes"], dict(record.get("data") or {}))
                    for pid, record in records.items() if include_self or pid != own}

    def withdraw(self):
        """Remove this process's entry (its reserved bytes go back to the others)."""
        with self._records() as records:
            records.pop(os.getpid(), None)

    @contextlib.contextmanager
    def transaction(self):
        """Lock the file and yield its live entries as a dict ``{pid: bytes}``; changes are written back on exit
        (a pid added here gets an empty ``data``; a pid removed here leaves the registry)."""
        own = os.getpid()
        with self._records() as records:
            entries = {pid: record["bytes"] for pid, record in records.items()}
            yield entries
            for pid in set(records) - set(entries):
                del records[pid]
            for pid, size in entries.items():
                record = records.get(pid)
                if record is None:
                    records[pid] = {"bytes": int(size), "start": _own_start() if pid == own else _process_start(pid),
                                    "data": {}}
                elif record["bytes"] != size:
                    record["bytes"] = int(size)

    def entries(self):
        """Return the live entries ``{pid: bytes}`` (dropping dead ones from the file)."""
        with self.transaction() as entries:
            return dict(entries)

    # -- the file ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _records(self):
        """Lock the file and yield its live records ``{pid: {"bytes", "start", "data"}}``; written back on exit."""
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            info = os.fstat(fd)
            if info.st_uid != os.getuid():
                raise ConfigError("pin registry %s belongs to another user; set XDG_RUNTIME_DIR or "
                                  "COMFY_MEMX_PIN_SCOPE=process" % self.path)
            if info.st_mode & 0o077:
                os.fchmod(fd, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = _read_all(fd)
            records = self._live_records(raw)
            yield records
            text = json.dumps({str(pid): _stored(record) for pid, record in sorted(records.items())}).encode()
            if text != raw.rstrip():
                # Pad with blanks instead of truncating: ftruncate costs milliseconds on some file systems.
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, text.ljust(len(raw)))
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _live_records(self, raw):
        try:
            loaded = json.loads(raw) if raw.strip() else {}
            records = {int(pid): {"bytes": int(r["bytes"]), "start": r.get("start"), "data": dict(r.get("data") or {})}
                       for pid, r in loaded.items()}
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("comfy_memx: pin registry %s was unreadable; starting it afresh", self.path)
            return {}
        return {pid: record for pid, record in records.items() if _alive(pid, record["start"])}


def default_registry_path():
    """Where the host registry lives: ``$XDG_RUNTIME_DIR`` (per user), else /dev/shm, else the temp directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        return os.path.join(runtime, REGISTRY_NAME + ".json")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    for directory in ("/dev/shm", tempfile.gettempdir()):
        if os.path.isdir(directory) and os.access(directory, os.W_OK):
            return os.path.join(directory, "%s-%d.json" % (REGISTRY_NAME, uid))
    return os.path.join(tempfile.gettempdir(), "%s-%d.json" % (REGISTRY_NAME, uid))


def _stored(record):
    stored = {"bytes": int(record["bytes"]), "start": record.get("start")}
    if record.get("data"):
        stored["data"] = record["data"]
    return stored


def _read_all(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _alive(pid, start):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    if sys.platform.startswith("linux"):
        state_and_start = _proc_stat(pid)
        if state_and_start is None:
            return False
        state, started = state_and_start
        if state in ("Z", "X"):
            return False
        return start is None or start == started
    return True


def _proc_stat(pid):
    """(state, start time in clock ticks) from /proc/<pid>/stat, or None when the process is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], fields[19]


def _process_start(pid):
    if sys.platform.startswith("linux"):
        stat = _proc_stat(pid)
        return stat[1] if stat else None
    return None


_own_start_cache = {}


def _own_start():
    pid = os.getpid()  # keyed by pid: a forked child must not reuse its parent's start time
    if pid not in _own_start_cache:
        _own_start_cache[pid] = _process_start(pid)
    return _own_start_cache[pid]
