"""PinBudget: MRU eviction, no churn within a load, RAM pressure, thread safety, and the host-wide registry."""

import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
import threading

import pytest

from comfy_memx.core.state import STATE

from comfy_memx.core import errors
from comfy_memx.pins import budget as pinbudget
from comfy_memx.core.errors import ConfigError
from comfy_memx.core import hostshare
from comfy_memx.pins.budget import PinBudget
from comfy_memx.core.hostshare import HostRegistry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def filled(cap, sizes, **kwargs):
    """A budget holding ``sizes`` ({model_id: bytes}), touched in the given order (last = most recent)."""
    budget = PinBudget(cap, **kwargs)
    for model_id, size in sizes.items():
        budget.touch(model_id)
        assert budget.request(model_id, size).granted
    return budget


def test_grants_within_the_cap_and_counts_per_model():
    budget = PinBudget(1000)
    assert budget.request("a", 300) == pinbudget.Decision("a", 300, True)
    assert budget.request("a", 200).granted and budget.request("b", 500).granted
    stats = budget.stats()
    assert stats["per_model"] == {"a": 500, "b": 500} and stats["committed_bytes"] == 1000
    assert stats["registered_bytes"] == 1000 and stats["evictions"] == 0
    budget.release("a", 200)
    assert budget.pinned("a") == 300 and budget.stats()["pinned_bytes"] == 800


def test_pinning_off_refuses_everything():
    events = []
    budget = PinBudget(0, on_event=events.append)
    decision = budget.request("a", 1)
    assert decision.refused and decision.reason == "pinning_off"
    assert [e["event"] for e in events] == ["pin_refused"]


def test_evicts_most_recently_used_other_model_first():
    events = []
    budget = filled(300, {"a": 100, "b": 100, "c": 100}, on_event=events.append, describe=str.upper)
    decision = budget.request("d", 150)
    assert decision.granted and decision.evict == (("c", 100), ("b", 50)) and decision.reason == "cap"
    assert events == [
        {"event": "pin_evict", "model": "C", "model_id": "c", "bytes": 100, "reason": "cap", "policy": "mru",
         "scope": "process", "for_model_id": "d"},
        {"event": "pin_evict", "model": "B", "model_id": "b", "bytes": 50, "reason": "cap", "policy": "mru",
         "scope": "process", "for_model_id": "d"},
    ]


def test_touch_changes_the_order_and_lru_policy_reverses_it():
    budget = filled(300, {"a": 100, "b": 100, "c": 100})
    budget.touch("a")
    assert budget.recency() == ["b", "c", "a"]
    assert budget.request("d", 100).evict == (("a", 100),)
    lru = filled(300, {"a": 100, "b": 100, "c": 100}, policy="lru")
    assert lru.request("d", 150).evict == (("a", 100), ("b", 50))


def test_never_evicts_the_requester_or_the_loading_models():
    budget = filled(300, {"a": 100, "b": 100, "c": 100})
    decision = budget.request("c", 150, loading={"b"})  # only a's 100 bytes may go
    assert decision.refused and decision.reason == "over_cap"
    assert budget.request("d", 100, loading={"c"}).evict == (("b", 100),)


def test_refusal_evicts_nothing_and_is_an_event():
    events = []
    budget = filled(300, {"a": 100, "b": 100}, on_event=events.append)
    decision = budget.request("c", 400)
    assert decision.refused and decision.reason == "over_cap" and decision.evict == ()
    assert budget.stats()["per_model"] == {"a": 100, "b": 100} and budget.stats()["pending_evict_bytes"] == 0
    assert events == [{"event": "pin_refused", "model": "c", "model_id": "c", "bytes": 400, "reason": "over_cap",
                       "policy": "mru", "scope": "process"}]


def test_no_churn_within_one_load():
    budget = filled(100, {"old": 60})
    with budget.load(["a"]):
        assert budget.request("a", 30).evict == ()
        helper = budget.request("helper", 50)  # not named in the load, but granted during it
        assert helper.evict == (("old", 40),)
        budget.release("old", 40)
        late = budget.request("late", 60)
        assert late.refused  # only "old"'s 20 bytes are evictable; a and helper are protected
        assert budget.pinned("a") == 30 and budget.pinned("helper") == 50
    after = budget.request("late", 60)
    assert after.granted and {victim for victim, _ in after.evict} <= {"a", "helper", "old"}


