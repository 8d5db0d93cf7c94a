"""The token budget (``token_rate``): each attempt takes its item's cost, waits for it at the
rate, and the answer sets the estimate right; the providers' headers hold a host before a
request would overdraw the tokens they say are left."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import batchsync
from batchsync import fetch_all
from batchsync.core.admission import Admission
from batchsync.core.budget import Allowance
from batchsync.core.verdict import Announced, Feedback, InvalidItem, success
from batchsync.http.classify import classify_raised, host_feedback
from batchsync.http.httpfacts import HttpFacts, facts_of
from batchsync.http.quota import answer_limits
from batchsync.jobs.calls import CallJob
from batchsync.jobs.options import CallOptions, FetchOptions, build
from batchsync.limits.announced import AnnouncedRates
from batchsync.limits.cooldown import CooldownGate, Cooldowns
from batchsync.limits.gates import Gates, Refusal
from batchsync.limits.quota import QuotaGate
from batchsync.limits.rates import Rate
from batchsync.limits.tokenrate import TokenRate, item_cost, used_tokens

from .fakeclock import FakeClock
from .mockserver import MockServerProcess


def gates_with(budget: str, clock: FakeClock) -> Gates:
    return Gates([TokenRate.of(budget).gate(concurrency=4, shared=None, clock=clock)], clock=clock)


def admit(gates: Gates, clock: FakeClock, cost: int, budget: float = 600.0) -> Admission | str:
    return gates.admit("h", Allowance(clock.now() + budget), threading.Event(), cost)


def test_a_budget_is_paced_from_the_start_each_cost_spacing_the_next() -> None:
    clock = FakeClock()
    gates = gates_with("600/min", clock)  # 600 tokens in any minute: one each 0.1 s
    started = clock.now()
    assert isinstance(admit(gates, clock, 20), Admission)  # no burst saved up, none owed
    assert clock.now() == started
    assert isinstance(admit(gates, clock, 50), Admission)  # behind the first's 20: 2 s
    assert clock.now() - started == pytest.approx(2.0)
    assert isinstance(admit(gates, clock, 10), Admission)  # behind the 50: 5 s more
    assert clock.now() - started == pytest.approx(7.0)
    assert gates.waits.seconds["tokens"] == pytest.approx(7.0)


def test_an_attempt_that_weighs_nothing_passes_without_taking_from_the_budget() -> None:
    clock = FakeClock()
    gates = gates_with("60/min", clock)
    started = clock.now()
    for _ in range(5):
        assert isinstance(admit(gates, clock, 0), Admission)
    assert clock.now() == started


def test_a_window_holds_what_the_answer_used_when_more_never_less_and_for_a_period() -> None:
    """The server may count what was asked for (``max_tokens``): an answer that used less
    gives nothing back; one that used more holds more. An entry leaves one period after its
    attempt ended."""
    clock = FakeClock()
    gates = gates_with("600/min", clock)
    first = admit(gates, clock, 100)
    assert isinstance(first, Admission)
    gates.release(first, Feedback(used=300))  # 300 held, ended at 0: leaves at 60
    started = clock.now()
    second = admit(gates, clock, 300)  # paced 10 s behind; 600 held then
    assert isinstance(second, Admission)
    assert clock.now() - started == pytest.approx(10.0)
    gates.release(second, Feedback(used=5))  # used less: still 300
    assert isinstance(admit(gates, clock, 10), Admission)  # 610 > 600: until the first leaves
    assert clock.now() - started == pytest.approx(60.0)


def test_an_attempt_never_sent_gives_its_tokens_and_its_pace_back() -> None:
    clock = FakeClock()
    gates = gates_with("600/min", clock)
    first = admit(gates, clock, 600)
    assert isinstance(first, Admission)
    gates.abandon(first)
    started = clock.now()
    assert isinstance(admit(gates, clock, 600), Admission)
    assert clock.now() == started


def test_a_wait_the_items_budget_cannot_cover_ends_it_at_once_and_takes_nothing() -> None:
    clock = FakeClock()
    gates = gates_with("60/min", clock)  # 60 tokens in any minute: one each second
    assert isinstance(admit(gates, clock, 30), Admission)
    started = clock.now()
    refused = gates.enter("h", Allowance(clock.now() + 10.0), threading.Event(), 30)
    assert isinstance(refused, Refusal) and refused.kind == "budget"
    assert refused.why == (
        "the tokens limit of 60 per 60 s has room again in 30.0 s, more than the budget left"
    )
    assert clock.now() == started
    clock.time += 30
    assert isinstance(admit(gates, clock, 30), Admission)  # the refused 30 took nothing
    assert clock.now() == started + 30


@pytest.mark.parametrize(
    ("cost", "error"),
    [
        (lambda item: 70, "needs about 70 tokens, more than the token_rate of 60/min allows"),
        (lambda item: 1 / 0, "cost raised ZeroDivisionError"),
        (lambda item: -1, "cost must give a whole number of tokens"),
        (lambda item: 2.5, "cost must give a whole number of tokens"),
        (lambda item: 10**400, "cost must give a whole number of tokens from 0 to"),
    ],
)
def test_an_item_whose_cost_is_unusable_or_too_large_is_invalid(cost: Any, error: str) -> None:
    with pytest.raises(InvalidItem, match=error):
        item_cost({"x": 1}, {}, cost, [TokenRate(Rate(60, 60))])


def test_an_items_cost_defaults_to_its_bodys_estimate() -> None:
    body = {"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50, "n": 2}
    cost, sides = item_cost(body, body, None, [])
    assert cost >= 100 + 100 and sides is not None and sides[1] == 100 and sum(sides) == cost
    assert item_cost("https://a.example/", None, None, []) == (0, (0, 0))


def test_usage_that_cannot_be_read_leaves_the_estimate() -> None:
    assert used_tokens(lambda data: data["usage"]["total_tokens"], {"usage": {"total_tokens": 7}})
    unusable: list[Any] = [lambda data: 1 / 0, lambda data: "many", lambda data: True]
    assert [used_tokens(usage, {}) for usage in unusable] == [None, None, None]


def test_the_tokens_a_host_says_are_left_hold_its_attempts_until_its_reset() -> None:
    """No budget of its own: once an answer says 300 of 1 300 tokens are left, the reset in
    10 s, attempts take from those 300 and wait for the reset for more (a sliding window may
    free nothing sooner); what was taken after the answered attempt is not in its count, and
    is taken off it. After the reset one attempt goes, and its answer says what came back (a
    window announcing its oldest entry frees only that one)."""
    clock = FakeClock()
    board = Cooldowns(clock.now)
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board, clock.now)], clock=clock)
    said = Announced(tokens_limit=1300, tokens_remaining=300, tokens_reset=10.0)
    first = admit(gates, clock, 200)  # nothing told yet: the host's first, alone
    assert isinstance(first, Admission)
    gates.release(first, Feedback(announced=said))  # 300 left
    started = clock.now()
    answered, after = admit(gates, clock, 100), admit(gates, clock, 100)  # 100 left
    assert isinstance(answered, Admission) and isinstance(after, Admission)
    assert clock.now() == started
    gates.release(answered, Feedback(announced=said))  # 300 left, less the 100 sent after
    probe = admit(gates, clock, 400)  # 200 there: wait for the reset
    assert isinstance(probe, Admission)
    assert clock.now() - started == pytest.approx(10.0)
    gates.abandon(after)  # never sent after all
    told = Announced(tokens_limit=1300, tokens_remaining=900, tokens_reset=10.0)
    gates.release(probe, Feedback(announced=told))
    assert isinstance(admit(gates, clock, 800), Admission)  # as the probe's answer told
    assert clock.now() - started == pytest.approx(10.0)
    assert isinstance(admit(gates, clock, 0), Admission)  # weighs nothing: never held
    assert any(isinstance(gate, QuotaGate) for gate in gates.gates)


def test_a_spent_count_without_a_limit_holds_until_its_reset() -> None:
    clock = FakeClock()
    board = Cooldowns(clock.now)
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board, clock.now)], clock=clock)
    first = admit(gates, clock, 10)
    assert isinstance(first, Admission)
    gates.release(first, Feedback(announced=Announced(tokens_remaining=0, tokens_reset=2.0)))
    started = clock.now()
    assert isinstance(admit(gates, clock, 10), Admission)
    assert clock.now() - started == pytest.approx(2.0)


def test_an_older_answer_never_undoes_what_a_newer_one_told() -> None:
    clock = FakeClock()
    board = Cooldowns(clock.now)
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board, clock.now)], clock=clock)
    probe = admit(gates, clock, 1)
    assert isinstance(probe, Admission)
    told = Announced(tokens_limit=1000, tokens_remaining=900, tokens_reset=5.0)
    gates.release(probe, Feedback(announced=told))
    older, newer = admit(gates, clock, 10), admit(gates, clock, 10)
    assert isinstance(older, Admission) and isinstance(newer, Admission)
    older.sent, newer.sent = clock.now() - 0.5, clock.now()
    gates.release(newer, Feedback(announced=Announced(tokens_remaining=50, tokens_reset=5.0)))
    gates.release(older, Feedback(announced=Announced(tokens_remaining=880, tokens_reset=5.0)))
    started = clock.now()
    assert isinstance(admit(gates, clock, 100), Admission)  # 50 left, as the newer said
    assert clock.now() - started == pytest.approx(5.0)


def test_before_a_hosts_first_answer_its_weighed_attempts_go_one_at_a_time() -> None:
    """With many workers, a blind start would send a period's worth before the first count
    came back: the second waits for the first's answer, then takes from its count."""
    board = Cooldowns()
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board)])
    first = gates.admit("h", Allowance(time.monotonic() + 30), threading.Event(), 100)
    assert isinstance(first, Admission)
    got: list[object] = []
    second = threading.Thread(
        target=lambda: got.append(
            gates.admit("h", Allowance(time.monotonic() + 30), threading.Event(), 100)
        )
    )
    second.start()
    second.join(0.3)
    assert second.is_alive() and not got  # held while the first is in flight
    elsewhere = gates.admit("other", Allowance(time.monotonic() + 5), threading.Event(), 100)
    assert isinstance(elsewhere, Admission)  # (another host's first is its own)
    gates.release(first, Feedback(announced=Announced(tokens_remaining=150, tokens_reset=60)))
    second.join(5)
    assert got and isinstance(got[0], Admission)
    refused = gates.admit("h", Allowance(time.monotonic() + 1), threading.Event(), 100)
    assert refused == "budget"  # 150 - 100 taken since: 50 left until the reset in 60 s


