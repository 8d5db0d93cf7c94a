"""Quota headers: a host that says its quota is spent is held until the reset, before it
answers 429; checked from the headers' side (pure functions) and the server's."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from requests.structures import CaseInsensitiveDict
from urllib3 import HTTPHeaderDict

from batchsync import fetch_all
from batchsync.core.budget import Allowance
from batchsync.core.verdict import success
from batchsync.http.classify import classify_status, host_feedback
from batchsync.http.httpfacts import HttpFacts
from batchsync.http.provider import announced
from batchsync.http.quota import answer_limits, quota_wait

from .mockserver import MockServerProcess
from .services import redis_server

NOW = 1_800_000_000.0


def headers(**given: str) -> list[tuple[str, str]]:
    """A response's header (name, value) pairs, names as servers write them."""
    return [(name.replace("_", "-"), value) for name, value in given.items()]


# What each set of headers announces (names as servers write them, with "_" for "-").
ANNOUNCED = [
    ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": "30"}, 30.0),  # seconds left
    ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": str(int(NOW) + 45)}, 45.0),  # epoch
    ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": str(int(NOW) - 5)}, 0.0),  # past
    ({"X_RateLimit_Remaining": "3", "X_RateLimit_Reset": "30"}, None),  # some left
    ({"X_RateLimit_Remaining": "0"}, None),  # no reset: nothing to go by
    ({"X_RateLimit_Remaining": "none", "X_RateLimit_Reset": "30"}, None),
    ({"X_RateLimit_Remaining": "0", "X_RateLimit_Reset": "nan"}, None),
    ({"RateLimit_Remaining": "0", "RateLimit_Reset": "12"}, 12.0),
    ({"RateLimit": '"default";r=0;t=20'}, 20.0),  # the IETF structured field
    ({"RateLimit": '"default";r=7;t=20'}, None),
    ({"RateLimit": "limit=100, remaining=0, reset=8"}, 8.0),  # its older form
    ({"RateLimit": '"default";r=0', "RateLimit_Policy": '"default";q=100;w=60'}, 60.0),
    ({}, None),
]


@pytest.mark.parametrize(("given", "wait"), ANNOUNCED)
def test_the_wait_a_hosts_headers_announce(given: dict[str, str], wait: float | None) -> None:
    assert quota_wait(headers(**given), lambda: NOW) == wait


@pytest.mark.parametrize(
    ("given", "wait"),
    [
        *ANNOUNCED,
        ({"X_RATELIMIT_REMAINING": "0", "x_ratelimit_reset": "30"}, 30.0),  # any case
        ({"X_RateLimit_Limit": "100", "X_RateLimit_Reset": "30"}, None),  # no remaining count
    ],
)
@pytest.mark.parametrize("mapping", [HTTPHeaderDict, CaseInsensitiveDict])
def test_an_answers_headers_announce_the_same_wait(
    given: dict[str, str], wait: float | None, mapping: type[Any]
) -> None:
    """Read from a response's own headers (urllib3's or requests'), looked up first."""
    answer = mapping(headers(**given))
    assert answer_limits(answer, lambda: NOW)[0] == quota_wait(headers(**given), lambda: NOW)
    assert answer_limits(answer, lambda: NOW)[0] == wait


@pytest.mark.parametrize("mapping", [HTTPHeaderDict, CaseInsensitiveDict, dict])
def test_the_headers_an_answer_is_read_for_are_found_as_its_mapping_finds_names(
    mapping: type[Any],
) -> None:
    """urllib3's and requests' header dicts find a name in any case; any other mapping as it
    finds names itself (a plain dict: as written)."""
    given = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}
    given |= {"Anthropic-RateLimit-Requests-Remaining": "0"}
    quota, told = answer_limits(mapping(given), lambda: NOW)
    found = mapping is not dict
    assert (quota == 30.0, told is not None) == (found, found)


@pytest.mark.parametrize("mapping", [HTTPHeaderDict, CaseInsensitiveDict])
def test_a_providers_headers_read_by_look_up_say_what_all_of_them_say(
    mapping: type[Any],
) -> None:
    """Only the names the provider's reading knows are looked up, not every header walked: the
    same Announced as from all the pairs the mapping gives, a name sent twice included
    (urllib3 gives each value, the last winning; requests joins them, and the joined text is
    no count)."""
    sent = HTTPHeaderDict({"Content-Type": "application/json", "X-Request-Id": "abc"})
    for name, value in [
        ("X-RateLimit-Limit-Requests", "500"),
        ("x-ratelimit-remaining-requests", "499"),
        ("x-ratelimit-remaining-requests", "12"),
        ("X-RATELIMIT-RESET-TOKENS", "1m2s"),
        ("anthropic-ratelimit-output-tokens-limit", "0"),
        ("retry-after-ms", "250"),
        ("Server", "mock"),
    ]:
        sent.add(name, value)
    answer = mapping(sent)
    said = answer_limits(answer, lambda: NOW)[1]
    assert said == announced(list(answer.items()), NOW)
    assert said is not None and said.requests_limit == 500 and said.tokens_reset == 62.0
    assert said.requests_remaining == (12 if mapping is HTTPHeaderDict else None)


