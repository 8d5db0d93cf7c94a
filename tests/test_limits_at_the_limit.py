"""The limits given AT the server's limit itself, never a share under it, judged by the server's
own counts (issue 33). The mock LLM API counts over a sliding window (or refills as a token
bucket, ``refill=bucket``) from when each request reaches it, and answers 429 to anything over:
a stated rate, a token budget and the providers' headers alone must each keep a batch clear of
429s there (the headers: but for the first wave, sent before any answer could tell), open no
circuit, and use most of the limit. Windows of 1 or 2 s and a few dozen requests each."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batchsync import ResultSet, fetch_all

from .mockserver import MockServerProcess, busiest_second
from .services import redis_server
from .test_cli import batchsync as run_cli
from .test_cli import read_jsonl
from .test_llm_batches import prefix

pytestmark = pytest.mark.integration

# The least share of the limit a run must use. Each attempt counts until a period after its
# answer, so a run uses period / (period + latency) of it, less what whole requests leave
# unused: 90 % and more here when the machine is quiet (the benchmark measures it at 100 % of
# the limits), the latency of a loaded 2-core machine running the suite in parallel taking
# a few points more. The 429s, not this share, are what the limits promise.
USED = 0.85


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def account(server: MockServerProcess, limits: str) -> tuple[str, str]:
    """A fresh KEY of the mock with ``limits``: its chat completions URL, and the KEY."""
    base, key = prefix(server, limits)
    return f"{base}/v1/chat/completions", key


def chats(url: str, count: int, tokens: int) -> list[dict[str, Any]]:
    """``count`` chat requests the mock counts at exactly ``tokens`` tokens each (2 a prompt,
    4 a message, a token each 4 characters, ``max_tokens`` 10)."""
    body = {"model": "gpt-mock", "max_tokens": 10,
            "messages": [{"role": "user", "content": "word" * (tokens - 16)}]}  # fmt: skip
    return [{"url": url, "method": "POST", "json": body, "id": n} for n in range(count)]


def stats(server: MockServerProcess, key: str) -> dict[str, Any]:
    return server.get(f"/llm/{key}/stats?log=1")


def all_ok(rs: ResultSet, count: int) -> None:
    assert [r.id for r in rs] == list(range(count))
    assert all(r.ok for r in rs), rs.summary()
    assert rs.summary().circuits_opened == 0, rs.summary()


def share(counted: dict[str, Any], name: str, per_second: float) -> float:
    """The share of the limit the run used: the server's count over the server's time, from
    the first request to the last event."""
    return float(counted[name]) / (per_second * float(counted["elapsed"]))


def steady_share(counted: dict[str, Any], name: str, per_window: float) -> float:
    """The share of the limit used in the server's whole windows between the opening (the
    first, when the headers had not had their say yet) and the last (when the run had fewer
    items left than it could send)."""
    steady = [window[name] for window in counted["windows"][1:-1]]
    assert steady, counted["windows"]
    return float(sum(steady)) / (per_window * len(steady))


def before_first_answer(counted: dict[str, Any]) -> int:
    """How many requests the server received before its first 200 (no latency: a request is
    answered when it is admitted)."""
    kinds = [kind for _, kind, _ in counted["log"]]
    return kinds.index("admitted") if "admitted" in kinds else len(kinds)


def shared_halves(items: list[dict[str, Any]], redis_url: str, **options: Any) -> ResultSet:
    """Two clients at once, each half the items and half the concurrency, their limits shared
    through Redis; their results as one set, in input order."""
    quota, halves = f"at-limit-{uuid.uuid4().hex[:8]}", (items[::2], items[1::2])
    done: list[ResultSet] = []
    workers = [
        threading.Thread(
            target=lambda part=part: done.append(
                fetch_all(part, concurrency=4, limits=redis_url, namespace=quota, **options)
            )
        )
        for part in halves
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    results = sorted((r for rs in done for r in rs), key=lambda r: r.id)
    return ResultSet(results, circuits_opened=sum(rs.summary().circuits_opened for rs in done))


def test_a_rate_at_the_limit_meets_no_429_and_uses_it(server: MockServerProcess) -> None:
    url, key = account(server, "rpm=20,tpm=10000000,window=1")
    rs = fetch_all(chats(url, 80, 20), rate="20/s", concurrency=8, budget=30)
    counted = stats(server, key)
    assert counted["rejected"] == 0, counted["windows"]
    assert share(counted, "requests", 20) >= USED, counted["windows"]
    all_ok(rs, 80)


def test_a_rate_a_minute_opens_without_a_burst(server: MockServerProcess) -> None:
    """360/min at 8 workers, the server's window a real minute: one each 1/6 s from the first
    request, so no second of arrivals holds more than 7 (a burst of the concurrency would)."""
    url, key = account(server, "rpm=360,tpm=10000000,window=60")
    rs = fetch_all(chats(url, 14, 20), rate="360/min", concurrency=8, budget=30)
    counted = stats(server, key)
    arrivals = [t for t, kind, _ in counted["log"] if kind in ("admitted", "rejected")]
    assert busiest_second(arrivals) <= 7, arrivals
    assert counted["rejected"] == 0, counted["log"]
    all_ok(rs, 14)


@pytest.mark.parametrize("shared", [False, True], ids=["in-process", "redis"])
def test_a_token_rate_at_the_limit_meets_no_429_and_uses_it(
    server: MockServerProcess, shared: bool, request: pytest.FixtureRequest
) -> None:
    """The issue's case: 2 000 tokens in any second, 216-token requests at 8 workers (a token
    bucket refilled evenly met 17 of them with a 429). Shared, the budget alone: the counts
    the headers announce are each process's own, and a process whose answers never show
    whether a reset frees the whole count is held to what they confirm while the other uses
    the key (in 1 of 3 runs here one half waited out a window, a share of 0.80 to 0.84)."""
    url, key = account(server, "rpm=100000,tpm=2000,window=1")
    items = chats(url, 50, 216)
    if shared:
        redis_url = request.getfixturevalue("redis_url")
        rs = shared_halves(items, redis_url, token_rate="2000/s", quota_headers=False)
    else:
        rs = fetch_all(items, token_rate="2000/s", concurrency=8, budget=30)
    counted = stats(server, key)
    assert counted["rejected"] == 0, counted["windows"]
    assert counted["peak_tokens"] <= 2000, counted["windows"]
    assert share(counted, "tokens", 2000) >= USED, counted["windows"]
    all_ok(rs, 50)


@pytest.mark.parametrize("refill", ["window", "oldest", "bucket"])
def test_the_headers_alone_pace_a_sliding_window_and_a_bucket(
    server: MockServerProcess, refill: str
) -> None:
    """No rate, no token budget and no retry-after on a 429: OpenAI's x-ratelimit headers
    alone, 3 000 tokens in 2 s, 125-token requests at 8 workers (before issue 33, 1 500 in 1 s:
    59 429s, the circuit opened, 3 items failed), whatever the reset means: the window empty
    again, its oldest entry leaving (before issue 43: 50 429s), the bucket full again. The
    only 429s allowed are those of requests that reached the server before its first answer.
    The headers tell after each answer, so
    each attempt counts until a window after its answer: windows of 2 s keep a loaded
    machine's latency a small part of them (at 1 s, 10 of 12 a window in a loaded suite).
    120 requests: a bucket's opening takes up to two windows' worth in the first, and the
    share is judged over the steady windows after it (at 80, one: 18 of 24 in it once, in 34
    runs on a loaded machine). A bucket's, over 200: held as a window that may be as long as
    its reset (it cannot be told from one), its attempts come back in waves a reset apart, 1.5
    to 1.7 s, not the server's 2 s, so one of three windows may hold one wave where the next
    holds two (at 120: 0.833 once in CI, and 1 run of 10 beside two busy loops at 0.847; at
    200, six steady windows: 1.00 and more in 8 runs of 8)."""
    url, key = account(server, f"rpm=100000,tpm=3000,window=2,retry_after=0,refill={refill}")
    count = 200 if refill == "bucket" else 120
    rs = fetch_all(chats(url, count, 125), concurrency=8, budget=60)
    counted = stats(server, key)
    assert counted["rejected"] <= before_first_answer(counted), counted["windows"]
    assert steady_share(counted, "tokens", 3000) >= USED, counted["windows"]
    all_ok(rs, count)


def test_the_command_line_at_the_token_limit_meets_no_429(
    server: MockServerProcess, tmp_path: Path
) -> None:
    url, key = account(server, "rpm=100000,tpm=2000,window=1")
    rows = [{**item["json"], "metadata": {"row": item["id"]}} for item in chats(url, 40, 216)]
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = run_cli("requests.jsonl", "--url", url, "--row-as-body", "--token-rate", "2000/s",
                   "-c", "8", "--no-progress", cwd=tmp_path)  # fmt: skip
    counted = stats(server, key)
    assert counted["rejected"] == 0, counted["windows"]
    assert share(counted, "tokens", 2000) >= USED, counted["windows"]
    assert done.returncode == 0, done.stderr
    results = read_jsonl(tmp_path / "requests-results.jsonl")
    assert [r["id"] for r in results] == [{"row": n} for n in range(40)]
    assert all(r["ok"] for r in results)
