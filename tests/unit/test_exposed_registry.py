"""Exposed surface: a host registry that no other user can touch.  A folder or file pre-created by another uid (or as a
link) is refused and the pin cap holds; entries are validated; identity survives PID reuse and PID namespaces; a
corrupt file costs one warning and nobody's grant.  Every test works in its own temporary folder (the shared base
of :func:`hostshare.private_dir` is pointed there), never in the machine's real /dev/shm."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from comfy_memx.core import hostshare
from comfy_memx.pins.budget import PinBudget
from comfy_memx.core.hostshare import HostRegistry, RegistryUnavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1024 ** 2
OTHER_UID = 12345


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """A world-writable stand-in for /dev/shm, and no XDG_RUNTIME_DIR."""
    base = tmp_path / "shm"
    base.mkdir()
    os.chmod(base, 0o1777)
    monkeypatch.setattr(hostshare, "shared_base", lambda: str(base))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return base


def needs_root():
    if os.geteuid() != 0:
        pytest.skip("needs root to create files owned by another uid")


def own_folder(shared):
    return shared / f"comfy_memx-{os.getuid()}"


def test_the_private_folder_is_made_0700_and_reused(shared):
    folder = hostshare.private_dir()
    assert folder == str(own_folder(shared))
    assert os.stat(folder).st_mode & 0o777 == 0o700 and hostshare.private_dir() == folder


def test_a_folder_pre_created_by_another_user_never_lifts_the_cap(shared, caplog):
    needs_root()
    folder = own_folder(shared)
    folder.mkdir(mode=0o777)
    os.chmod(folder, 0o777)
    os.chown(folder, OTHER_UID, OTHER_UID)
    with pytest.raises(RegistryUnavailable, match="belongs to uid 12345"):
        hostshare.private_dir()
    budget = PinBudget(MiB, scope="host", host_chunk_bytes=64 * 1024)
    granted = 0
    for _ in range(32):   # 2 MiB asked in 64 KiB pins under a 1 MiB cap
        decision = budget.request("model", 64 * 1024)
        granted += decision.nbytes if decision.granted else 0
    assert granted == MiB and budget.stats()["refusals"] == 16
    assert len([r for r in caplog.records if "host pin registry cannot be used" in r.getMessage()]) == 1


def test_a_link_in_place_of_the_folder_is_refused(shared, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    os.symlink(target, own_folder(shared))
    with pytest.raises(RegistryUnavailable, match="not a folder"):
        hostshare.private_dir()


def test_a_loose_runtime_dir_is_not_used(tmp_path, shared, monkeypatch):
    loose = tmp_path / "run"
    loose.mkdir()
    os.chmod(loose, 0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(loose))
    assert hostshare.private_dir() == str(own_folder(shared))
    os.chmod(loose, 0o700)
    assert hostshare.private_dir() == str(loose)


@pytest.mark.parametrize("kind", ["other_owner", "world_writable", "symlink", "fifo"])
def test_a_registry_file_someone_else_could_write_is_refused(shared, tmp_path, kind):
    folder = hostshare.private_dir()
    path = os.path.join(folder, "comfy_memx-pins.json")
    if kind == "other_owner":
        needs_root()
        with open(path, "w") as f:
            f.write("{}")
        os.chown(path, OTHER_UID, OTHER_UID)
    elif kind == "world_writable":
        with open(path, "w") as f:
            f.write("{}")
        os.chmod(path, 0o666)
    elif kind == "symlink":
        os.symlink(tmp_path / "target.json", path)
    else:
        os.mkfifo(path)
    with pytest.raises(RegistryUnavailable):
        HostRegistry(path).entries()


def corrupt_or_forge(path, text):
    with open(path, "w") as f:
        f.write(text)


@pytest.mark.parametrize("entry", [
    {"pid": 1, "bytes": -10 * MiB}, {"pid": 1, "bytes": True}, {"pid": 1, "bytes": "5"}, {"pid": 1, "bytes": 2 ** 70},
    {"pid": -3, "bytes": 0}, {"pid": 1, "bytes": 0, "data": [1]}, "nonsense",
])
def test_invalid_entries_are_dropped_and_never_raise_the_cap(tmp_path, caplog, entry):
    path = str(tmp_path / "pins.json")
    budget = PinBudget(MiB, scope="host", registry=HostRegistry(path), host_chunk_bytes=64 * 1024)
    assert budget.request("a", 512 * 1024).granted
    records = json.load(open(path))
    records["ab" * 16] = entry
    corrupt_or_forge(path, json.dumps(records))
    decision = budget.request("b", 768 * 1024)
    assert decision.evict == (("a", 256 * 1024),)         # the forged entry gave no room: "a" makes it
    assert budget.stats()["other_processes_bytes"] == 0
    assert list(json.load(open(path))) == [budget._registry.me]
    assert len([r for r in caplog.records if "invalid entry" in r.getMessage()]) == 1


WORKER = textwrap.dedent("""
    import json, sys
    from comfy_memx.pins.budget import PinBudget
    from comfy_memx.core.hostshare import HostRegistry
    budget = PinBudget(int(sys.argv[2]), scope="host", registry=HostRegistry(sys.argv[1]), host_chunk_bytes=1024)
    print("ready", flush=True)
    for line in sys.stdin:
        verb, model, size = line.split()
        d = budget.request(model, int(size))
        print(json.dumps({"granted": d.granted, "others": budget.stats()["other_processes_bytes"]}), flush=True)
