"""``core.pairs``: a ComfyUI call's two halves, the memos between them, and a record that always unwinds."""

import gc
import logging
import sys
import weakref

import pytest

from comfy_memx.core import errors
from comfy_memx.core.pairs import Pair, caller, frame_on_stack, subjects
from comfy_memx.core.signals import Signal
from comfy_memx.core.state import STATE


class Model:
    """Something weakly referenceable that ComfyUI would pass (a ModelPatcher)."""


@pytest.fixture(autouse=True)
def production():
    STATE.reset()
    yield
    STATE.reset()


def internal_errors(caplog):
    return [r.getMessage() for r in caplog.records if "internal error in" in r.getMessage()]


def test_an_after_half_gets_its_before_halfs_memo_and_after_only_halves_get_the_arguments():
    pair = Pair("call", "test", ("value",), ("value", "result"))
    seen = []
    pair.subscribe(lambda value: value * 10, lambda memo, value, result: seen.append(("paired", memo, result)))
    pair.subscribe(lambda value: seen.append(("before only", value)))
    pair.subscribe(after=lambda value, result: seen.append(("after only", value, result)))
    call = pair.before(3)
    pair.after(call, 3, "ok")
    assert seen == [("before only", 3), ("paired", 30, "ok"), ("after only", 3, "ok")]


def test_a_before_that_fails_or_answers_none_leaves_nothing_and_its_after_does_not_run(caplog):
    pair = Pair("guarded", "test", ("value",), ("value",))
    seen = []

    def broken(value):
        raise ValueError("bug")
    pair.subscribe(broken, lambda memo, value: seen.append(("broken's after", memo)))
    pair.subscribe(lambda value: None, lambda memo, value: seen.append(("none's after", memo)))
    pair.subscribe(lambda value: value, lambda memo, value: seen.append(("third", memo)))
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    for value in (1, 2):
        pair.after(pair.before(value), value)
    assert seen == [("third", 1), ("third", 2)]
    kind = f"guarded.before -> {__name__}.{broken.__qualname__}"
    assert internal_errors(caplog) == [f"comfy_memx: internal error in {kind} (ComfyUI continues; further {kind} "
                                       "errors are not logged)"]
    assert errors.error_counts() == {kind: 2}


def wrapper_of(pair, original, *before_args, after_args=()):
    """A patch wrapper of the stacked ``pair`` around ``original``, registered as patches register theirs."""
    def wrapper():
        call = pair.before(*before_args)
        try:
            return original()
        finally:
            pair.after(call, *after_args)
    return pair.runs_in(wrapper)


def test_a_stacked_call_is_current_while_it_runs_and_gone_after_whatever_its_after_does():
    pair = Pair("stacked", "test", ("models", "caller_frame"), ("models",), stacked="frames")

    def failing_after(memo, models):
        raise RuntimeError("after")
    pair.subscribe(lambda models, caller_frame: "memo", failing_after)
    model = Model()
    models = [model]
    seen = []

    def comfyui_call():   # what ComfyUI runs inside the wrapper: the call in progress is found from here
        (call,) = pair.calls()
        seen.append(call)
        assert pair.current() is call and pair.memo(call, failing_after) == "memo"
        assert caller(call) is comfyui_caller_frame[0] and subjects(call) == [model]
        return "comfyui's answer"
    comfyui_caller_frame = []

    def comfyui_caller():
        comfyui_caller_frame.append(sys._getframe())
        return wrapper_of(pair, comfyui_call, models, sys._getframe(), after_args=(models,))()
    assert comfyui_caller() == "comfyui's answer"
    (call,) = seen
    assert pair.current() is None and pair.calls() == [] and caller(call) is None and call[3] is False
    assert errors.error_counts() == {f"stacked.after -> {__name__}.{failing_after.__qualname__}": 1}


def test_the_stack_of_a_pair_is_one_of_the_known_kinds():
    with pytest.raises(ValueError, match="stacked must be one of"):
        Pair("bad", "test", (), (), stacked=True)
    with pytest.raises(ValueError, match="only a pair stacked by frames"):
        Pair("prompt-like", "test", (), (), stacked="thread").runs_in(lambda: None)


