"""``core.signals``: subscribers run in order, each under one guard that applies the error policy."""

import logging

import pytest

from comfy_memx.core import signals
from comfy_memx.core.signals import Signal
from comfy_memx.core.state import STATE


def test_fire_calls_every_subscriber_in_order_and_subscribe_works_as_a_decorator():
    signal = Signal("ordered", "test")
    calls = []

    @signal.subscribe
    def first(value):
        calls.append(("first", value))

    assert first.__name__ == "first"
    signal.subscribe(lambda value: calls.append(("second", value)))
    signal.subscribe(first)   # once only
    assert signal.fire(7) is None
    assert calls == [("first", 7), ("second", 7)]
    signal.unsubscribe(first)
    signal.fire(8)
    assert calls[-1] == ("second", 8) and len(calls) == 3


def test_a_failing_subscriber_is_logged_once_and_the_next_one_still_runs(caplog):
    STATE.reset()
    signal = Signal("guarded", "test")
    seen = []

    def broken(value):
        raise ValueError("bug")
    signal.subscribe(broken)
    signal.subscribe(seen.append)
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    for value in range(3):
        signal.fire(value)
    assert seen == [0, 1, 2]
    messages = [r.getMessage() for r in caplog.records if "internal error in" in r.getMessage()]
    assert messages == [f"comfy_memx: internal error in guarded -> {__name__}.{broken.__qualname__} (ComfyUI "
                        f"continues; further guarded -> {__name__}.{broken.__qualname__} errors are not logged)"]


def test_the_test_policy_re_raises(monkeypatch):
    signal = Signal("strict", "test")
    signal.subscribe(lambda: 1 / 0)
    monkeypatch.setattr(STATE.errors, "raise_internal", True)
    with pytest.raises(ZeroDivisionError):
        signal.fire()


@pytest.mark.parametrize("error", [MemoryError, RecursionError, KeyboardInterrupt, SystemExit])
def test_memory_recursion_interrupt_and_exit_pass_unchanged(error, caplog):
    STATE.reset()
    signal = Signal("unchanged", "test")
    seen = []

    def dying():
        raise error("as is")
    signal.subscribe(dying)
    signal.subscribe(lambda: seen.append(True))
    for call in (signal.fire, signal.ask):
        with pytest.raises(error, match="as is"):
            call()
    assert seen == [] and not [r for r in caplog.records if "internal error" in r.getMessage()]


def test_ask_returns_the_first_answer_and_skips_failures():
    STATE.reset()
    signal = Signal("asked", "test")
    signal.subscribe(lambda reason: None)
    signal.subscribe(lambda reason: 1 / 0)
    signal.subscribe(lambda reason: {"reason": reason})
    signal.subscribe(lambda reason: "never asked")
    assert signal.ask("x") == {"reason": "x"}
    assert Signal("empty", "test").ask("x") is None


def test_the_catalogue_names_every_signal_and_pair_once_with_its_doc():
    names = [signal.name for signal in signals.CATALOGUE]
    assert len(names) == len(set(names)) and {"load", "file_loaded"} <= set(names)
    assert all(getattr(signals, signal.name) is signal and signal.doc for signal in signals.CATALOGUE)