def test_nested_loads_keep_protection_until_the_outermost_ends():
    budget = PinBudget(100)
    budget.begin_load(["a"])
    assert budget.request("a", 100).granted
    budget.begin_load(["b"])
    budget.end_load()
    assert budget.request("b", 50).refused
    budget.end_load()
    assert budget.request("b", 50).evict == (("a", 50),)


def test_planned_evictions_are_not_planned_twice():
    budget = filled(200, {"a": 100, "b": 100})
    first = budget.request("c", 100)
    second = budget.request("d", 100, loading={"c"})
    assert first.evict == (("b", 100),) and second.evict == (("a", 100),)
    assert budget.stats()["committed_bytes"] == 200 and budget.stats()["pending_evict_bytes"] == 200
    budget.release("b", 100)
    budget.release("a", 100)
    assert budget.stats()["per_model"] == {"c": 100, "d": 100} and budget.stats()["pending_evict_bytes"] == 0


def test_cancelled_eviction_makes_the_bytes_count_again():
    budget = filled(200, {"a": 100, "b": 100})
    assert budget.request("c", 50).evict == (("b", 50),)
    budget.cancel_eviction("b", 50)
    assert budget.stats()["committed_bytes"] == 250 and budget.stats()["pending_evict_bytes"] == 0
    assert budget.request("d", 10, loading={"c"}).evict == (("b", 60),)


def test_release_clamps_and_forget_drops_a_model():
    budget = filled(1000, {"a": 100, "b": 50})
    budget.release("a", 500)
    budget.release("nobody", 5)
    assert budget.pinned("a") == 0 and budget.stats()["pinned_bytes"] == 50
    assert budget.forget("b") == 50 and "b" not in budget.recency() and budget.stats()["pinned_bytes"] == 0


def test_ram_pressure_makes_room_or_refuses():
    available = [1000]
    events = []
    budget = PinBudget(10 ** 9, headroom_bytes=300, available_ram=lambda: available[0], on_event=events.append)
    assert budget.request("a", 500).granted
    available[0] = 1000  # the gauge is read on every request
    decision = budget.request("b", 800)
    assert decision.granted and decision.evict == (("a", 100),) and decision.reason == "ram_pressure"
    assert events[-1]["reason"] == "ram_pressure"
    budget.release("a", 100)
    available[0] = 500
    refused = budget.request("c", 2000)  # needs 1800 bytes of room; a and b hold 1200
    assert refused.refused and refused.reason == "ram_pressure"


def test_events_sink_errors_are_internal_errors():
    def broken(event):
        raise RuntimeError("sink broke")

    budget = PinBudget(0, on_event=broken)
    with pytest.raises(RuntimeError):  # tests re-raise internal errors; production logs them once
        budget.request("a", 1)


def test_bad_policy_or_scope_fails_fast():
    with pytest.raises(ConfigError):
        PinBudget(10, policy="fifo")
    with pytest.raises(ConfigError, match="COMFY_MEMX_PIN_SCOPE"):
        PinBudget(10, scope="galaxy")