def test_a_record_is_found_only_in_the_frames_of_registered_wrappers():
    pair = Pair("homes", "test", (), (), stacked="frames")
    pair.subscribe(lambda: "memo")

    def unregistered():
        call = pair.before()
        try:
            return pair.current()
        finally:
            pair.after(call)
    assert unregistered() is None
    inside = wrapper_of(pair, lambda: pair.current())()
    assert inside is not None and inside[3] is False   # found while it ran, closed since
    with pytest.raises(ValueError, match="no local 'call'"):
        pair.runs_in(lambda: None)


def test_asking_for_the_call_in_progress_leaves_no_copy_of_the_wrappers_locals():
    pair = Pair("asked", "test", ("models",), (), stacked="frames")
    pair.subscribe(lambda models: "memo")
    models = [Model()]

    def wrapper(models):
        call = pair.before(models)
        try:
            assert pair.current() is call
            return [referrer for referrer in gc.get_referrers(models) if type(referrer) is dict]
        finally:
            pair.after(call)
    pair.runs_in(wrapper)
    assert wrapper(models) == []   # a heap search for what holds the list sees no dict of the wrapper's locals


def test_a_record_holds_no_model_no_list_and_no_frame():
    pair = Pair("weak", "test", ("models", "caller_frame"), ("models",), stacked="frames")
    pair.subscribe(lambda models, caller_frame: len(models), lambda memo, models: None)

    def outer():
        model = Model()
        models = [model]
        frame = sys._getframe()
        call = pair.before(models, frame)
        held = gc.get_referents(call)
        assert not any(obj is models or obj is model or obj is frame for obj in held)
        return call, weakref.ref(model)
    call, model_ref = outer()
    gc.collect()
    assert model_ref() is None and subjects(call) == []   # the record kept nothing alive
    pair.after(call, [])
    assert call[3] is False and caller(call) is None   # over: its frame's id names no frame any more


def test_the_test_policy_re_raises_and_a_call_that_raised_is_over(monkeypatch):
    pair = Pair("strict", "test", (), (), stacked="frames")
    seen = []

    def broken():
        return 1 / 0
    pair.subscribe(broken)
    pair.subscribe(after=lambda: seen.append(len(pair.calls())))
    monkeypatch.setattr(STATE.errors, "raise_internal", True)
    with pytest.raises(ZeroDivisionError):
        wrapper_of(pair, lambda: None)()
    pair.unsubscribe(broken)
    pair.subscribe(after=broken)
    with pytest.raises(ZeroDivisionError):
        wrapper_of(pair, lambda: None)()
    label = f"{__name__}.{broken.__qualname__}"
    assert errors.error_counts() == {f"strict.before -> {label}": 1, f"strict.after -> {label}": 1}
    assert seen == [1] and pair.calls() == []   # each call saw itself alone: the first one was over


def run_call(pair):
    """One call of ``pair`` as ComfyUI's call would run it: through a registered wrapper (stacked by frames), or
    its two halves in a row (stacked by thread)."""
    if pair.stacked == "frames":
        wrapper_of(pair, lambda: None)()
    else:
        pair.after(pair.before())


