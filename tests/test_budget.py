from __future__ import annotations

from batchsync.core.budget import Allowance


def test_the_timeout_bounds_an_attempt_when_time_is_plentiful() -> None:
    allowance = Allowance(budget_end=100.0, deadline_end=200.0)
    assert allowance.attempt_end(10.0, now=5.0) == (15.0, None)


def test_the_budget_bounds_an_attempt_near_its_end() -> None:
    allowance = Allowance(budget_end=5.0, deadline_end=200.0)
    assert allowance.attempt_end(10.0, now=1.0) == (5.0, "budget")


def test_the_deadline_bounds_an_attempt_when_it_comes_first() -> None:
    allowance = Allowance(budget_end=50.0, deadline_end=3.0)
    assert allowance.attempt_end(10.0, now=1.0) == (3.0, "deadline")


def test_no_deadline_means_only_the_budget_counts() -> None:
    allowance = Allowance(budget_end=5.0)
    assert allowance.tightest(now=2.0) == (3.0, "budget")


def test_a_wait_that_fits_is_allowed() -> None:
    assert Allowance(budget_end=10.0).refuses_wait(2.0, now=1.0) is None


def test_a_wait_past_the_budget_is_refused_as_budget() -> None:
    assert Allowance(budget_end=0.5).refuses_wait(60.0, now=0.0) == "budget"


def test_a_wait_past_the_deadline_is_refused_as_deadline() -> None:
    assert Allowance(budget_end=100.0, deadline_end=5.0).refuses_wait(6.0, now=0.0) == "deadline"


def test_a_wait_that_ends_exactly_at_the_limit_leaves_no_time_and_is_refused() -> None:
    assert Allowance(budget_end=3.0).refuses_wait(2.0, now=1.0) == "budget"
