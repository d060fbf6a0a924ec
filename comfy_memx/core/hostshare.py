"""A small file shared by this user's ComfyUI processes on one host: who is alive and what each one holds.

:class:`HostRegistry` keeps one entry per live process under a random *instance token* (never the pid: two
containers that share ``/dev/shm`` can both be pid 1, and pids are reused), ``{token: {"pid", "start", "boot",
"bytes", "data"}}``: ``bytes`` is what the process reserved of a shared resource (the host-scope pin budget uses it
for pinned bytes), ``data`` small JSON facts a process publishes about itself (hand-off: device, URL, peer secret),
``pid``/``start``/``boot`` are informational.

Who may touch it.  The file lives in :func:`private_dir`: ``$XDG_RUNTIME_DIR`` when it is a folder of this user that
nobody else can write, else a folder ``comfy_memx-<uid>`` in ``/dev/shm`` (or the temp folder) created with mode 0700
by an exclusive ``mkdir`` and then checked with ``lstat`` (a folder, not a link, owned by this uid, no access for
group or others); the file itself is opened with ``O_NOFOLLOW`` and checked to be a regular file owned by this uid.
Another user who pre-creates any of it gets :class:`RegistryUnavailable`, never a say in our entries; the pin budget
then keeps its in-process cap (never no cap).

Who is alive.  Each process holds an exclusive lock on its own file ``comfy_memx-live-<token>.lock`` for as long as
it lives (the kernel drops it when the process exits, whatever its PID namespace); an entry whose lock can be taken
is dead and is dropped by the next access.  Entries are validated one by one (``bytes`` a whole number in
[0, 2**62], ``data`` a small object): an invalid entry is dropped with one warning.  A file that does not parse costs
one warning and nobody's grant: every write goes to a new file renamed over the old one (never half a file) and to
a backup (``.bak``); a file that does not parse is copied aside (``.corrupt``) and rebuilt from the backup (or the
last view this process read), and every process re-asserts its own entry at each access.

Locking: ``filelock`` (a dependency of torch, so present in every ComfyUI environment; ``fcntl.flock`` on POSIX,
``msvcrt`` on Windows), on ``<file>.lock`` for each read-modify-write, and on the live files.  Without ``filelock``
the registry is unavailable (:class:`RegistryUnavailable`).  No Python lock is taken here.

API: :meth:`HostRegistry.publish` (register this process: bytes and/or data), :meth:`HostRegistry.peers` (the
live processes with their bytes and data), :meth:`HostRegistry.withdraw` (leave), and
:meth:`HostRegistry.transaction` (read-modify-write of the ``{token: bytes}`` view, for budgets that must decide
under the file lock; this process's key is :attr:`HostRegistry.me`).
"""

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import stat
import tempfile
import time

from comfy_memx.core.errors import MemxError
from comfy_memx.core.private import Refused, check_file
from comfy_memx.core.state import STATE

log = logging.getLogger("comfy_memx")

REGISTRY_NAME = "comfy_memx-pins"
LOCK_TIMEOUT_S = 10.0
MAX_BYTES = 2 ** 62
MAX_DATA_CHARS = 4096
MAX_FILE_BYTES = 1 << 20


class RegistryUnavailable(MemxError, OSError):
    """The registry cannot be used safely here (another user owns its folder or file, a link, no lock); the message
    says which path and why.  Callers fall back to what they can decide alone (the in-process pin cap)."""


@dataclasses.dataclass(frozen=True)
class Peer:
    """One live process in the registry: its ``pid``, the ``bytes`` it reserved and the ``data`` it published."""

    pid: int
    bytes: int
    data: dict
    token: str = dataclasses.field(default="", compare=False)