def test_concurrent_pins_and_unpins_keep_the_books_straight():
    """Six threads pin, evict and unpin at once.  Before their random phase they meet twice at a barrier, so that
    the run always contains the two contended situations the books must survive, whatever the scheduler does:
    every thread inside its own load at the same moment (each load protects what it pins, so the cap cannot hold
    all six requests: exactly two are refused), and those grants evicting the unprotected pins made just before."""
    cap, threads_n = 10_000, 6
    budget = PinBudget(cap)
    physical = {}
    lock = threading.Lock()  # guards ``physical``, the stand-in for the real pins
    barrier = threading.Barrier(threads_n, timeout=30)
    over_cap, errors, contended = [], [], []

    def pin(model, decision):
        """Carry a granted decision out on ``physical`` as a caller must: evictions first, then the pin."""
        with lock:
            for victim, size in decision.evict:
                freed = min(size, physical.get(victim, 0))
                physical[victim] = physical.get(victim, 0) - freed
                budget.release(victim, freed)
                if freed < size:
                    budget.cancel_eviction(victim, size - freed)
            physical[model] = physical.get(model, 0) + decision.nbytes
            if sum(physical.values()) > cap:
                over_cap.append(sum(physical.values()))

    def worker(seed):
        rng = random.Random(seed)
        models = ["m%d-%d" % (seed, i) for i in range(3)]
        try:
            # 1. Six unprotected 1000-byte pins, outside any load: 6000 of the 10000 bytes.
            barrier.wait()
            pin("warm-%d" % seed, budget.request("warm-%d" % seed, 1000))
            barrier.wait()
            # 2. All six threads inside their loads at once, each asking 2500 bytes: four grants fill the cap by
            # evicting the warm pins (never a protected grant), the last two find nothing evictable.
            with budget.load(["big-%d" % seed]):
                barrier.wait()
                decision = budget.request("big-%d" % seed, 2500)
                contended.append(decision.granted)
                if decision.granted:
                    pin("big-%d" % seed, decision)
                barrier.wait()
            # 3. Free-running random pins and unpins, loads overlapping as the scheduler pleases.
            for _ in range(1500):
                model = rng.choice(models)
                if rng.random() < 0.6:
                    with budget.load([model]):
                        decision = budget.request(model, rng.randint(1, 1500))
                        if decision.granted:
                            pin(model, decision)
                else:
                    with lock:
                        freed = rng.randint(0, physical.get(model, 0))
                        physical[model] = physical.get(model, 0) - freed
                        budget.release(model, freed)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # An eviction can come up short only because the victim's owner unpinned those bytes meanwhile.
    assert errors == [] and over_cap == []
    stats = budget.stats()
    assert stats["per_model"] == {m: b for m, b in physical.items() if b > 0}
    assert stats["pending_evict_bytes"] == 0 and stats["peak_committed_bytes"] <= cap
    # steps 1 and 2 grant 10 requests; the random step granted some too (how many depends on how finely the GIL
    # interleaves the threads: 41 under a busy machine, hundreds on an idle one)
    assert stats["evictions"] > 0 and stats["refusals"] >= 2 and stats["grants"] > 10
    assert sorted(contended) == [False, False, True, True, True, True]
    assert all(physical.get("warm-%d" % seed, 0) == 0 for seed in range(threads_n))  # all evicted in step 2


# -- host scope ------------------------------------------------------------------------------------------------------

def shares(path):
    """``{pid: bytes}`` of the live entries of the registry at ``path`` (the registry keys them by instance token)."""
    return {peer.pid: peer.bytes for peer in HostRegistry(str(path)).peers(include_self=True).values()}


def test_registry_file_is_private_and_drops_dead_processes(tmp_path):
    path = str(tmp_path / "pins.json")
    old = os.umask(0)
    try:
        registry = HostRegistry(path)
        with registry.transaction() as entries:
            entries[registry.me] = 123
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        records = json.load(f)
    records["deadbeef" * 4] = {"pid": 1, "bytes": 5, "data": {}}  # nobody holds its live file
    with open(path, "w") as f:
        json.dump(records, f)
    assert registry.entries() == {registry.me: 123}
    with open(path) as f:
        assert list(json.load(f)) == [registry.me]


