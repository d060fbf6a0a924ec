"""``surface.answers``: one build per change shared by concurrent readers, a changed fingerprint or an old answer
rebuilds, a failed build is not kept, and ``/memx/models`` through the real route answers what changed."""

import asyncio
import concurrent.futures
import threading

import pytest

from comfy_memx.surface import answers


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def build_counter(gate=None):
    calls = []

    def build():
        calls.append(threading.current_thread().name)
        if gate is not None:
            gate.wait(5)
        return f"answer {len(calls)}".encode()
    return build, calls


@pytest.fixture
def pool():
    executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="answers-test")
    yield executor
    executor.shutdown(wait=True)


def test_concurrent_readers_share_one_build(pool):
    release = threading.Event()
    build, calls = build_counter(release)
    shared = answers.SharedAnswer(build, lambda: "same")

    async def scenario():
        readers = [asyncio.ensure_future(shared.get(pool)) for _ in range(20)]
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.gather(*readers)

    got = asyncio.run(scenario())
    assert got == [b"answer 1"] * 20 and len(calls) == 1


def test_kept_answer_is_served_without_the_executor_until_the_fingerprint_changes(pool):
    build, calls = build_counter()
    state = {"key": 1}
    shared = answers.SharedAnswer(build, lambda: state["key"], clock=Clock())

    async def scenario():
        first = await shared.get(pool)
        again = await shared.get(pool)
        state["key"] = 2
        changed = await shared.get(pool)
        return first, again, changed

    assert asyncio.run(scenario()) == (b"answer 1", b"answer 1", b"answer 2")
    assert len(calls) == 2 and all(name.startswith("answers-test") for name in calls)


def test_an_answer_older_than_max_age_is_rebuilt(pool):
    build, calls = build_counter()
    clock = Clock()
    shared = answers.SharedAnswer(build, lambda: "same", max_age_s=1.0, clock=clock)

    async def scenario():
        first = await shared.get(pool)
        clock.now += 0.9
        young = await shared.get(pool)
        clock.now += 0.2
        old = await shared.get(pool)
        return first, young, old

    assert asyncio.run(scenario()) == (b"answer 1", b"answer 1", b"answer 2")


def test_a_failed_build_reaches_its_readers_and_is_not_kept(pool):
    attempts = []

    def build():
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("ledger view bug")
        return b"fine"
    shared = answers.SharedAnswer(build, lambda: "same")

    async def scenario():
        with pytest.raises(RuntimeError, match="ledger view bug"):
            await shared.get(pool)
        return await shared.get(pool)

    assert asyncio.run(scenario()) == b"fine" and len(attempts) == 2


def test_a_reader_cancelled_while_waiting_does_not_cancel_the_shared_build(pool):
    release = threading.Event()
    build, calls = build_counter(release)
    shared = answers.SharedAnswer(build, lambda: "same")

    async def scenario():
        impatient = asyncio.ensure_future(shared.get(pool))
        patient = asyncio.ensure_future(shared.get(pool))
        await asyncio.sleep(0.05)
        impatient.cancel()
        release.set()
        return await patient

    assert asyncio.run(scenario()) == b"answer 1" and len(calls) == 1


def test_models_fingerprint_changes_with_a_load_and_a_leak(fake_comfy):
    from comfy_memx.core.state import STATE

    class Module:
        pass

    before = answers.models_fingerprint()
    module = Module()
    record = STATE.ledger.record_for(module)
    created = answers.models_fingerprint()
    record.loads += 1
    loaded = answers.models_fingerprint()
    record.leak = {"stage": "rooted", "sightings": 1}
    leaked = answers.models_fingerprint()
    record.leak["holder"] = {"package": "leaky_pack"}
    held = answers.models_fingerprint()
    assert len({before, created, loaded, leaked, held}) == 5
    assert answers.models_fingerprint() == held
