"""The retry decision after an attempt, as a pure function of its inputs."""

from __future__ import annotations

import pytest

from batchsync.core.backoff import Backoff
from batchsync.core.budget import Allowance
from batchsync.core.decide import Attempted, Decision, cut_short, decide
from batchsync.core.verdict import Verdict
from batchsync.http.httpfacts import HttpFacts

BACKOFF = Backoff(base=1.0, factor=2.0, max=30.0, jitter=0.5)
ROOMY = Allowance(budget_end=100.0)
OK = Verdict("success", None, None, HttpFacts(200))
NOT_FOUND = Verdict("terminal", "status", "HTTP 404", HttpFacts(404))
UNAVAILABLE = Verdict("retry", "status", "HTTP 503", HttpFacts(503))


def after(number: int, *, max_attempts: int = 3, attempts: int = 3, **more: object) -> Attempted:
    return Attempted(number, max_attempts, attempts, ended=10.0, **more)  # type: ignore[arg-type]


def test_a_success_or_a_final_failure_ends_the_route() -> None:
    assert decide(OK, after(1), BACKOFF, 0.0, ROOMY) == Decision(OK, error="")
    assert decide(NOT_FOUND, after(1), BACKOFF, 0.0, ROOMY) == Decision(NOT_FOUND, error="HTTP 404")
    assert decide(NOT_FOUND, after(2), BACKOFF, 0.0, ROOMY).error == "HTTP 404 after 2 attempts"


@pytest.mark.parametrize(("number", "rand", "wait"), [(1, 0.0, 1.0), (2, 0.0, 2.0), (2, 1.0, 3.0)])
def test_a_retryable_failure_waits_the_backoff(number: int, rand: float, wait: float) -> None:
    assert decide(UNAVAILABLE, after(number), BACKOFF, rand, ROOMY) == Decision(UNAVAILABLE, wait)


def test_retry_after_is_a_floor_under_the_wait() -> None:
    told = Verdict("retry", "status", "HTTP 429", HttpFacts(429), retry_after=7.0)
    assert decide(told, after(1), BACKOFF, 0.0, ROOMY).wait == 7.0


def test_the_last_attempt_ends_the_route_still_retryable() -> None:
    decision = decide(UNAVAILABLE, after(3), BACKOFF, 0.0, ROOMY)
    assert decision == Decision(UNAVAILABLE, error="HTTP 503 after 3 attempts")


def test_a_route_allowed_fewer_attempts_says_why() -> None:
    reason = "POST is not retried without an idempotency_key"
    attempted = after(1, max_attempts=1, no_retry_reason=reason)
    decision = decide(UNAVAILABLE, attempted, BACKOFF, 0.0, ROOMY)
    assert decision.error == f"HTTP 503 after 1 attempt ({reason})"


def test_a_post_retried_after_its_429s_does_not_say_it_was_not_retried() -> None:
    refused = Verdict("retry", "status", "HTTP 429", HttpFacts(429), resendable=True)
    attempted = after(3, max_attempts=1, no_retry_reason="POST is not retried without a key")
    assert decide(refused, attempted, BACKOFF, 0.0, ROOMY).error == "HTTP 429 after 3 attempts"


@pytest.mark.parametrize(
    ("allowance", "kind"),
    [
        (Allowance(budget_end=10.5), "budget"),
        (Allowance(budget_end=50.0, deadline_end=10.9), "deadline"),
    ],
)
def test_a_wait_that_passes_a_limit_ends_the_route_as_that_limit(
    allowance: Allowance, kind: str
) -> None:
    decision = decide(UNAVAILABLE, after(1), BACKOFF, 0.0, allowance)
    assert (decision.wait, decision.verdict.outcome, decision.verdict.error_kind) == (
        None, "terminal", kind,
    )  # fmt: skip
    assert (
        decision.error == f"HTTP 503 after 1 attempt; the next try in 1.00 s would pass the {kind}"
    )


def test_a_timeout_the_budget_cut_short_is_the_budgets() -> None:
    timed_out = Verdict("retry", "timeout", "timed out")
    assert cut_short(timed_out, None) is timed_out  # the attempt's own timeout
    verdict = cut_short(timed_out, "budget")
    assert (verdict.outcome, verdict.error_kind) == ("terminal", "budget")
    decision = decide(verdict, after(1), BACKOFF, 0.0, ROOMY)
    assert decision == Decision(verdict, error="timed out (cut short by the budget)")