def test_registry_owned_by_another_user_is_refused(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to give the file away")
    path = tmp_path / "pins.json"
    path.write_text("{}")
    os.chown(path, 12345, 12345)
    with pytest.raises(hostshare.RegistryUnavailable, match="not to this user"):
        with HostRegistry(str(path)).transaction():
            pass


def test_default_registry_path_prefers_the_runtime_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert hostshare.default_registry_path() == str(tmp_path / "comfy_memx-pins.json")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert os.path.basename(os.path.dirname(hostshare.default_registry_path())) == f"comfy_memx-{os.getuid()}"


WORKER = textwrap.dedent("""
    import json, sys
    from comfy_memx.pins.budget import PinBudget
    from comfy_memx.core.hostshare import HostRegistry
    budget = PinBudget(int(sys.argv[2]), scope="host", registry=HostRegistry(sys.argv[1]), host_chunk_bytes=10)
    print("ready", flush=True)
    for line in sys.stdin:
        verb, model, size = line.split()
        if verb == "request":
            d = budget.request(model, int(size))
            print(json.dumps({"granted": d.granted, "reason": d.reason, "evict": d.evict,
                              "others": budget.stats()["other_processes_bytes"]}), flush=True)
        else:
            budget.release(model, int(size))
            print(json.dumps({"reserved": budget.stats()["reserved_bytes"]}), flush=True)
""")


class Worker:
    """A separate Python process holding a host-scope PinBudget, driven one command per line."""

    def __init__(self, registry_path, cap):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.process = subprocess.Popen([sys.executable, "-c", WORKER, registry_path, str(cap)], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout.readline().strip() == "ready"

    def send(self, verb, model, size):
        self.process.stdin.write("%s %s %d\n" % (verb, model, size))
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def test_two_processes_share_one_host_budget_and_a_killed_ones_share_is_reclaimed(tmp_path):
    path = str(tmp_path / "pins.json")
    first, second = Worker(path, 100), Worker(path, 100)
    try:
        assert first.send("request", "unet", 60)["granted"]
        refused = second.send("request", "vae", 60)
        assert not refused["granted"] and refused["reason"] == "over_cap" and refused["others"] == 60
        assert second.send("request", "vae", 40)["granted"]
        assert shares(path) == {first.process.pid: 60, second.process.pid: 40}

        first.process.send_signal(signal.SIGKILL)
        first.process.wait()
        reclaimed = second.send("request", "unet", 50)
        assert reclaimed["granted"] and reclaimed["evict"] == [] and reclaimed["others"] == 0
        assert shares(path) == {second.process.pid: 90}

        assert second.send("release", "unet", 50)["reserved"] == 40  # shrinks once 2 chunks are unused
        assert shares(path) == {second.process.pid: 40}
    finally:
        first.close()
        second.close()


def test_an_unusable_registry_falls_back_to_the_process_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(STATE.errors, "raise_internal", False)
    budget = PinBudget(100, scope="host", registry=HostRegistry(str(tmp_path / "gone" / "pins.json")))
    assert budget.request("a", 80).granted
    assert budget.request("b", 50).evict == (("a", 30),)
    budget.close()


def test_host_scope_evicts_only_its_own_pins(tmp_path):
    path = str(tmp_path / "pins.json")
    other = Worker(path, 100)
    try:
        assert other.send("request", "te", 50)["granted"]
        budget = PinBudget(100, scope="host", registry=HostRegistry(path), host_chunk_bytes=10)
        assert budget.request("a", 30).granted
        decision = budget.request("b", 40)
        assert decision.granted and decision.evict == (("a", 20),)
        assert budget.stats()["other_processes_bytes"] == 50
        budget.release("a", 20)
        budget.close()
        assert shares(path) == {other.process.pid: 50}
    finally:
        other.close()


PEER = textwrap.dedent("""
    import sys, time
    from comfy_memx.core.hostshare import HostRegistry
    HostRegistry(sys.argv[1]).publish(5, device="cuda:0", port=8188)
    print("ready", flush=True)
    time.sleep(60)
""")


def test_host_registry_lists_live_peers_with_what_they_publish(tmp_path):
    path = str(tmp_path / "pins.json")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    peer = subprocess.Popen([sys.executable, "-c", PEER, path], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert peer.stdout.readline().strip() == "ready"
        registry = HostRegistry(path)
        assert list(registry.peers().values()) == [hostshare.Peer(peer.pid, 5, {"device": "cuda:0", "port": 8188})]
        mine = registry.publish(state="idle")
        assert mine == hostshare.Peer(os.getpid(), 0, {"state": "idle"})
        # The pin budget rewrites bytes under the same lock; what peers published stays.
        budget = PinBudget(100, scope="host", registry=registry, host_chunk_bytes=10)
        assert budget.request("a", 30).granted
        assert registry.peers(include_self=True)[registry.me] == hostshare.Peer(os.getpid(), 30, {"state": "idle"})
        assert registry.publish(state=None).data == {}
        registry.withdraw()
        assert registry.me not in registry.peers(include_self=True)
        peer.kill()
        peer.wait()
        assert registry.peers(include_self=True) == {}
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait()