""")


class Worker:
    """A process (optionally in new PID and mount namespaces: its pid is 1) holding a host-scope budget."""

    def __init__(self, path, cap, own_pid_namespace=False):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        command = [sys.executable, "-c", WORKER, path, str(cap)]
        if own_pid_namespace:
            command = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", *command]
        self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def ask(self, size):
        self.process.stdin.write("request m %d\n" % size)
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def test_a_corrupt_file_costs_one_warning_and_nobodys_grant(tmp_path, caplog):
    path = str(tmp_path / "pins.json")
    first = Worker(path, 1024 * MiB)
    try:
        assert first.ask(600 * MiB)["granted"]
        corrupt_or_forge(path, '{"not json')
        budget = PinBudget(1024 * MiB, scope="host", registry=HostRegistry(path), host_chunk_bytes=1024)
        assert not budget.request("second", 600 * MiB).granted   # the first one's 600 MiB still count
        assert budget.stats()["other_processes_bytes"] == 600 * MiB
        assert budget.request("second", 400 * MiB).granted
        assert not first.ask(100 * MiB)["granted"]                # and the first one sees the second's
        assert len([r for r in caplog.records if "does not parse" in r.getMessage()]) == 1
        assert open(path + ".corrupt").read() == '{"not json'
    finally:
        first.close()


def test_processes_in_different_pid_namespaces_both_pid_1_keep_their_own_shares(tmp_path):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare(1) and root for PID namespaces")
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"PID namespaces unavailable: {probe.stderr.decode(errors='replace').strip()}")
    path = str(tmp_path / "pins.json")
    first = Worker(path, 1024 * MiB, own_pid_namespace=True)
    second = Worker(path, 1024 * MiB, own_pid_namespace=True)
    try:
        assert first.ask(600 * MiB)["granted"]
        assert second.ask(300 * MiB)["granted"]
        refused = second.ask(300 * MiB)
        assert not refused["granted"] and refused["others"] == 600 * MiB
        peers = HostRegistry(path).peers()
        assert sorted(peer.pid for peer in peers.values()) == [1, 1]
        first.close()   # its share goes with it, across namespaces (once the kernel has killed its pid 1)
        for _ in range(200):
            if second.ask(600 * MiB)["granted"]:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the killed namespace's share was never reclaimed")
    finally:
        first.close()
        second.close()


def test_a_live_pid_that_reuses_a_dead_entrys_number_does_not_keep_its_share(tmp_path):
    path = str(tmp_path / "pins.json")
    registry = HostRegistry(path)
    registry.entries()
    records = json.load(open(path)) if os.path.getsize(path) else {}
    records["cd" * 16] = {"pid": os.getpid(), "start": None, "bytes": 900 * MiB, "data": {}}  # our own, live, pid
    corrupt_or_forge(path, json.dumps(records))
    assert registry.entries() == {}


def test_handoff_stays_off_with_a_warning_when_its_folder_belongs_to_another_user(shared, monkeypatch, caplog):
    needs_root()
    from comfy_memx.core import config
    from comfy_memx.core.state import STATE
    from comfy_memx.sharing import handoff
    folder = own_folder(shared)
    folder.mkdir(mode=0o777)
    os.chown(folder, OTHER_UID, OTHER_UID)
    monkeypatch.setattr(STATE, "config", config.parse({"COMFY_MEMX_HANDOFF": "host"}))
    monkeypatch.setattr(STATE.errors, "raise_internal", True)   # not an internal error: nothing is raised
    try:
        assert handoff.start_safely(1) is None
        assert handoff.part().registry is None and handoff.part().secret is None
    finally:
        STATE.reset()
    assert any("GPU hand-off is off" in r.getMessage() for r in caplog.records)