@pytest.mark.parametrize("stack", ["frames", "thread"])
@pytest.mark.parametrize("error", [MemoryError, RecursionError, KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("half", ["before", "after"])
def test_memory_recursion_interrupt_and_exit_pass_unchanged_and_the_call_is_over(error, half, stack, caplog):
    pair = Pair("unchanged", "test", (), (), stacked=stack)

    def dying(*args):
        raise error("as is")
    seen = []
    pair.subscribe(dying if half == "before" else None, dying if half == "after" else None)
    pair.subscribe(after=lambda: seen.append(True))
    with pytest.raises(error, match="as is"):
        run_call(pair)
    assert seen == [] and not internal_errors(caplog) and STATE.stacks.calls == []
    pair.unsubscribe(dying)
    depth = []
    pair.subscribe(lambda: depth.append(len(pair.calls())))
    run_call(pair)
    assert depth == [1]   # the next call is not inside the interrupted one


def test_interleaved_calls_each_see_their_own_record():
    pair = Pair("async", "test", ("name",), (), stacked="frames")
    before = pair.subscribe(lambda name: name)
    seen = {}

    def step(name):
        def body():
            seen[name] = [pair.memo(call, before) for call in pair.calls()]
            yield
            seen[name + " resumed"] = [pair.memo(call, before) for call in pair.calls()]
        return body

    def generator_wrapper(name):   # an async node's coroutine: suspended inside its call, resumed later
        call = pair.before(name)
        try:
            yield from step(name)()
        finally:
            pair.after(call)
    pair.runs_in(generator_wrapper)
    first, second = generator_wrapper("first"), generator_wrapper("second")
    next(first)
    next(second)
    for running in (first, second):
        with pytest.raises(StopIteration):
            next(running)
    assert seen == {"first": ["first"], "second": ["second"], "first resumed": ["first"],
                    "second resumed": ["second"]}


def test_by_thread_the_test_policy_re_raises_and_the_record_still_unwinds(monkeypatch):
    pair = Pair("strict", "test", (), (), stacked="thread")

    def broken():
        return 1 / 0
    pair.subscribe(broken)
    monkeypatch.setattr(STATE.errors, "raise_internal", True)
    with pytest.raises(ZeroDivisionError):
        pair.before()
    assert STATE.stacks.calls == []
    pair.unsubscribe(broken)
    pair.subscribe(after=broken)
    call = pair.before()
    with pytest.raises(ZeroDivisionError):
        pair.after(call)
    label = f"{__name__}.{broken.__qualname__}"
    assert STATE.stacks.calls == [] and errors.error_counts() == {f"strict.before -> {label}": 1,
                                                                  f"strict.after -> {label}": 1}


def test_by_thread_calls_that_end_out_of_order_each_remove_their_own_record():
    pair = Pair("async", "test", ("name",), (), stacked="thread")
    pair.subscribe(lambda name: name)
    first, second = pair.before("first"), pair.before("second")
    pair.after(first)                  # an async node that began first ends first
    assert pair.calls() == [second] and pair.memo(pair.current(), pair.subscriptions()[0][0]) == "second"
    pair.after(second)
    assert STATE.stacks.calls == []


def test_a_call_begun_before_a_subscription_changed_ends_with_the_halves_it_began_with():
    pair = Pair("changing", "test", (), ())
    seen = []
    pair.subscribe(lambda: "old", lambda memo: seen.append(memo))
    call = pair.before()
    pair.subscribe(lambda: "new", lambda memo: seen.append(memo))
    pair.after(call)
    pair.after(pair.before())
    assert seen == ["old", "old", "new"]


def test_subscribing_twice_keeps_one_and_names_are_checked():
    pair = Pair("once", "test", ("value",), ())
    seen = []

    def before(value):
        seen.append(value)
    assert pair.subscribe(before) is before and pair.subscribe(before) is before
    pair.after(pair.before(1))
    assert seen == [1] and pair.subscribers() == [before]
    pair.unsubscribe(before)
    pair.after(pair.before(2))
    assert seen == [1] and pair.guards() == []
    with pytest.raises(ValueError, match="_hidden"):
        Pair("bad", "test", ("_hidden",), ())
    with pytest.raises(ValueError, match="before or an after"):
        pair.subscribe()


def test_a_frame_is_found_again_by_its_id_only_while_it_runs():
    here = sys._getframe()

    def inner():
        return frame_on_stack(id(here))
    assert inner() is here and frame_on_stack(None) is None and frame_on_stack(1) is None


def test_signals_list_their_subscribers_with_the_kind_their_guard_reports():
    signal = Signal("listed", "test")

    def first(value):
        pass
    signal.subscribe(first)
    assert signal.subscribers() == [first]
    assert signal.guards() == [(first, f"listed -> {__name__}.{first.__qualname__}")]