def test_a_403_that_says_the_quota_is_spent_is_a_rate_limit() -> None:
    """GitHub's rule: retried after the reset, not a final 403; a plain 403 stays final."""
    limited = classify_status(403, None, NOW, quota=40.0)
    assert limited is not None
    assert (limited.outcome, limited.retry_after, host_feedback(limited).quota) == (
        "retry",
        40.0,
        40.0,
    )
    assert classify_status(403, "5", NOW) is not None
    assert classify_status(403, "5", NOW).outcome == "retry"  # type: ignore[union-attr]
    forbidden = classify_status(403, None, NOW)
    assert forbidden is not None and forbidden.outcome == "terminal"
    both = classify_status(429, "5", NOW, quota=9.0)
    assert both is not None and both.retry_after == 9.0  # the longer is the floor


def quota_urls(server: MockServerProcess, count: int, **query: str) -> tuple[str, list[str]]:
    family = uuid.uuid4().hex[:8]
    search = "&".join(f"{k}={v}" for k, v in query.items())
    return family, [f"{server.url}/quota/{family}/{n}?{search}" for n in range(count)]


def answers(server: MockServerProcess, family: str) -> list[dict[str, Any]]:
    return server.log(f"/quota/{family}/")


@pytest.mark.integration
@pytest.mark.parametrize("style", ["x", "github", "ietf"])
def test_a_host_is_held_from_the_answer_that_spent_its_quota_to_the_reset(
    server: MockServerProcess, style: str
) -> None:
    family, urls = quota_urls(server, 12, limit="4", window="1.5", style=style)
    rs = fetch_all(urls, concurrency=1, budget=20)
    assert [r.ok for r in rs] == [True] * 12
    log = answers(server, family)
    # One at a time: each answer that said "0 left" is followed by no request until the
    # window's reset, so the server never had to refuse one.
    assert [entry["status"] for entry in log] == [200] * 12
    spent = [log[i] for i in (3, 7)]  # the 4th and 8th answers: the quota's last requests
    for last, after in zip(spent, (log[4], log[8]), strict=True):
        assert after["t"] - last["end"] >= 0.5  # held to the reset (window 1.5 s, from its start)
    assert rs.summary().waits.get("quota", 0) > 0.5


@pytest.mark.integration
def test_no_request_reaches_a_host_between_its_last_allowed_one_and_the_reset(
    server: MockServerProcess,
) -> None:
    """Four workers, a quota of 5 per 2 s window (GitHub's style, a 403 when spent): what was
    already sent when the quota ran out may be refused and is retried after the reset; nothing
    is sent after the answer that said "0 left" until the window resets."""
    family, urls = quota_urls(server, 16, limit="5", window="2", style="github")
    # (up to 3 of the 4 in flight when the quota runs out are refused, the same item maybe at
    # several resets on a loaded machine: attempts enough for that, the rule checked below)
    rs = fetch_all(urls, concurrency=4, budget=30, attempts=6)
    assert all(r.ok for r in rs), [r.error for r in rs if not r.ok]
    log = sorted(answers(server, family), key=lambda entry: entry["t"])
    windows: dict[float, list[dict[str, Any]]] = {}
    for entry in log:  # by the server's own windows (each request's log says which)
        windows.setdefault(entry["window"], []).append(entry)
    for began, window in windows.items():
        if len(window) < 5:
            continue
        spent_at = sorted(entry["end"] for entry in window)[4]  # "0 left" was said
        held = [e for e in log if spent_at + 0.1 < e["t"] < began + 2 - 0.05]
        assert held == [], (spent_at, began + 2)
    assert rs.summary().waits.get("quota", 0) > 1


@pytest.mark.integration
def test_a_reset_beyond_the_budget_ends_the_items_as_budget_unsent(
    server: MockServerProcess,
) -> None:
    family, urls = quota_urls(server, 3, limit="1", window="60", style="x")
    rs = fetch_all(urls, concurrency=1, budget=3)
    assert [r.ok for r in rs] == [True, False, False]
    assert {r.error_kind for r in rs[1:]} == {"budget"}
    assert len(answers(server, family)) == 1  # the host said 0 left: nothing more was sent


@pytest.mark.integration
def test_quota_headers_can_be_ignored(server: MockServerProcess) -> None:
    family, urls = quota_urls(server, 6, limit="2", window="1", style="x")
    rs = fetch_all(urls, concurrency=1, quota_headers=False, budget=20)
    assert all(r.ok for r in rs)
    assert any(entry["status"] == 429 for entry in answers(server, family))


def test_a_spent_quota_holds_every_process_sharing_redis_limits() -> None:
    from batchsync.contrib.redis import RedisLimits
    from batchsync.core.clock import SYSTEM
    from batchsync.limits.cooldown import Cooldown, Holds
    from batchsync.limits.gates import Admission, Gates
    from batchsync.limits.quota import QuotaReset

    def gates(url: str) -> Gates:  # a process's: the cooldown and the quota reset, on one board
        shared, holds = RedisLimits(url, "quota-test", 10.0), Holds()
        options = (Cooldown("host", holds), QuotaReset(holds))
        return Gates(option.gate(concurrency=2, shared=shared, clock=SYSTEM) for option in options)

    with redis_server() as url:
        one, other = gates(url), gates(url)
        admission = one.admit("api.test", Allowance(time.monotonic() + 60), threading.Event())
        assert isinstance(admission, Admission)
        spent = success(None, HttpFacts(200, quota=30.0))
        one.release(admission, host_feedback(spent))
        refused = other.admit("api.test", Allowance(time.monotonic() + 5), threading.Event())
        assert refused == "budget"  # held for the reset, 30 s, beyond a budget of 5 s
        assert isinstance(
            other.admit("elsewhere.test", Allowance(time.monotonic() + 5), threading.Event()),
            Admission,
        )
