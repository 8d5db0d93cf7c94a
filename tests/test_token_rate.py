"""The token budget (``token_rate``): each attempt takes its item's cost, waits for it at the
rate, and the answer sets the estimate right; the providers' headers hold a host before a
request would overdraw the tokens they say are left."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import batchsync
from batchsync import fetch_all
from batchsync.budget import Allowance
from batchsync.calls import CallJob
from batchsync.classify import classify_raised, host_feedback
from batchsync.gates import Admission
from batchsync.httpfacts import HttpFacts, facts_of
from batchsync.limits import Cooldowns, Gates, QuotaGate
from batchsync.options import CallOptions, FetchOptions, build
from batchsync.provider import Announced
from batchsync.quota import answer_limits
from batchsync.rates import Rate
from batchsync.tokenrate import AnnouncedRates, TokenRate, item_cost, used_tokens
from batchsync.verdict import Feedback, InvalidItem, success

from .fakeclock import FakeClock
from .mockserver import MockServerProcess


def gates_with(budget: str, clock: FakeClock) -> Gates:
    return Gates([TokenRate.of(budget).gate(concurrency=4, shared=None, clock=clock)], clock=clock)


def admit(gates: Gates, clock: FakeClock, cost: int, budget: float = 600.0) -> Admission | str:
    return gates.admit("h", Allowance(clock.now() + budget), threading.Event(), cost)


def test_a_budget_starts_empty_and_each_attempt_waits_for_its_cost_at_the_rate() -> None:
    clock = FakeClock()
    gates = gates_with("600/min", clock)  # 10 tokens a second
    started = clock.now()
    assert isinstance(admit(gates, clock, 20), Admission)
    assert clock.now() - started == pytest.approx(2.0)
    assert isinstance(admit(gates, clock, 50), Admission)
    assert clock.now() - started == pytest.approx(7.0)
    assert gates.waits.seconds["tokens"] == pytest.approx(7.0)


def test_an_attempt_that_weighs_nothing_passes_without_taking_from_the_budget() -> None:
    clock = FakeClock()
    gates = gates_with("60/min", clock)
    started = clock.now()
    for _ in range(5):
        assert isinstance(admit(gates, clock, 0), Admission)
    assert clock.now() == started


def test_what_the_answer_used_replaces_the_estimate() -> None:
    clock = FakeClock()
    gates = gates_with("600/min", clock)
    clock.time += 60  # a full budget: 600 tokens
    first = admit(gates, clock, 500)
    assert isinstance(first, Admission)
    gates.release(first, Feedback(used=100))  # 400 given back: 500 left
    started = clock.now()
    assert isinstance(admit(gates, clock, 500), Admission)
    assert clock.now() == started
    second = admit(gates, clock, 10)  # nothing left: 1 s for 10 tokens
    assert clock.now() - started == pytest.approx(1.0)
    assert isinstance(second, Admission)
    gates.release(second, Feedback(used=110))  # 100 more taken: 10 s more for the next 0+
    started = clock.now()
    assert isinstance(admit(gates, clock, 10), Admission)
    assert clock.now() - started == pytest.approx(11.0)


def test_the_providers_remaining_tokens_cap_the_budget_and_stand_over_usage() -> None:
    clock = FakeClock()
    gates = gates_with("600/min", clock)
    clock.time += 60
    first = admit(gates, clock, 100)  # 500 left to us
    assert isinstance(first, Admission)
    gates.release(first, Feedback(announced=Announced(tokens_remaining=20), used=1))
    started = clock.now()
    assert isinstance(admit(gates, clock, 40), Admission)  # 20 there, 20 more in 2 s
    assert clock.now() - started == pytest.approx(2.0)


def test_an_attempt_never_sent_gives_its_tokens_back() -> None:
    clock = FakeClock()
    gates = gates_with("600/min", clock)
    clock.time += 60
    first = admit(gates, clock, 600)
    assert isinstance(first, Admission)
    gates.abandon(first)
    started = clock.now()
    assert isinstance(admit(gates, clock, 600), Admission)
    assert clock.now() == started


def test_a_wait_the_items_budget_cannot_cover_ends_it_and_takes_nothing() -> None:
    clock = FakeClock()
    gates = gates_with("60/min", clock)  # 1 token a second
    assert admit(gates, clock, 30, budget=10.0) == "budget"
    clock.time += 30
    started = clock.now()
    assert isinstance(admit(gates, clock, 30), Admission)  # the refused 30 were given back
    assert clock.now() == started


@pytest.mark.parametrize(
    ("cost", "error"),
    [
        (lambda item: 70, "needs about 70 tokens, more than the token_rate of 60/min allows"),
        (lambda item: 1 / 0, "cost raised ZeroDivisionError"),
        (lambda item: -1, "cost must give a whole number of tokens"),
        (lambda item: 2.5, "cost must give a whole number of tokens"),
    ],
)
def test_an_item_whose_cost_is_unusable_or_too_large_is_invalid(cost: Any, error: str) -> None:
    with pytest.raises(InvalidItem, match=error):
        item_cost({"x": 1}, {}, cost, TokenRate(Rate(60, 60)))


def test_an_items_cost_defaults_to_its_bodys_estimate() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50, "n": 2}
    assert item_cost(body, body, None, None) >= 100 + 100
    assert item_cost("https://a.example/", None, None, None) == 0


def test_usage_that_cannot_be_read_leaves_the_estimate() -> None:
    assert used_tokens(lambda data: data["usage"]["total_tokens"], {"usage": {"total_tokens": 7}})
    unusable: list[Any] = [lambda data: 1 / 0, lambda data: "many", lambda data: True]
    assert [used_tokens(usage, {}) for usage in unusable] == [None, None, None]


def test_the_tokens_a_host_says_are_left_hold_its_attempts_before_they_overdraw() -> None:
    """No budget of its own: once an answer says 300 of 1 300 tokens are left, back in full
    in 10 s (100 a second), attempts take from those and wait for what is missing; what was
    taken after the answered attempt is not in its count, and is taken off it."""
    clock = FakeClock()
    gates = Gates(cooldowns=Cooldowns(clock.now), clock=clock)
    said = Announced(tokens_limit=1300, tokens_remaining=300, tokens_reset=10.0)
    first = admit(gates, clock, 200)  # nothing told yet: sent at once
    assert isinstance(first, Admission)
    gates.release(first, Feedback(announced=said))  # 300 left
    started = clock.now()
    answered, after = admit(gates, clock, 100), admit(gates, clock, 100)  # 100 left
    assert isinstance(answered, Admission) and isinstance(after, Admission)
    assert clock.now() == started
    gates.release(answered, Feedback(announced=said))  # 300 left, less the 100 sent after
    assert isinstance(admit(gates, clock, 400), Admission)  # 200 there: 200 more, 2 s
    assert clock.now() - started == pytest.approx(2.0)
    gates.abandon(after)  # never sent after all: its 100 back
    assert isinstance(admit(gates, clock, 100), Admission)
    assert clock.now() - started == pytest.approx(2.0)
    assert isinstance(admit(gates, clock, 0), Admission)  # weighs nothing: never held
    assert any(isinstance(gate, QuotaGate) for gate in gates.gates)


def test_an_answer_that_says_no_requests_are_left_holds_the_host_until_their_reset() -> None:
    clock = FakeClock()
    gates = Gates(cooldowns=Cooldowns(clock.now), clock=clock)
    answered = admit(gates, clock, 0)
    assert isinstance(answered, Admission)
    quota, said = answer_limits(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"},
        lambda: 0.0,
    )
    assert said is not None and quota == 1.5
    gates.release(answered, Feedback(quota=quota, announced=said))
    started = clock.now()
    assert isinstance(admit(gates, clock, 0), Admission)
    assert clock.now() - started == pytest.approx(1.5)


def test_an_answers_provider_limits_and_usage_reach_the_limits() -> None:
    said = Announced(tokens_remaining=5, tokens_reset=1.0)
    feedback = host_feedback(success({}, HttpFacts(200, announced=said, used=42)))
    assert (feedback.announced, feedback.used, feedback.unwell) == (said, 42, False)


class NotNow(Exception):
    """An SDK's exception that says when to come back, with no HTTP status."""

    retry_after = 2.5