class HostRegistry:
    """The registry file at ``path`` (default :func:`default_registry_path`); see the module docstring.  Creating
    one touches no file; the first access may raise :class:`RegistryUnavailable`."""

    def __init__(self, path=None):
        self._path = path
        self._last_good = {}     # the records this process last read (restores a corrupt file)
        self._mine = None        # this process's own record, re-asserted at every access
        self._warned = set()

    @property
    def path(self):
        """The registry file (resolved on first use: the private folder is made then)."""
        if self._path is None:
            self._path = default_registry_path()
        return self._path

    @property
    def me(self):
        """This process's key in the registry (its instance token)."""
        return _identity()["token"]

    # -- the public API ---------------------------------------------------------------------------------------

    def publish(self, nbytes=None, **data):
        """Register this process (or update its entry): set its reserved ``nbytes`` when given, and merge ``data``
        (JSON-able values; a value of None removes that key) into what it publishes.  Returns its :class:`Peer`."""
        with self._records() as records:
            record = records.setdefault(self.me, _new_record())
            if nbytes is not None:
                record["bytes"] = _valid_bytes(nbytes)
            merged = dict(record.get("data") or {})
            for key, value in data.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            record["data"] = merged
            return Peer(record["pid"], record["bytes"], dict(merged), self.me)

    def peers(self, include_self=False):
        """The live processes of the registry as ``{token: Peer}`` (this process too with ``include_self``)."""
        own = self.me
        with self._records() as records:
            return {token: Peer(record["pid"], record["bytes"], dict(record.get("data") or {}), token)
                    for token, record in records.items() if include_self or token != own}

    def withdraw(self):
        """Remove this process's entry (its reserved bytes go back to the others)."""
        self._mine = None
        with self._records() as records:
            records.pop(self.me, None)
        self._mine = None

    @contextlib.contextmanager
    def transaction(self):
        """Lock the file and yield its live entries as a dict ``{token: bytes}``; changes are written back on exit
        (a key added here gets an empty ``data``; a key removed here leaves the registry)."""
        with self._records() as records:
            entries = {token: record["bytes"] for token, record in records.items()}
            yield entries
            for token in set(records) - set(entries):
                del records[token]
            for token, size in entries.items():
                record = records.get(token)
                if record is None:
                    record = records[token] = _new_record() if token == self.me else {
                        "pid": 0, "start": None, "boot": None, "bytes": 0, "data": {}}
                record["bytes"] = _valid_bytes(size)

    def entries(self):
        """Return the live entries ``{token: bytes}`` (dropping dead ones from the file)."""
        with self.transaction() as entries:
            return dict(entries)

    # -- the file ---------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _records(self):
        """Lock the registry and yield its live, valid records ``{token: record}``; written back on exit."""
        path = self.path
        _hold_own_liveness(os.path.dirname(path))
        with _exclusive(path + ".lock"):
            raw = _read_private(path)
            records = self._live_records(raw, path)
            if self._mine is not None and self.me not in records:
                records[self.me] = json.loads(json.dumps(self._mine))  # re-assert our own entry
            yield records
            self._mine = records.get(self.me)
            self._last_good = json.loads(json.dumps(records))
            text = json.dumps(records, sort_keys=True).encode()
            if text != raw:
                _write_private(path, text)            # whole: written aside, then renamed over
                _write_private(path + ".bak", text)   # what a corrupted file is rebuilt from

    def _parse(self, raw, path):
        """The records of ``raw``, or None when it does not parse."""
        try:
            loaded = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError, UnicodeDecodeError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def _live_records(self, raw, path):
        loaded = self._parse(raw, path)
        if loaded is None:
            backup = self._parse(_read_private(path + ".bak"), path)
            self._warn_once("corrupt", "comfy_memx: host registry %s does not parse; a copy is in %s.corrupt, and "
                                       "it is rebuilt from %s.bak (every process also re-asserts its own entry)",
                            path, path, path)
            with contextlib.suppress(OSError):
                _write_private(path + ".corrupt", raw)
            loaded = backup if backup is not None else self._last_good
        records = {}
        for token, record in loaded.items():
            valid = _validated(token, record)
            if valid is None:
                self._warn_once("invalid", "comfy_memx: host registry %s held an invalid entry; it was dropped", path)
                continue
            if token == self.me or _alive(os.path.dirname(path), token):
                records[token] = valid
        return records

    def _warn_once(self, kind, message, *args):
        if kind not in self._warned:
            self._warned.add(kind)
            log.warning(message, *args)


def private_dir():
    """A folder only this user can write: ``$XDG_RUNTIME_DIR`` when it is one, else ``comfy_memx-<uid>`` (0700) in
    ``/dev/shm`` or the temp folder, made and checked here; raises :class:`RegistryUnavailable` when that folder
    exists but is not ours alone."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _is_private(runtime):
        return runtime
    uid = os.getuid() if hasattr(os, "getuid") else None
    name = "comfy_memx-%s" % (uid if uid is not None else _user_name())
    folder = os.path.join(shared_base(), name)
    try:
        os.mkdir(folder, 0o700)  # exclusive: fails on anything already there, links included
    except FileExistsError:
        pass
    except OSError as exc:
        raise RegistryUnavailable(exc.errno, "cannot create %s (%s)" % (folder, exc.strerror)) from None
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise RegistryUnavailable(0, "%s is not a folder (a link or file someone else made?)" % folder)
    if uid is not None:
        if info.st_uid != uid:
            raise RegistryUnavailable(0, "%s belongs to uid %d, not to this user (%d)" % (folder, info.st_uid, uid))
        if info.st_mode & 0o077:
            os.chmod(folder, 0o700)  # ours (checked above, not a link): close what a loose umask left open
    return folder


def shared_base():
    """The world-writable folder in which :func:`private_dir` makes this user's folder: /dev/shm, else the temp
    folder."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def default_registry_path(name=REGISTRY_NAME):
    """Where the host registry ``name`` lives: ``<private_dir()>/<name>.json``."""
    return os.path.join(private_dir(), name + ".json")


def _is_private(folder):
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or not os.access(folder, os.W_OK):
        return False
    if hasattr(os, "getuid"):
        return info.st_uid == os.getuid() and not info.st_mode & 0o022
    return True


def _user_name():
    try:
        import getpass
        return "".join(c for c in getpass.getuser() if c.isalnum()) or "user"
    except Exception:
        return "user"


