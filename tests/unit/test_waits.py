"""The waits for servers and prompts (``bench.harness.waits``): bounded by progress, never by a fixed time."""

import asyncio
import itertools
import subprocess
import sys

import pytest

from bench.harness import waits


def test_a_wait_goes_on_past_the_stall_window_while_progress_is_made():
    ticks = itertools.count()
    answers = iter([None] * 30 + ["ready"])
    value = waits.wait_until(lambda: next(answers), lambda: True, lambda: next(ticks), "slow thing",
                             stall_s=0.05, poll_s=0.01)       # about 0.3 s in all: six stall windows
    assert value == "ready"


def test_a_wait_fails_naming_what_when_nothing_moves_for_the_stall_window():
    with pytest.raises(waits.WaitFailed, match=r"stuck thing: no progress for 0.1 s.*\nthe log's end"):
        waits.wait_until(lambda: None, lambda: True, waits.no_progress, "stuck thing", stall_s=0.1, poll_s=0.01,
                         detail=lambda: "the log's end")


def test_a_wait_fails_at_once_when_the_server_exited():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    with pytest.raises(waits.WaitFailed, match="the server exited first"):
        waits.wait_until(lambda: None, waits.process_alive(process), waits.no_progress, "gone", stall_s=3600)


def test_the_async_wait_takes_plain_and_coroutine_functions():
    answers = iter([0, 0, 7])

    async def ready():
        return next(answers)

    assert asyncio.run(waits.wait_until_async(ready, waits.always, lambda: None, "x", poll_s=0.01)) == 7
    with pytest.raises(waits.WaitFailed):
        asyncio.run(waits.wait_until_async(lambda: False, waits.always, waits.no_progress, "x", stall_s=0.05,
                                           poll_s=0.01))


def test_the_place_of_a_prompt_from_queue_and_history():
    queue = (200, {"queue_running": [[3, "run", {}]], "queue_pending": [[5, "b", {}], [4, "a", {}], [6, "c", {}]]})
    nothing = (200, {})
    assert waits.place_of("run", queue, nothing) == ("running",)
    assert waits.place_of("b", queue, nothing) == ("queued", 1)       # "a" (4) is ahead of it, "c" (6) behind
    assert waits.place_of("done", queue, (200, {"done": {"status": 1}})) == ("done", {"status": 1})
    assert waits.place_of("lost", queue, nothing) == ("unknown",)
    assert waits.place_of("b", (None, None), nothing) == ("no answer",)