def test_an_exception_with_a_wait_and_no_status_is_retried_after_the_wait() -> None:
    verdict = classify_raised(NotNow("busy"), None, 0.0)
    assert (verdict.outcome, verdict.retry_after) == ("retry", 2.5)
    assert classify_raised(NotNow("busy"), lambda exc: False, 0.0).outcome == "terminal"


def test_fetch_all_fails_an_item_over_the_whole_budget_unsent(
    fresh_server: MockServerProcess,
) -> None:
    body = {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 10}
    url = f"{fresh_server.url}/status/200"
    results = fetch_all([{"url": url, "method": "POST", "json": body}], token_rate="500/min")
    (result,) = results
    assert (result.ok, result.error_kind, result.attempts) == (False, "invalid_request", 0)
    assert "more than the token_rate of 500/min allows at once" in (result.error or "")
    assert fresh_server.count("/status/200") == 0


def test_token_rate_must_read_as_a_rate() -> None:
    with pytest.raises(ValueError, match="token_rate must be a positive number"):
        fetch_all([], token_rate="lots")
    with pytest.raises(ValueError, match="rate must be a positive number"):
        fetch_all([], rate="5/day")


class Completion:
    """What an SDK's raw call returns: its usage, and its response's headers."""

    def __init__(self, tokens: int) -> None:
        self.usage = {"total_tokens": tokens}
        self.headers = {"x-ratelimit-remaining-requests": "9", "x-ratelimit-remaining-tokens": "0",
                        "x-ratelimit-reset-tokens": "3s"}  # fmt: skip