def _read_private(path):
    """The bytes of registry file ``path`` (b"" when it does not exist); :class:`RegistryUnavailable` when it is
    not a regular file of this user (a link, a FIFO, another user's file) or is too large."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0) \
        | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return b""
    except OSError as exc:
        raise RegistryUnavailable(exc.errno, "cannot open %s (%s)" % (path, exc.strerror)) from None
    try:
        _check_ours(fd, path)
        return _read_all(fd)
    finally:
        os.close(fd)


def _check_ours(fd, path):
    """The rule of every file comfy_memx writes (``core.private.check_file``: a regular file of this user), private
    (no access for group or others), and small."""
    info = os.fstat(fd)
    try:
        check_file(info, path, private=True)
    except Refused as exc:
        raise RegistryUnavailable(0, "host registry %s" % exc) from None
    if info.st_size > MAX_FILE_BYTES:
        raise RegistryUnavailable(0, "host registry %s is larger than %d bytes" % (path, MAX_FILE_BYTES))


def _write_private(path, data):
    """Write ``data`` to ``path`` whole: into a new 0600 file beside it (``O_EXCL``, no link followed), then renamed
    over ``path``, so a reader never sees half of it."""
    temporary = "%s.%s.tmp" % (path, secrets.token_hex(4))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | \
        getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(temporary, flags, 0o600)
    except OSError as exc:
        raise RegistryUnavailable(exc.errno, "cannot write %s (%s)" % (path, exc.strerror)) from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise RegistryUnavailable(exc.errno, "cannot write %s (%s)" % (path, exc.strerror)) from None
    os.close(fd)
    os.replace(temporary, path)


@contextlib.contextmanager
def _exclusive(lock_path, timeout=LOCK_TIMEOUT_S):
    lock = _file_lock(lock_path, timeout)
    try:
        lock.acquire()
    except Exception as exc:  # filelock.Timeout or an OSError
        raise RegistryUnavailable(0, "cannot lock %s (%s)" % (lock_path, exc)) from None
    try:
        yield
    finally:
        lock.release()


def _file_lock(lock_path, timeout):
    try:
        import filelock
    except ImportError:
        raise RegistryUnavailable(0, "the host registry needs the filelock package (a dependency of torch)") from None
    try:
        return filelock.FileLock(lock_path, timeout=timeout, mode=0o600, thread_local=False,
                                 preserve_lock_file=True)
    except TypeError:  # an older filelock
        return filelock.FileLock(lock_path, timeout=timeout)


def _identity():
    pid = os.getpid()
    identity = STATE.host_identity.get(pid)   # keyed by pid, so a forked child gets its own
    if identity is None:
        identity = STATE.host_identity[pid] = {"token": secrets.token_hex(16), "pid": pid,
                                               "start": _process_start(pid), "boot": _boot_id()}
    return identity


def _new_record():
    identity = _identity()
    return {"pid": identity["pid"], "start": identity["start"], "boot": identity["boot"], "bytes": 0, "data": {},
            "since": round(time.time(), 3)}


def _live_path(folder, token):
    return os.path.join(folder, "comfy_memx-live-%s.lock" % token)


def _hold_own_liveness(folder):
    key = (os.getpid(), folder)
    if key in STATE.host_live_locks:
        return
    lock = _file_lock(_live_path(folder, _identity()["token"]), 0)
    try:
        lock.acquire()
    except Exception as exc:
        raise RegistryUnavailable(0, "cannot hold the live file in %s (%s)" % (folder, exc)) from None
    STATE.host_live_locks[key] = lock


def _alive(folder, token):
    """True while the process of ``token`` holds its live file (a lock taken here means it is gone)."""
    path = _live_path(folder, token)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError:
        return True   # cannot tell: keep its share (the safe side of a cap)
    if not stat.S_ISREG(info.st_mode):
        return True
    lock = _file_lock(path, 0)
    try:
        lock.acquire()
    except Exception:
        return True
    try:
        os.unlink(path)
    except OSError:
        pass
    finally:
        lock.release()
    return False


def _validated(token, record):
    """``record`` as a clean record, or None when it is not a valid entry."""
    if not isinstance(token, str) or not 8 <= len(token) <= 64 or not all(c in "0123456789abcdef" for c in token):
        return None
    if not isinstance(record, dict):
        return None
    size, pid, data = record.get("bytes"), record.get("pid", 0), record.get("data") or {}
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_BYTES:
        return None
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 0:
        return None
    if not isinstance(data, dict) or len(json.dumps(data)) > MAX_DATA_CHARS:
        return None
    return {"pid": pid, "start": record.get("start") if isinstance(record.get("start"), (str, int)) else None,
            "boot": record.get("boot") if isinstance(record.get("boot"), str) else None, "bytes": size,
            "data": data, "since": record.get("since") if isinstance(record.get("since"), (int, float)) else None}


def _valid_bytes(nbytes):
    value = int(nbytes)
    return min(max(0, value), MAX_BYTES)


def _read_all(fd):
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _process_start(pid):
    """The start time of ``pid`` in clock ticks since boot (Linux), else None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None
