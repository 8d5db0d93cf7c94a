"""The table of error kinds: one record per kind, read by every decision by kind."""

from __future__ import annotations

import typing

import pytest

from batchsync.core.kinds import KINDS, NOT_FINAL, failed, may_fall_back, stopped_reason
from batchsync.core.verdict import ErrorKind, Verdict
from batchsync.http.httpfacts import HttpFacts


def test_every_error_kind_has_its_record_and_no_other() -> None:
    assert set(KINDS) == set(typing.get_args(ErrorKind))


def test_only_a_stop_is_sent_again_on_resume() -> None:
    assert {"cancelled"} == NOT_FINAL


@pytest.mark.parametrize(
    ("kind", "outcome"),
    [("timeout", "retry"), ("connection", "retry"), ("tls", "terminal"), ("status", "terminal")],
)
def test_a_failure_is_retried_as_its_kind_says(kind: ErrorKind, outcome: str) -> None:
    verdict = failed(kind, "e", HttpFacts(502), 1.5)
    assert (verdict.outcome, verdict.error_kind, verdict.facts) == (outcome, kind, HttpFacts(502))
    assert verdict.retry_after == 1.5


@pytest.mark.parametrize(
    ("kind", "outcome", "primary", "falls_back"),
    [
        ("budget", "terminal", False, False),
        ("deadline", "terminal", True, False),
        ("cancelled", "terminal", False, False),
        ("circuit_open", "terminal", True, True),
        ("status", "retry", True, True),  # the retries ran out
        ("status", "terminal", True, False),  # a final answer (a 404)
        ("status", "terminal", False, True),  # a fallback's final answer: the next one
        ("timeout", "retry", True, True),
    ],
)
def test_fallbacks_follow_as_the_kind_says(
    kind: ErrorKind, outcome: typing.Any, primary: bool, falls_back: bool
) -> None:
    assert may_fall_back(Verdict(outcome, kind, "e"), primary=primary) is falls_back


def test_a_route_stopped_short_says_why() -> None:
    assert stopped_reason("circuit_open", "h:80") == "the circuit for h:80 is open"
    assert stopped_reason("circuit_open", None) == "the circuit for every call is open"
    assert stopped_reason("budget", None) == "no time left in the budget"
    assert stopped_reason("tls", None) == "tls"