def test_an_answer_that_says_no_requests_are_left_holds_the_host_until_their_reset() -> None:
    clock = FakeClock()
    board = Cooldowns(clock.now)
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board, clock.now)], clock=clock)
    answered = admit(gates, clock, 0)
    assert isinstance(answered, Admission)
    quota, said = answer_limits(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1.5s"},
        lambda: 0.0,
    )
    assert said is not None and quota is None  # (the counts hold it, not a quota)
    gates.release(answered, Feedback(announced=said))
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


def test_auto_follows_the_limits_each_answer_announces(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    option = build(FetchOptions, rate="auto").announced_rates
    assert option is not None
    gates = Gates([option.gate(concurrency=4, shared=None, clock=clock)], clock=clock)
    started = clock.now()
    first, second = admit(gates, clock, 30), admit(gates, clock, 30)  # nothing known yet
    assert isinstance(first, Admission) and isinstance(second, Admission)
    assert clock.now() == started
    said = Announced(requests_limit=60, tokens_limit=600, tokens_remaining=590)
    gates.release(first, Feedback(announced=said))  # 60 requests, 600 tokens a minute
    gates.release(second, Feedback(announced=said))
    assert isinstance(admit(gates, clock, 30), Admission)  # evenly paced from here
    assert clock.now() == started
    assert isinstance(admit(gates, clock, 0), Admission)  # a request each second
    assert clock.now() - started == pytest.approx(1.0)
    up = admit(gates, clock, 0)
    assert isinstance(up, Admission) and clock.now() - started == pytest.approx(2.0)
    gates.release(up, Feedback(announced=Announced(requests_limit=120)))
    assert isinstance(admit(gates, clock, 0), Admission)  # (its pace was set before)
    assert clock.now() - started == pytest.approx(3.0)
    assert isinstance(admit(gates, clock, 0), Admission)  # now one each 0.5 s
    assert clock.now() - started == pytest.approx(3.5)
    for _ in range(2):  # a limit of 0 cannot be one: ignored, said once
        zero = admit(gates, clock, 0)
        assert isinstance(zero, Admission)
        gates.release(zero, Feedback(announced=Announced(requests_limit=0)))
    assert [r.getMessage() for r in caplog.records].count(
        "h announced a requests limit of 0, which cannot be a limit: ignored"
    ) == 1
    assert build(FetchOptions, rate="auto", token_rate="60/s").announced_rates == AnnouncedRates(
        own=frozenset({"tokens"})
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
