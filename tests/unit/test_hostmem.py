"""The host probe against fake /proc and /sys/fs/cgroup trees: RAM, disk swap versus zram, cgroup v1/v2 limits."""

import collections
import logging
import os

import pytest

from comfy_memx.pins import host as hostmem

GIB = 1024 ** 3
KIB = 1024
HEADER = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


class FakeHost:
    """Writes the few /proc and cgroup files the probe reads under a temporary directory."""

    def __init__(self, root, ram=64 * GIB, available=40 * GIB):
        self.proc = root / "proc"
        self.cgroup = root / "cgroup"
        (self.proc / "self").mkdir(parents=True)
        self.cgroup.mkdir()
        self.set_meminfo(ram, available)
        self.set_swaps([])
        self.set_cgroup_lines(["0::/"])

    def set_meminfo(self, ram, available):
        (self.proc / "meminfo").write_text(
            "MemTotal:       %d kB\nMemFree:        %d kB\nMemAvailable:   %d kB\nBuffers:  0 kB\n"
            % (ram // KIB, available // KIB, available // KIB))

    def set_swaps(self, entries):
        lines = ["%s\t%s\t%d\t0\t-2\n" % (name, kind, size // KIB) for name, kind, size in entries]
        (self.proc / "swaps").write_text(HEADER + "".join(lines))

    def set_cgroup_lines(self, lines):
        (self.proc / "self" / "cgroup").write_text("\n".join(lines) + "\n")

    def write(self, relative, name, text):
        directory = self.cgroup / relative
        directory.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(text)
        return directory

    def probe(self):
        return hostmem.probe_host(proc_root=str(self.proc), sys_fs_root=str(self.cgroup), platform="linux")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setattr(hostmem._probe_part(), "warned", set())  # the warnings already logged (moved into STATE)
    return FakeHost(tmp_path)


def test_reads_ram_from_meminfo(fake):
    host = fake.probe()
    assert (host.ram_total, host.ram_available, host.ram_physical) == (64 * GIB, 40 * GIB, 64 * GIB)
    assert host.cgroup_limit is None and host.warnings == () and host.platform == "linux"


@pytest.mark.parametrize("entries, disk, zram", [
    ([("/swapfile", "file", 8 * GIB)], 8 * GIB, 0),
    ([("/dev/zram0", "partition", 16 * GIB)], 0, 16 * GIB),
    ([("/dev/zram0", "partition", 16 * GIB), ("/dev/nvme0n1p3", "partition", 4 * GIB),
      ("/swapfile", "file", 2 * GIB)], 6 * GIB, 16 * GIB),
    ([], 0, 0),
], ids=["disk", "zram-only", "both", "none"])
def test_swap_split_into_disk_and_zram(fake, entries, disk, zram):
    fake.set_swaps(entries)
    host = fake.probe()
    assert (host.swap_disk, host.swap_zram) == (disk, zram)
    assert host.warnings == ()


def test_swap_entry_is_resolved_before_its_name_is_judged(fake, tmp_path):
    device = tmp_path / "dev" / "zram7"
    device.parent.mkdir()
    device.write_text("")
    alias = tmp_path / "dev" / "swap-by-label"
    alias.symlink_to(device)
    fake.set_swaps([(str(alias), "partition", 3 * GIB), ("/swap\\040file", "file", 1 * GIB)])
    host = fake.probe()
    assert (host.swap_disk, host.swap_zram) == (1 * GIB, 3 * GIB)


def test_missing_swaps_file_means_no_swap_without_a_warning(fake):
    (fake.proc / "swaps").unlink()
    host = fake.probe()
    assert (host.swap_disk, host.swap_zram, host.warnings) == (0, 0, ())


def test_unreadable_swaps_warns_once_and_counts_no_swap(fake, caplog):
    (fake.proc / "swaps").unlink()
    (fake.proc / "swaps").mkdir()  # exists, but open() fails even for root
    with caplog.at_level(logging.WARNING, logger="comfy_memx"):
        first = fake.probe()
        second = fake.probe()
    assert first.swap_disk == 0 and second.swap_disk == 0
    assert any("could not read swap" in w for w in first.warnings)
    assert any("could not read swap" in w for w in second.warnings)
    assert sum("could not read swap" in r.getMessage() for r in caplog.records) == 1


def test_garbled_swaps_counts_as_unreadable(fake):
    (fake.proc / "swaps").write_text(HEADER + "/swapfile file lots 0 -2\n")
    host = fake.probe()
    assert host.swap_disk == 0
    assert any("could not read swap" in w for w in host.warnings)


def test_cgroup_v2_limit_clamps_ram_and_zeroes_swap(fake):
    fake.set_swaps([("/swapfile", "file", 32 * GIB)])
    fake.set_cgroup_lines(["0::/machine.slice/comfy.scope"])
    directory = fake.write("machine.slice/comfy.scope", "memory.max", "%d\n" % (8 * GIB))
    (directory / "memory.current").write_text("%d\n" % (5 * GIB))
    (directory / "memory.stat").write_text("anon 1\ninactive_file %d\nactive_file 7\n" % (1 * GIB))
    host = fake.probe()
    assert host.cgroup_limit == 8 * GIB and host.ram_total == 8 * GIB and host.ram_physical == 64 * GIB
    assert host.swap_disk == 0
    assert host.ram_available == 8 * GIB - (5 * GIB - 1 * GIB)
    assert (host.cgroup_dir, host.cgroup_version) == (str(directory), 2)


def test_cgroup_v2_nested_takes_the_smallest_finite_limit(fake):
    fake.set_cgroup_lines(["0::/a/b/c"])
    fake.write("a", "memory.max", str(6 * GIB))
    fake.write("a/b", "memory.max", str(10 * GIB))
    fake.write("a/b/c", "memory.max", "max\n")
    host = fake.probe()
    assert host.cgroup_limit == 6 * GIB
    assert host.cgroup_dir == str(fake.cgroup / "a")


def test_cgroup_max_everywhere_means_no_limit_and_swap_counts(fake):
    fake.set_swaps([("/swapfile", "file", 32 * GIB)])
    fake.set_cgroup_lines(["0::/user.slice"])
    fake.write("user.slice", "memory.max", "max\n")
    host = fake.probe()
    assert host.cgroup_limit is None and host.ram_total == 64 * GIB and host.swap_disk == 32 * GIB


def test_cgroup_limit_at_or_above_physical_ram_means_none(fake):
    fake.set_cgroup_lines(["0::/big"])
    fake.write("big", "memory.max", str(64 * GIB))
    assert fake.probe().cgroup_limit is None


def test_cgroup_v1_memory_controller(fake):
    fake.set_cgroup_lines(["9:name=systemd:/", "4:memory:/docker/abc", "1:cpu,cpuacct:/docker/abc", "0::/"])
    fake.write("memory", "memory.limit_in_bytes", "9223372036854771712\n")
    directory = fake.write("memory/docker/abc", "memory.limit_in_bytes", str(4 * GIB))
    (directory / "memory.usage_in_bytes").write_text(str(3 * GIB))
    (directory / "memory.stat").write_text("cache 5\ninactive_file 9\ntotal_inactive_file %d\n" % GIB)
    host = fake.probe()
    assert (host.cgroup_limit, host.cgroup_version) == (4 * GIB, 1)
    assert host.ram_available == 4 * GIB - (3 * GIB - GIB)


def test_cgroup_v1_path_missing_below_a_namespaced_mount_uses_the_mount_root(fake):
    # Without a cgroup namespace the container sees its host-side path but has only its own cgroup mounted.
    fake.set_cgroup_lines(["4:memory:/kubepods/pod1/ctr"])
    fake.write("memory", "memory.limit_in_bytes", str(2 * GIB))
    assert fake.probe().cgroup_limit == 2 * GIB


def test_missing_cgroup_files_mean_no_limit(fake):
    (fake.proc / "self" / "cgroup").unlink()
    assert fake.probe().cgroup_limit is None
    fake.set_cgroup_lines(["0::/nowhere", "3:memory:/nowhere"])
    assert fake.probe().cgroup_limit is None


def test_available_ram_is_live_and_clamped_by_the_cgroup(fake):
    fake.set_cgroup_lines(["0::/job"])
    directory = fake.write("job", "memory.max", str(8 * GIB))
    (directory / "memory.current").write_text(str(2 * GIB))
    host = fake.probe()
    proc = str(fake.proc)
    assert hostmem.available_ram(host, proc_root=proc) == 6 * GIB
    (directory / "memory.current").write_text(str(7 * GIB))
    assert hostmem.available_ram(host, proc_root=proc) == 1 * GIB
    fake.set_meminfo(64 * GIB, GIB // 2)
    assert hostmem.available_ram(host, proc_root=proc) == GIB // 2


def test_available_ram_without_limit_follows_meminfo(fake):
    host = fake.probe()
    fake.set_meminfo(64 * GIB, 3 * GIB)
    assert hostmem.available_ram(host, proc_root=str(fake.proc)) == 3 * GIB


def test_other_platforms_ask_psutil(monkeypatch):
    import psutil

    memory = collections.namedtuple("svmem", "total available")
    swap = collections.namedtuple("sswap", "total")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(32 * GIB, 20 * GIB))
    monkeypatch.setattr(psutil, "swap_memory", lambda: swap(8 * GIB))
    host = hostmem.probe_host(platform="win32")
    assert (host.ram_total, host.ram_available, host.swap_disk, host.cgroup_limit) == (32 * GIB, 20 * GIB, 8 * GIB,
                                                                                       None)
    assert hostmem.available_ram(host) == 20 * GIB


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="needs Linux /proc")
def test_real_host_probe_is_consistent():
    host = hostmem.probe_host()
    assert 0 < host.ram_available <= host.ram_total <= host.ram_physical
    assert 0 < hostmem.available_ram(host) <= host.ram_total


def test_ram_gauge_reuses_a_reading_and_counts_grants_against_it(monkeypatch):
    readings = iter([10 * GIB, 7 * GIB])
    clock = [100.0]
    monkeypatch.setattr(hostmem.time, "monotonic", lambda: clock[0])
    gauge = hostmem.RamGauge(lambda: next(readings), max_age=1.0)
    assert gauge() == 10 * GIB
    gauge.note_granted(3 * GIB)
    clock[0] += 0.5                      # within max_age: the reading is reused, minus what was granted since
    assert gauge() == 7 * GIB
    clock[0] += 1.0                      # stale: read again, and the grants are in the new reading
    assert gauge() == 7 * GIB
    gauge.note_granted(GIB)
    assert gauge() == 6 * GIB
