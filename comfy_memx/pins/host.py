"""How much host memory this process may really use: RAM, disk swap versus zram, and a container's cgroup limit.

The pin cap (:mod:`comfy_memx.pins.cap`) is derived from these numbers.  Pinned pages can be neither swapped nor
reclaimed, so the figures that matter are the RAM this process may use (clamped to its cgroup limit) and the swap
that really relieves RAM: swap on a disk.  zram swap lives in RAM itself and does not count, and under a cgroup limit
no swap counts, because the limit, not the host, decides when the OOM killer fires.

:func:`probe_host` reads everything once; it is meant for startup and ``doctor``, never for a model load.
:func:`available_ram` is the cheap live reading for RAM-pressure checks on the pin path, and :class:`RamGauge` the
cached form of it that the pin budget asks on every request.

Only the standard library is imported at module level; psutil is imported lazily where /proc cannot answer
(Windows, macOS, or an unreadable /proc/meminfo).
"""

import dataclasses
import logging
import os
import sys
import time

from comfy_memx.core.state import STATE

log = logging.getLogger("comfy_memx")

_KIB = 1024
INACTIVE_FILE_MAX_AGE = 1.0  # seconds a cgroup's inactive page-cache figure is reused by available_ram()
RAM_READING_MAX_AGE = 0.05   # seconds a RamGauge reuses a reading of available RAM


class HostProbe:
    """What the probe remembers (a part of the process state): the host as first probed (for readers without a
    :class:`HostMemory` of their own), the warnings already logged, and the last ``memory.stat`` readings."""

    def __init__(self):
        self.host = None
        self.warned = set()
        self.inactive = {}   # cgroup directory -> (monotonic time, inactive page-cache bytes)


def _probe_part():
    return STATE.part(HostProbe)


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """One reading of the host's memory, as this process sees it.

    ``ram_total`` is physical RAM clamped to the cgroup limit; ``ram_physical`` is the unclamped figure (what
    ComfyUI 0.27.0 and older use for their pin cap).  ``swap_disk`` is swap on disks and files, forced to 0 under a
    cgroup limit; ``swap_zram`` is zram swap, reported but never counted.  ``cgroup_limit`` is None when the process
    has no finite memory limit below physical RAM; ``cgroup_dir``/``cgroup_version`` say where it was read, so that
    :func:`available_ram` can read that cgroup's usage.  ``warnings`` lists what could not be read.
    """

    ram_total: int
    ram_available: int
    swap_disk: int
    swap_zram: int
    cgroup_limit: int | None
    platform: str
    warnings: tuple[str, ...] = ()
    ram_physical: int = 0
    cgroup_dir: str | None = None
    cgroup_version: int | None = None


def probe_host(proc_root="/proc", sys_fs_root="/sys/fs/cgroup", platform=None):
    """Read RAM, swap and the cgroup memory limit of this process and return a :class:`HostMemory`.

    ``proc_root`` and ``sys_fs_root`` point at /proc and the cgroup mount (tests pass fake trees); ``platform``
    defaults to ``sys.platform``.  On Linux it reads ``meminfo``, ``swaps`` and ``self/cgroup`` under
    ``proc_root`` and the cgroup files under ``sys_fs_root``; elsewhere it asks psutil and reports no cgroup.
    Costs a handful of small file reads (well under a millisecond): call it at startup and on doctor, not per load.
    """
    platform = platform or sys.platform
    if not platform.startswith("linux"):
        return _probe_with_psutil(platform)

    warnings = []
    meminfo = _read_meminfo(proc_root)
    if "MemTotal" in meminfo and "MemAvailable" in meminfo:
        physical, available = meminfo["MemTotal"], meminfo["MemAvailable"]
    else:
        warnings.append(_warn_once("meminfo", "could not read %s/meminfo; using psutil" % proc_root))
        physical, available = _psutil_ram()

    swap_disk, swap_zram = _read_swaps(proc_root, warnings)
    limit, limit_dir, version = _cgroup_limit(proc_root, sys_fs_root, physical)
    ram_total = physical
    if limit is not None:
        ram_total = limit
        usage = _cgroup_usage(limit_dir, version)
        available = min(available, max(0, limit - usage)) if usage is not None else min(available, limit)
        swap_disk = 0
    return HostMemory(ram_total=ram_total, ram_available=available, swap_disk=swap_disk, swap_zram=swap_zram,
                      cgroup_limit=limit, platform=platform, warnings=tuple(warnings), ram_physical=physical,
                      cgroup_dir=limit_dir, cgroup_version=version)


