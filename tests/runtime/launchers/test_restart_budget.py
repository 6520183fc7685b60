"""RestartBudget (runtime/launchers/restart_budget.py): at most N restarts of a process within any
W seconds, on an injected clock: a crash loop is stopped within the window, saying so; deaths a
day apart are survived for a week; null W is the old count over the whole run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_graph.runtime.launchers.restart_budget import RestartBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_crash_loop_is_stopped_on_its_fourth_death_and_the_reason_says_so():
    clock = Clock()
    budget = RestartBudget(3, 600.0, clock)
    verdicts = []
    for _ in range(4):  # a server that dies 5 s after every start
        verdicts.append(budget.spend("inference-0"))
        clock.now += 5.0
    assert [v.allowed for v in verdicts] == [True, True, True, False]
    assert verdicts[2].reason == "restart 3 of at most 3 within 600 s; 3 over the run"
    assert verdicts[3].reason == (
        "not restarted again: it keeps dying, restarted 3 times in the last 15 s; "
        "runtime.max_restarts is 3 within any runtime.restart_window_s of 600 s"
    )
    assert budget.totals == {"inference-0": 3}


def test_a_server_that_dies_once_a_day_survives_a_week():
    clock = Clock()
    budget = RestartBudget(3, 600.0, clock)
    verdicts = []
    for _ in range(7):
        clock.now += 86_400.0
        verdicts.append(budget.spend("inference-0"))
    assert all(v.allowed for v in verdicts) and [v.recent for v in verdicts] == [1] * 7
    assert verdicts[-1].total == 7 and budget.totals == {"inference-0": 7}


def test_four_deaths_in_25_seconds_stop_the_run_as_the_old_count_did():
    clock = Clock()
    budget = RestartBudget(3, 600.0, clock)
    allowed = []
    for _ in range(4):
        allowed.append(budget.spend("inference-0").allowed)
        clock.now += 25.0 / 3
    assert allowed == [True, True, True, False]


def test_each_process_has_its_own_budget_and_the_window_slides():
    clock = Clock()
    budget = RestartBudget(2, 60.0, clock)
    assert budget.spend("rollout").allowed and budget.spend("rollout").allowed
    assert budget.spend("reward").allowed  # another process: its own two
    assert not budget.spend("rollout").allowed
    clock.now += 60.0  # both of rollout's restarts are now a window old
    assert budget.spend("rollout").allowed
    assert budget.totals == {"rollout": 3, "reward": 1}


def test_no_window_counts_over_the_whole_run_and_zero_never_restarts():
    clock = Clock()
    lifetime = RestartBudget(3, None, clock)
    allowed = []
    for _ in range(4):
        clock.now += 86_400.0
        allowed.append(lifetime.spend("rollout").allowed)
    assert allowed == [True, True, True, False]
    assert lifetime.spend("rollout").reason == (
        "not restarted again: restarted 3 times already; "
        "runtime.max_restarts is 3 over the whole run (runtime.restart_window_s is null)"
    )
    never = RestartBudget(0, 600.0, clock)
    verdict = never.spend("rollout")
    assert not verdict.allowed and verdict.reason == "not restarted: runtime.max_restarts is 0"


@pytest.mark.parametrize("args", [(-1, 600.0), (3, 0.0), (3, -1.0)])
def test_a_budget_that_means_nothing_is_refused(args):
    with pytest.raises(ValueError, match="must be"):
        RestartBudget(*args)


@settings(max_examples=200, deadline=None)
@given(
    max_restarts=st.integers(0, 5),
    window=st.floats(1.0, 1000.0),
    gaps=st.lists(st.floats(0.0, 2000.0), min_size=1, max_size=40),
)
def test_never_more_than_n_restarts_in_any_window_and_never_a_refusal_with_room(max_restarts, window, gaps):
    """Over any death times: the allowed restarts never exceed N within a window, and a death
    is refused only when N restarts already lie within the window before it."""
    clock = Clock()
    budget = RestartBudget(max_restarts, window, clock)
    restarted: list[float] = []
    for gap in gaps:
        clock.now += gap
        recent = [t for t in restarted if t > clock.now - window]
        verdict = budget.spend("p")
        assert verdict.allowed == (len(recent) < max_restarts)
        if verdict.allowed:
            restarted.append(clock.now)
            assert verdict.recent == len(recent) + 1
    assert budget.totals.get("p", 0) == len(restarted)
    for t in restarted:
        assert sum(1 for u in restarted if t - window < u <= t) <= max_restarts
