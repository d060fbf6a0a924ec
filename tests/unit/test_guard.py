"""``core.guard``: a wing's functions behind the guard, answering what ComfyUI would do alone when they fail."""

import logging

import pytest

from comfy_memx.core import errors, guard
from comfy_memx.core.state import STATE


@pytest.fixture(autouse=True)
def production():
    STATE.reset()
    facades = list(guard.FACADES)
    yield
    guard.FACADES[:] = facades      # this file's facades are no patch's
    STATE.reset()


def evict(mm, size, evict_active=False):
    """A wing function with a default."""
    if size < 0:
        raise ValueError("bug")
    return (mm, size, evict_active)


def test_a_facade_entry_answers_as_its_function_and_keeps_its_parameters():
    facade = guard.Facade("test", {"evict": (evict, guard.FAILED)})
    assert facade.evict("mm", 3) == ("mm", 3, False)
    assert facade.evict("mm", size=4, evict_active=True) == ("mm", 4, True)
    assert facade.evict.__wrapped__ is evict and facade in guard.FACADES
    with pytest.raises(TypeError):
        facade.evict("mm")            # a wrong call is the caller's bug, not a wing's: it is not swallowed


def test_a_failing_entry_answers_its_fallback_is_logged_once_and_counted(caplog):
    def budgeted(mm):
        return 1 / 0
    facade = guard.Facade("test", {"evict": (evict, guard.FAILED), "budgeted": (budgeted, False)})
    caplog.set_level(logging.WARNING, logger="comfy_memx")
    assert [facade.evict("mm", -1) for _ in range(3)] == [guard.FAILED] * 3
    assert facade.budgeted("mm") is False and facade.fallback("budgeted") is False
    kind = f"test.evict -> {__name__}.evict"
    assert errors.error_counts() == {kind: 3, f"test.budgeted -> {__name__}.{budgeted.__qualname__}": 1}
    assert [r.getMessage() for r in caplog.records if kind in r.getMessage()] == [
        f"comfy_memx: internal error in {kind} (ComfyUI continues; further {kind} errors are not logged)"]
    assert dict(facade.guards())[evict] == kind


@pytest.mark.parametrize("error", [MemoryError, RecursionError, KeyboardInterrupt])
def test_memory_recursion_and_interrupt_pass_a_facade_and_a_callback_unchanged(error):
    def dying(*args):
        raise error("as is")
    facade = guard.Facade("test", {"dying": (dying, None)})
    for call in (facade.dying, guard.callback("test", dying)):
        with pytest.raises(error, match="as is"):
            call(1)
    assert errors.error_counts() == {}


def test_a_callback_reports_what_the_interpreter_would_only_print():
    def gone(_ref):
        raise RuntimeError("bug in a weakref callback")
    guarded = guard.callback("test callback", gone)
    assert guarded(None) is None and errors.error_counts() == {"test callback": 1}


def test_the_count_of_sites_is_bounded():
    for number in range(errors.MAX_SITES + 5):
        errors.internal_error(f"site {number}", ValueError("x"))
    counts = errors.error_counts()
    assert len(counts) == errors.MAX_SITES + 1 and counts[errors.OTHER_SITE] == 5


def test_a_guarded_step_answers_its_value_or_none_and_reports_under_its_kind():
    assert guard.call("step", evict, "mm", 1) == ("mm", 1, False)
    assert guard.call("step", evict, "mm", -1) is None and errors.error_counts() == {"step": 1}