def available_ram(host=None, proc_root="/proc"):
    """Return the bytes of RAM this process can still use now, for live pin-pressure checks.

    On Linux it reads ``MemAvailable`` from /proc/meminfo and, when ``host`` (a :class:`HostMemory`) has a cgroup
    limit, clamps it to ``limit - (usage - inactive_file)`` of that cgroup, as the kernel would reclaim inactive page
    cache before killing (that figure, from the costlier memory.stat, is reused for ``INACTIVE_FILE_MAX_AGE``
    seconds).  Swap is ignored on purpose: pinned pages cannot go there.  Cost measured on a busy 2-core VM: 15-30
    microseconds without a limit, about 75 under a v1 limit; psutil.virtual_memory() took 60-100 in the same runs.
    Without ``host`` the cgroup found by a probe cached for this process is used.  Other platforms use
    ``psutil.virtual_memory().available``.
    """
    if host is None:
        host = _cached_host()
    if not host.platform.startswith("linux"):
        return _psutil_ram()[1]
    available = _read_mem_available(proc_root)
    if available is None:
        available = _psutil_ram()[1]
    if host.cgroup_limit is not None:
        usage = _cgroup_usage(host.cgroup_dir, host.cgroup_version, inactive_max_age=INACTIVE_FILE_MAX_AGE)
        if usage is not None:
            available = min(available, max(0, host.cgroup_limit - usage))
    return available


class RamGauge:
    """Available RAM for the pin budget's pressure rule, re-read at most every ``max_age`` seconds.

    Between readings the bytes granted since the last reading are subtracted, so a burst of pins cannot slip under
    the headroom on a stale figure (the cached figure only errs on the safe side).  ``read`` is a callable
    returning bytes; ``max_age`` None means :data:`RAM_READING_MAX_AGE`, looked up at each call.
    """

    def __init__(self, read, max_age=None):
        self._read = read
        self._max_age = max_age
        self._at = -1e9
        self._value = 0
        self._granted = 0

    def __call__(self):
        now = time.monotonic()
        if now - self._at > (RAM_READING_MAX_AGE if self._max_age is None else self._max_age):
            self._value, self._at, self._granted = self._read(), now, 0
        return self._value - self._granted

    def note_granted(self, nbytes):
        """Count ``nbytes`` more as used until the next reading."""
        self._granted += nbytes


def _cached_host():
    part = _probe_part()
    if part.host is None:
        part.host = probe_host()
    return part.host


def _warn_once(key, message):
    """Log ``message`` as a warning the first time ``key`` is seen in this process and return it."""
    warned = _probe_part().warned
    if key not in warned:
        warned.add(key)
        log.warning("comfy_memx: %s", message)
    return message


def _probe_with_psutil(platform):
    import psutil

    memory = psutil.virtual_memory()
    warnings = []
    try:
        swap = psutil.swap_memory().total
    except (OSError, RuntimeError) as exc:
        warnings.append(_warn_once("swap", "could not read swap (%s); pinning falls back to RAM pressure alone" % exc))
        swap = 0
    return HostMemory(ram_total=memory.total, ram_available=memory.available, swap_disk=swap, swap_zram=0,
                      cgroup_limit=None, platform=platform, warnings=tuple(warnings), ram_physical=memory.total)


def _psutil_ram():
    import psutil

    memory = psutil.virtual_memory()
    return memory.total, memory.available


def _read_meminfo(proc_root, wanted=("MemTotal", "MemAvailable")):
    """Return the ``wanted`` fields of meminfo in bytes; missing or unreadable fields are left out."""
    found = {}
    try:
        with open(os.path.join(proc_root, "meminfo"), "rb") as f:
            for line in f:
                name, _, rest = line.partition(b":")
                name = name.decode("ascii", "replace")
                if name in wanted:
                    found[name] = int(rest.split()[0]) * _KIB
                    if len(found) == len(wanted):
                        break
    except (OSError, ValueError, IndexError):
        pass
    return found


def _read_mem_available(proc_root):
    """MemAvailable in bytes from the first bytes of meminfo (it is the third line), or None."""
    try:
        fd = os.open(os.path.join(proc_root, "meminfo"), os.O_RDONLY)
        try:
            head = os.read(fd, 1024)
        finally:
            os.close(fd)
        start = head.index(b"MemAvailable:") + len(b"MemAvailable:")
        return int(head[start:head.index(b"kB", start)]) * _KIB
    except (OSError, ValueError):
        return None


