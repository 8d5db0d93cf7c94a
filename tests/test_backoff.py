from __future__ import annotations

import email.utils

import pytest

from batchsync.core.backoff import Backoff, parse_retry_after

NOW = 1_800_000_000.0


def test_waits_grow_exponentially_and_stop_at_the_cap() -> None:
    policy = Backoff(base=0.5, factor=2.0, max=3.0, jitter=0.0)
    assert [policy.wait(n, None, 0.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_stretches_the_wait_by_at_most_its_share() -> None:
    policy = Backoff(base=1.0, factor=2.0, max=30.0, jitter=0.5)
    assert policy.wait(2, None, 0.0) == 2.0
    assert policy.wait(2, None, 0.999) == pytest.approx(2.999)


def test_retry_after_is_a_floor_never_undercut() -> None:
    policy = Backoff(base=0.5, factor=2.0, max=30.0, jitter=0.5)
    assert policy.wait(1, 7.0, 0.9) == 7.0
    # a shorter Retry-After does not shorten the backoff
    assert policy.wait(3, 0.1, 0.0) == 2.0


def test_huge_attempt_numbers_do_not_overflow() -> None:
    assert Backoff(base=1.0, factor=10.0, max=5.0, jitter=0.0).wait(10_000, None, 0.0) == 5.0


@pytest.mark.parametrize(
    "fields", [{"base": -1.0}, {"factor": 0.5}, {"max": float("inf")}, {"jitter": float("nan")}]
)
def test_nonsense_policies_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**fields)


@pytest.mark.parametrize(
    ("header", "expected"),
    [("3", 3.0), (" 120 ", 120.0), ("0", 0.0), ("1.5", 1.5)],
)
def test_retry_after_seconds(header: str, expected: float) -> None:
    assert parse_retry_after(header, NOW) == expected


def test_retry_after_http_date_is_relative_to_now() -> None:
    header = email.utils.formatdate(NOW + 42, usegmt=True)
    assert parse_retry_after(header, NOW) == pytest.approx(42.0)


def test_retry_after_date_in_the_past_means_no_wait() -> None:
    header = email.utils.formatdate(NOW - 3600, usegmt=True)
    assert parse_retry_after(header, NOW) == 0.0


@pytest.mark.parametrize("header", [None, "", "soon", "-5", "nan", "inf", "Mon, 99 Foo 2020"])
def test_retry_after_garbage_says_nothing(header: str | None) -> None:
    assert parse_retry_after(header, NOW) is None