class Refused(Exception):
    """An SDK's rate-limit error: its status, and the response it came with."""

    status_code = 429

    def __init__(self) -> None:
        super().__init__("rate limited")
        self.response = Completion(0)


def call_job(token_rate: str | None) -> CallJob:
    options = build(CallOptions, token_rate=token_rate)
    return CallJob(lambda item: item(), options, options.secrets())


def test_a_call_reads_the_usage_and_headers_an_sdk_returns() -> None:
    verdict = call_job("6000/min")._call_once(lambda: Completion(12))
    facts = facts_of(verdict)
    assert verdict.ok and facts.used == 12
    assert facts.announced is not None and facts.announced.tokens_remaining == 0
    feedback = host_feedback(verdict)
    assert (feedback.used, feedback.announced) == (12, facts.announced)
    assert call_job(None)._call_once(lambda: Completion(12)).facts is not None  # headers still


def test_a_call_reads_the_headers_on_the_exception_an_sdk_raises() -> None:
    def refused() -> None:
        raise Refused()

    verdict = call_job(None)._call_once(refused)
    facts = facts_of(verdict)
    assert (verdict.outcome, facts.status_code) == ("retry", 429)
    assert facts.announced is not None and facts.announced.tokens_reset == 3.0


def test_auto_takes_up_the_budgets_the_first_answer_announces() -> None:
    clock = FakeClock()
    option = build(FetchOptions, rate="auto").announced_rates
    assert option is not None
    gates = Gates([option.gate(concurrency=4, shared=None, clock=clock)], clock=clock)
    started = clock.now()
    first, second = admit(gates, clock, 30), admit(gates, clock, 30)  # nothing known yet
    assert isinstance(first, Admission) and isinstance(second, Admission)
    assert clock.now() == started
    said = Announced(requests_limit=60, tokens_limit=600, tokens_remaining=590)
    gates.release(first, Feedback(announced=said))  # 1 request a second, 10 tokens a second
    gates.release(second, Feedback(announced=said))
    assert isinstance(admit(gates, clock, 30), Admission)  # its 30 tokens: 3 s (none to start)
    assert clock.now() - started == pytest.approx(3.0)
    assert isinstance(admit(gates, clock, 0), Admission)  # the request rate's token came back
    assert clock.now() - started == pytest.approx(3.0)
    assert isinstance(admit(gates, clock, 0), Admission)  # and the next is 1 s later
    assert clock.now() - started == pytest.approx(4.0)
    assert build(FetchOptions, rate="auto", token_rate="60/s").announced_rates == AnnouncedRates(
        tokens=False
    )
    assert build(FetchOptions, rate="10/s").announced_rates is None


def test_a_cost_function_that_raises_with_a_secret_ends_its_item_masked_and_unsent(
    fresh_server: MockServerProcess,
) -> None:
    """The caller's cost function may quote the item, key and all: the Result says it
    failed, invalid_request and never sent, with the key masked."""
    url = f"{fresh_server.url}/status/200?api_key=cost-canary-5150"

    def cost(item: Any) -> int:
        raise ValueError(f"cannot weigh {item['url']}")

    rs = fetch_all([{"url": url, "method": "POST", "json": {}}], cost=cost)
    assert (rs[0].error_kind, rs[0].attempts) == ("invalid_request", 0)
    assert "cost raised ValueError" in (rs[0].error or "")
    assert "cost-canary-5150" not in repr(rs[0]) and "cost-canary-5150" not in str(rs.summary())
    assert fresh_server.count("/status/200") == 0
    calls = batchsync.run_all(lambda item: item, ["secret cost-canary-5150"], cost=cost)
    assert calls[0].error_kind == "invalid_request"
