"""Fallbacks, single-flight dedup, hedging and hooks: judged by the Results and the server."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pytest

from batchsync import AttemptRecord, Backoff, Breaker, RequestSpec, Result, fetch_all
from batchsync.core.result import percentile
from batchsync.core.verdict import Verdict, retry, success
from batchsync.http.hedge import HedgeDelay, Hedger
from batchsync.http.httpfacts import HttpFacts

from .mockserver import MockServerProcess

FAST = Backoff(base=0.02, jitter=0.0)


def key() -> str:
    return uuid.uuid4().hex[:10]


@pytest.mark.integration
def test_a_fallback_url_serves_when_the_primary_stays_down(server: MockServerProcess) -> None:
    marker = key()
    item = {
        "url": f"{server.url}/503/{marker}",
        "fallbacks": [f"{server.url}/ok/{marker}-mirror"],
        "id": "p1",
    }
    (result,) = fetch_all([item], attempts=2, backoff=FAST)
    assert (result.ok, result.fallback_used, result.id) == (True, 0, "p1")
    assert result.data == {"path": f"/ok/{marker}-mirror", "ok": True}
    assert [(r.status_code, r.fallback) for r in result.attempt_log] == [
        (503, None), (503, None), (200, 0),
    ]  # fmt: skip
    assert result.attempts == 3


@pytest.mark.integration
def test_no_fallback_after_a_final_answer(server: MockServerProcess) -> None:
    marker = key()
    item = {"url": f"{server.url}/404/{marker}", "fallbacks": [f"{server.url}/ok/{marker}-m"]}
    (result,) = fetch_all([item], backoff=FAST)
    assert (result.error_kind, result.status_code, result.fallback_used) == ("status", 404, None)
    assert len(server.log(f"{marker}-m")) == 0


@pytest.mark.integration
def test_fallbacks_are_tried_in_order_until_one_answers(server: MockServerProcess) -> None:
    marker = key()
    item = {
        "url": f"{server.url}/503/{marker}",
        "fallbacks": [f"{server.url}/404/{marker}-a", f"{server.url}/ok/{marker}-b"],
    }
    (result,) = fetch_all([item], attempts=1, backoff=FAST)
    assert (result.ok, result.fallback_used) == (True, 1)
    assert [r.fallback for r in result.attempt_log] == [None, 0, 1]


@pytest.mark.integration
def test_when_every_route_fails_the_error_names_each(server: MockServerProcess) -> None:
    marker = key()
    item = {"url": f"{server.url}/503/{marker}", "fallbacks": [f"{server.url}/404/{marker}-a"]}
    (result,) = fetch_all([item], attempts=2, backoff=FAST)
    assert (result.ok, result.error_kind, result.status_code) == (False, "status", 404)
    assert result.error == "HTTP 503 after 2 attempts; fallback 0: HTTP 404"


@pytest.mark.integration
def test_fallbacks_stay_within_the_budget(server: MockServerProcess) -> None:
    marker = key()
    item = {
        "url": f"{server.url}/retry-after-60/{marker}",
        "fallbacks": [f"{server.url}/ok/{marker}-m"],
    }
    (result,) = fetch_all([item], budget=0.5)
    assert result.error_kind == "budget"
    assert len(server.log(f"{marker}-m")) == 0


@pytest.mark.integration
def test_an_open_circuit_sends_the_item_to_its_fallback(server: MockServerProcess) -> None:
    marker = key()
    mirror = server.url.replace("127.0.0.1", "localhost")
    items = [
        {"url": f"{server.url}/503/{marker}/{n}", "fallbacks": [f"{mirror}/ok/{marker}-{n}"]}
        for n in range(6)
    ]
    # A break (60 s) the budget (30 s) cannot cover: the held item goes to its fallback.
    rs = fetch_all(
        items, concurrency=1, attempts=1, budget=30, breaker=Breaker(min_calls=2, reset=60)
    )
    assert all(r.ok and r.fallback_used == 0 for r in rs)
    assert (
        len(server.log(f"/503/{marker}/")) == 2
    )  # then the circuit was open: straight to the mirror
    assert [len(r.attempt_log) for r in rs] == [2, 2, 1, 1, 1, 1]


@pytest.mark.integration
def test_library_fallbacks_get_the_spec_and_the_result_so_far(server: MockServerProcess) -> None:
    seen: list[tuple[RequestSpec, Result | None]] = []

    def from_cache(spec: RequestSpec, so_far: Result | None) -> dict[str, str]:
        seen.append((spec, so_far))
        return {"cached": spec.url}

    url = f"{server.url}/503/{key()}"
    (result,) = fetch_all([url], attempts=2, backoff=FAST, fallbacks=(from_cache,))
    assert (result.ok, result.data, result.fallback_used) == (True, {"cached": url}, 0)
    ((spec, so_far),) = seen
    assert spec.url == url
    assert so_far is not None
    assert (so_far.error_kind, so_far.status_code, so_far.attempts) == ("status", 503, 2)
    assert result.attempts == 3  # two requests and the fallback call


@pytest.mark.integration
def test_identical_requests_in_flight_together_are_sent_once(
    server: MockServerProcess,
) -> None:
    marker = key()
    urls = [f"{server.url}/ok/{marker}-{n}?delay=0.3" for n in range(8)]
    items = [url for url in urls for _ in range(5)]  # each URL 5 times, copies side by side
    rs = fetch_all(items, concurrency=10, dedup=True)
    assert all(r.ok for r in rs)
    assert [r.url for r in rs] == items
    assert len(server.log(marker)) == 8  # the saving: 40 items, 8 requests
    for n in range(len(urls)):
        copies = rs[5 * n : 5 * n + 5]
        assert sorted(r.attempts for r in copies) == [0, 0, 0, 0, 1]
        assert all(r.data == {"path": f"/ok/{marker}-{n}", "ok": True} for r in copies)


@pytest.mark.integration
def test_dedup_is_opt_in_and_skips_bodies_and_other_headers(
    server: MockServerProcess,
) -> None:
    marker = key()
    url = f"{server.url}/ok/{marker}?delay=0.2"
    rs = fetch_all([url] * 30, concurrency=10)  # polling one URL: N items are N requests
    assert len(server.log(marker)) == 30
    assert [r.attempts for r in rs] == [1] * 30
    other = key()
    items: list[str | dict[str, Any]] = [
        f"{server.url}/ok/{other}?delay=0.2",
        {"url": f"{server.url}/ok/{other}?delay=0.2", "headers": {"X-Tenant": "b"}},
        {"url": f"{server.url}/ok/{other}?delay=0.2", "method": "POST", "json": {}},
    ]
    fetch_all(items, concurrency=3, dedup=True)
    assert len(server.log(other)) == 3


def test_percentile_by_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]
    assert percentile(samples, 0.95) == 95.0
    assert percentile([3.0], 0.95) == 3.0


def test_p95_hedge_delay_waits_for_enough_samples() -> None:
    delay = HedgeDelay("p95")
    for n in range(19):
        delay.observe(n / 100)
    assert delay.current() is None
    delay.observe(0.19)
    assert delay.current() == pytest.approx(0.18)
    assert HedgeDelay(0.25).current() == 0.25


def test_a_hedge_wins_when_the_first_request_is_slow() -> None:
    calls: list[threading.Event] = []

    def exchange(lost: threading.Event) -> Verdict:
        calls.append(lost)
        if len(calls) == 1:
            lost.wait(2)  # a slow first answer, cut short once it has lost
            return success("slow", HttpFacts(200))
        return success("fast", HttpFacts(200))

    hedger = Hedger(HedgeDelay(0.05), workers=2, gates=None)
    started = time.monotonic()
    verdict = hedger.run(exchange, "h")
    assert time.monotonic() - started < 1
    assert (verdict.data, verdict.hedged) == ("fast", True)
    assert calls[0].is_set() and not calls[1].is_set()
    hedger.close()


def test_a_retryable_failure_does_not_win_the_race() -> None:
    def exchange(lost: threading.Event) -> Verdict:
        if threading.current_thread().name.endswith("_1"):
            return retry("connection", "reset")
        time.sleep(0.2)
        return success("answer", HttpFacts(200))

    hedger = Hedger(HedgeDelay(0.05), workers=2, gates=None)
    assert hedger.run(exchange, "h").data == "answer"
    hedger.close()


def item_latencies(rs: list[Result]) -> list[float]:
    return sorted(r.elapsed for r in rs)


@pytest.mark.integration
def test_hedging_cuts_the_tail(server: MockServerProcess) -> None:
    plain, hedged = key(), key()
    # every 20th request of a family takes 2 s: 5 % of the responses
    base = f"{server.url}/jitter"
    slow_plain = fetch_all([f"{base}/{plain}/{n}?every=20" for n in range(200)], concurrency=10)
    fast = fetch_all(
        [f"{base}/{hedged}/{n}?every=20" for n in range(200)], concurrency=10, hedge_after=0.2
    )
    assert all(r.ok for r in [*slow_plain, *fast])
    assert percentile(item_latencies(list(slow_plain)), 0.99) >= 1.9
    assert percentile(item_latencies(list(fast)), 0.99) < 1.0
    # about one request in 20 is slow, hedges included: roughly 10 items were hedged
    assert sum(r.attempt_log[0].hedged for r in fast) >= 5
    assert sum(r.attempts for r in fast) == 200 + sum(r.attempt_log[0].hedged for r in fast)


@pytest.mark.integration
def test_hedging_respects_the_rate_limit(server: MockServerProcess) -> None:
    marker = key()
    rs = fetch_all(
        [f"{server.url}/jitter/{marker}/{n}?every=2&slow=1" for n in range(20)],
        concurrency=4, hedge_after=0.05, rate=4,
    )  # fmt: skip
    assert all(r.ok for r in rs)
    log = sorted(e["t"] for e in server.get("/stats?log=1")["log"] if marker in e["target"])
    busiest = max(sum(1 for t in log if start <= t < start + 1) for start in log)
    assert busiest <= 4 + 4


@pytest.mark.integration
def test_hooks_see_every_attempt_and_result_and_cannot_break_the_run(
    server: MockServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    attempts: list[tuple[str, AttemptRecord]] = []
    results: list[int] = []

    def on_attempt(spec: RequestSpec, record: AttemptRecord) -> None:
        attempts.append((spec.url, record))
        raise RuntimeError("a broken hook")

    def on_result(result: Result) -> None:
        results.append(result.index)
        raise ValueError("another broken hook")

    marker = key()
    items = [f"{server.url}/ok/{marker}", f"{server.url}/503/{marker}"]
    with caplog.at_level(logging.ERROR, logger="batchsync"):
        rs = fetch_all(items, attempts=2, backoff=FAST, on_attempt=on_attempt, on_result=on_result)
    assert [r.ok for r in rs] == [True, False]
    assert sorted(results) == [0, 1]
    assert [(url, record.attempt) for url, record in attempts if url == items[1]] == [
        (items[1], 1), (items[1], 2),
    ]  # fmt: skip
    assert [record.wait is not None for url, record in attempts if url == items[1]] == [True, False]
    assert "a batchsync hook or observer raised in attempt_finished" in caplog.text
    assert "a batchsync hook or observer raised in item_finished" in caplog.text


@pytest.mark.integration
def test_items_with_their_own_idempotency_keys_are_never_merged(server: MockServerProcess) -> None:
    url = f"{server.url}/ok/keyed?delay=0.3"
    items = [{"url": url, "idempotency_key": f"key-{n}"} for n in range(4)]
    rs = fetch_all(items, concurrency=4, dedup=True)
    assert all(r.ok and r.attempts == 1 for r in rs)
    assert server.count("/ok/keyed?delay=0.3") == 4