def _read_swaps(proc_root, warnings):
    """Sum /proc/swaps into (disk swap, zram swap) bytes.

    A missing file means a kernel without swap (0, silently); a file that exists but cannot be read or parsed
    adds the 'could not read swap' warning (logged once per process) and counts as no swap.
    """
    path = os.path.join(proc_root, "swaps")
    disk = zram = 0
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()[1:]
        for line in lines:
            fields = line.split()
            if not fields:
                continue
            size = int(fields[-3]) * _KIB
            if _is_zram(fields[0]):
                zram += size
            else:
                disk += size
    except FileNotFoundError:
        return 0, 0
    except (OSError, ValueError, IndexError) as exc:
        warnings.append(_warn_once("swap", "could not read swap from %s (%s); pinning falls back to RAM pressure "
                                           "alone" % (path, exc)))
        return 0, 0
    return disk, zram


def _is_zram(swap_name):
    # /proc/swaps escapes blanks in names as \040; a by-label or mapper link may point at a zram device.
    name = swap_name.replace("\\040", " ")
    return os.path.basename(os.path.realpath(name)).startswith("zram")


def _cgroup_limit(proc_root, sys_fs_root, physical):
    """Return (limit, directory, version) of the smallest finite memory limit on this process's cgroup path.

    Walks every directory from the process's cgroup up to the mount root, for the v2 unified hierarchy
    (``memory.max`` under ``sys_fs_root`` or ``sys_fs_root/unified``) and the v1 memory controller
    (``memory.limit_in_bytes`` under ``sys_fs_root/memory``).  "max", unreadable files and limits at or above
    physical RAM (v1 reports "no limit" as a huge number) count as no limit.  Returns (None, None, None) if none.
    """
    best = (None, None, None)
    for version, cgroup_path in _own_cgroups(proc_root):
        if version == 2:
            bases, filename = (sys_fs_root, os.path.join(sys_fs_root, "unified")), "memory.max"
        else:
            bases, filename = (os.path.join(sys_fs_root, "memory"),), "memory.limit_in_bytes"
        for base in bases:
            for directory in _ancestors(base, cgroup_path):
                limit = _read_int_file(os.path.join(directory, filename))
                if limit is None or limit >= physical:
                    continue
                if best[0] is None or limit < best[0]:
                    best = (limit, directory, version)
    return best


def _own_cgroups(proc_root):
    """Yield (version, path) for the v2 entry and the v1 memory-controller entry of self/cgroup."""
    try:
        with open(os.path.join(proc_root, "self", "cgroup"), "r", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            yield 2, path
        elif "memory" in controllers.split(","):
            yield 1, path


def _ancestors(base, cgroup_path):
    """Directories from ``base/cgroup_path`` up to ``base`` itself, deepest first."""
    parts = [p for p in cgroup_path.split("/") if p and p not in (".", "..")]
    for depth in range(len(parts), -1, -1):
        yield os.path.join(base, *parts[:depth])


def _read_int_file(path):
    try:
        with open(path, "rb") as f:
            text = f.read().strip()
    except OSError:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _cgroup_usage(directory, version, inactive_max_age=0.0):
    """Bytes the cgroup uses minus its inactive page cache (which the kernel reclaims first), or None.

    ``inactive_max_age`` lets a reading of memory.stat (the costly file, about 50-100 microseconds) be reused for
    that many seconds; usage itself is always read fresh.
    """
    if directory is None:
        return None
    usage = _read_int_file(os.path.join(directory, "memory.current" if version == 2 else "memory.usage_in_bytes"))
    if usage is None:
        return None
    now = time.monotonic()
    readings = _probe_part().inactive
    cached = readings.get(directory)
    if cached is not None and now - cached[0] <= inactive_max_age:
        inactive = cached[1]
    else:
        inactive = _read_inactive_file(directory, version)
        readings[directory] = (now, inactive)
    return max(0, usage - inactive)


def _read_inactive_file(directory, version):
    keys = (b"inactive_file",) if version == 2 else (b"total_inactive_file", b"inactive_file")
    try:
        with open(os.path.join(directory, "memory.stat"), "rb") as f:
            text = b"\n" + f.read()
    except OSError:
        return 0
    for key in keys:
        start = text.find(b"\n" + key + b" ")
        if start >= 0:
            start += len(key) + 2
            end = text.find(b"\n", start)
            try:
                return int(text[start:end if end >= 0 else None])
            except ValueError:
                return 0
    return 0
