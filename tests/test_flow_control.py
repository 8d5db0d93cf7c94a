"""Rate, per-host slots, cooldowns, the breaker and adaptive concurrency, judged by the server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from batchsync import Backoff, Breaker, fetch_all

from .mockserver import MockServerProcess, busiest_second

pytestmark = pytest.mark.integration


def key() -> str:
    return uuid.uuid4().hex[:10]


def other_host(server: MockServerProcess) -> str:
    """The same server under another host name: a second host as the client sees it."""
    return server.url.replace("127.0.0.1", "localhost")


def test_rate_limit_holds_every_one_second_window(server: MockServerProcess) -> None:
    marker = key()
    started = time.monotonic()
    rs = fetch_all([f"{server.url}/ok/{marker}-{n}" for n in range(100)], rate=50, concurrency=10)
    elapsed = time.monotonic() - started
    assert all(r.ok for r in rs)
    assert elapsed >= 1.6  # 10 at once, then 90 at 50/s
    arrivals = [entry["t"] for entry in server.log(marker)]
    assert len(arrivals) == 100
    assert busiest_second(arrivals) <= 60
    assert rs.summary().waits["rate"] > 0


def test_per_host_slots_bound_each_host(fresh_server: MockServerProcess) -> None:
    hosts = [fresh_server.url, other_host(fresh_server)]
    items = [f"{hosts[n % 2]}/ok/{n}?delay=0.1" for n in range(24)]
    rs = fetch_all(items, per_host=2, concurrency=8)
    assert all(r.ok for r in rs)
    peaks = fresh_server.stats()["peak_by_host"]
    assert sorted(peaks.values()) == [2, 2]
    assert fresh_server.stats()["peak_concurrency"] == 4


def cooldown_run(server: MockServerProcess, scope: str) -> tuple[float, list[dict[str, Any]]]:
    """A 1.5 s account-wide 429 on one host while a second host has work too.

    Returns the moment the 429 was answered and the log of both hosts' requests.
    """
    marker = key()
    account = [f"{server.url}/account/{marker}/{n}?retry_after=1.5" for n in range(12)]
    elsewhere = [f"{other_host(server)}/ok/{marker}-{n}?delay=0.1" for n in range(12)]
    items = [item for pair in zip(account, elsewhere, strict=True) for item in pair]
    rs = fetch_all(items, concurrency=4, cooldown=scope, backoff=Backoff(base=0.05))  # type: ignore[arg-type]
    assert all(r.ok for r in rs)
    log = server.log(marker)
    # (every request of the account in its first 1.5 s is refused: the first answered starts
    # the hold)
    first = min((entry for entry in log if entry["status"] == 429), key=lambda e: e["end"])
    return first["end"], log


def test_no_attempt_to_a_host_begins_inside_its_cooldown(server: MockServerProcess) -> None:
    answered, log = cooldown_run(server, "host")
    inside = [e for e in log if answered + 0.1 < e["t"] < answered + 1.45]
    assert not [e for e in inside if "/account/" in e["target"]]
    assert [e for e in inside if "/ok/" in e["target"]], "the other host was held too"


def test_a_429_of_one_item_does_not_hold_a_host_that_serves_the_rest(
    server: MockServerProcess,
) -> None:
    marker = key()
    items = [
        f"{server.url}/429-once/{marker}-{n}?retry_after=3&delay=0.1"
        if n % 8 == 0
        else f"{server.url}/ok/{marker}-{n}?delay=0.1"
        for n in range(48)
    ]
    rs = fetch_all(items, concurrency=4)  # the default cooldown: "host"
    assert all(r.ok for r in rs)
    log = server.log(marker)
    answered = min(e["end"] for e in log if e["status"] == 429)
    # The host answered the attempts sent after the refused one: the others go on (on the
    # code before, none began until the 3 s had passed, and each 429 held it again).
    inside = [e for e in log if answered + 0.3 < e["t"] < answered + 2.5 and "/ok/" in e["target"]]
    assert len(inside) >= 8
    assert len([e for e in log if e["status"] == 429]) == 6


def test_a_global_cooldown_holds_every_host(server: MockServerProcess) -> None:
    answered, log = cooldown_run(server, "global")
    assert not [e for e in log if answered + 0.1 < e["t"] < answered + 1.45]


def test_an_open_circuit_ends_items_whose_budget_cannot_cover_the_break_without_sending_them(
    server: MockServerProcess,
) -> None:
    marker = key()
    rs = fetch_all(
        [f"{server.url}/503/{marker}/{n}" for n in range(20)],
        concurrency=2, attempts=1, budget=30, breaker=Breaker(min_calls=3, reset=60),
    )  # fmt: skip
    sent = server.log(marker)
    assert len(sent) <= 3 + 1  # the minimum calls, plus one already in flight when it opened
    refused = [r for r in rs if r.error_kind == "circuit_open"]
    assert len(refused) == 20 - len(sent)
    assert all(r.attempts == 0 for r in refused)
    assert refused[0].error == f"the circuit for 127.0.0.1:{server.url.rsplit(':', 1)[1]} is open"
    assert rs.summary().circuits_opened == 1


def test_a_half_open_circuit_lets_one_probe_through(server: MockServerProcess) -> None:
    family = key()
    flaky = f"{server.url}/503-then-ok/{family}"
    items = [
        f"{flaky}/1?after=3",
        f"{flaky}/2?after=3",  # the circuit opens
        f"{flaky}/3?after=3",  # held for the break, then the probe: it fails, another break
        f"{other_host(server)}/ok/{family}?delay=0.7",  # time passes on another host
        f"{flaky}/4?after=3",  # the next probe: the server has recovered
        f"{flaky}/5?after=3",  # closed again
    ]
    rs = fetch_all(items, concurrency=1, attempts=1, breaker=Breaker(min_calls=2, reset=0.5))
    assert [(r.error_kind, r.attempts) for r in rs] == [
        ("status", 1), ("status", 1), ("status", 1), (None, 1), (None, 1), (None, 1),
    ]  # fmt: skip
    sent = server.log(f"/503-then-ok/{family}/")
    assert len(sent) == 5
    assert sent[2]["t"] - sent[1]["end"] >= 0.45  # the third item waited for the break
    assert rs.summary().waits["breaker"] >= 0.45


def limiter_run(server: MockServerProcess, adaptive: bool) -> tuple[int, float]:
    """120 requests to a server that takes 4 at a time (0.1 s each); (429s seen, seconds)."""
    family = key()
    items = [
        f"{server.url}/limited/{family}/{n}?max_inflight=4&work=0.1&family={family}"
        for n in range(120)
    ]
    started = time.monotonic()
    rs = fetch_all(
        items, concurrency=16, attempts=40, adaptive=adaptive, breaker=None,
        backoff=Backoff(base=0.05, max=0.5),
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert all(r.ok for r in rs)
    refused = [e for e in server.log(family) if e["status"] == 429]
    return len(refused), elapsed


def test_adaptive_concurrency_finds_the_capacity_with_few_429s(server: MockServerProcess) -> None:
    blind_429s, _ = limiter_run(server, adaptive=False)
    adaptive_429s, elapsed = limiter_run(server, adaptive=True)
    assert adaptive_429s * 3 <= blind_429s
    # 120 requests at the server's capacity of 4 x 0.1 s take 3 s
    assert elapsed < 9


def test_the_cli_applies_rate_and_per_host_limits(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    hosts = [fresh_server.url, other_host(fresh_server)]
    urls = [f"{hosts[n % 2]}/ok/{marker}-{n}?delay=0.05" for n in range(60)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", "-c", "8", "--rate", "20",
         "--per-host", "2", "--cooldown", "global", "--breaker", "0.5:50:10:10"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    arrivals = [entry["t"] for entry in fresh_server.log(marker)]
    assert busiest_second(arrivals) <= 20 + 8
    assert max(fresh_server.stats()["peak_by_host"].values()) <= 2
    assert "waited: " in done.stderr and " rate " in done.stderr
    results = [json.loads(line) for line in (tmp_path / "urls-results.jsonl").open()]
    assert len(results) == 60


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--breaker", "x:y"], "expected RATIO[:WINDOW[:MIN_CALLS[:SECONDS]]], on or off"),
        (["--breaker", "5:10"], "breaker ratio must be above 0 and at most 1"),
        (["--breaker", "0.5:10:0"], "breaker min_calls must be a whole number >= 1"),
        (["--breaker", "0.5:1:1:1:1"], "at most 4 fields"),
        (["--rate", "0"], "--rate"),
        (["--per-host", "0"], "--per-host"),
        (["--cooldown", "sometimes"], "--cooldown"),
    ],
)
def test_bad_limit_options_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/x\n")
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr
    assert done.stderr.count("\n") == 1
