"""Holder-search budgets count the search's own CPU time, so that an answer does not change with the machine's
load; a wall-clock cap still bounds a starved search."""

import time

from comfy_memx.leaks.holders.budget import STOP_BUDGET, STOP_WALL, Budget


def test_waiting_is_not_spending():
    budget = Budget(0.05, wall_s=10)
    time.sleep(0.2)                          # a wait for a core or the GIL: no CPU time of this thread
    assert budget.stop_reason() is None and budget.left() > 0.04


def test_cpu_work_spends_the_budget():
    budget = Budget(0.05, wall_s=10)
    while budget.cpu_spent() < 0.06:
        sum(range(1000))
    assert budget.stop_reason() == STOP_BUDGET and budget.left() == 0


def test_the_wall_clock_cap_stops_a_starved_search():
    budget = Budget(5.0, wall_s=0.05)
    time.sleep(0.1)
    assert budget.stop_reason() == STOP_WALL and budget.left() == 0


def test_the_default_wall_cap_is_larger_than_the_cpu_allowance():
    assert Budget(2.0).wall_s == 2.0 * 5 + 1


def test_a_part_never_gets_more_than_what_is_left():
    budget = Budget(0.05, wall_s=10)
    while budget.cpu_spent() < 0.03:
        sum(range(1000))
    part = budget.sub(1.0)
    assert 0 < part.cpu_s <= 0.02 + 1e-3 and part.wall_s <= 10
