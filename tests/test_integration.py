"""The engine against the real mock server, judged from the server's side too."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from batchsync import Backoff, fetch_all

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration

FAST = Backoff(base=0.05, jitter=0.0)


def key() -> str:
    return uuid.uuid4().hex[:12]


def test_mixed_batch_bounded_concurrency_and_input_order(fresh_server: MockServerProcess) -> None:
    base = fresh_server.url
    items = [
        f"{base}/ok/1?delay=0.2",
        f"{base}/429-once/{key()}?retry_after=0.2",
        f"{base}/404",
        f"{base}/503",
        f"{base}/broken-json",
        f"{base}/ok/2?delay=0.2",
    ]
    rs = fetch_all(items, concurrency=3, backoff=FAST)
    assert [r.url for r in rs] == items
    assert [r.ok for r in rs] == [True, True, False, False, False, True]
    assert [r.error_kind for r in rs] == [None, None, "status", "status", "invalid_body", None]
    assert (len(rs.ok), len(rs.failed)) == (3, 3)
    assert fresh_server.stats()["peak_concurrency"] <= 3


def test_peak_concurrency_reaches_but_never_passes_the_limit(
    fresh_server: MockServerProcess,
) -> None:
    rs = fetch_all([f"{fresh_server.url}/ok/{n}?delay=0.05" for n in range(60)], concurrency=4)
    assert all(r.ok for r in rs)
    assert fresh_server.stats()["peak_concurrency"] == 4


def test_429_once_with_retry_after_seconds(server: MockServerProcess) -> None:
    url = f"{server.url}/429-once/{key()}?retry_after=1"
    rs = fetch_all([url], backoff=FAST)
    assert rs[0].ok and rs[0].attempts == 2
    assert rs[0].elapsed >= 1.0
    assert server.count(url.removeprefix(server.url)) == 2


def test_429_once_with_retry_after_date(server: MockServerProcess) -> None:
    url = f"{server.url}/429-date/{key()}?retry_after=2"
    started = time.monotonic()
    rs = fetch_all([url], backoff=FAST)
    assert rs[0].ok and rs[0].attempts == 2
    # an HTTP-date has whole seconds: 2 s ahead is at least 1 s away when it arrives
    assert time.monotonic() - started >= 1.0


def test_always_503_uses_every_attempt(server: MockServerProcess) -> None:
    path = f"/503/{key()}"
    rs = fetch_all([server.url + path], attempts=3, backoff=FAST)
    assert (rs[0].error_kind, rs[0].status_code, rs[0].attempts) == ("status", 503, 3)
    assert server.count(path) == 3


def test_404_and_broken_json_are_sent_once(server: MockServerProcess) -> None:
    missing, broken = f"/404/{key()}", f"/broken-json/{key()}"
    rs = fetch_all([server.url + missing, server.url + broken], backoff=FAST)
    assert [r.error_kind for r in rs] == ["status", "invalid_body"]
    assert (server.count(missing), server.count(broken)) == (1, 1)


def test_a_retry_after_beyond_the_budget_gives_up_at_once(server: MockServerProcess) -> None:
    path = f"/retry-after-60/{key()}"
    started = time.monotonic()
    rs = fetch_all([server.url + path], budget=0.5)
    assert time.monotonic() - started < 0.5
    assert (rs[0].error_kind, rs[0].status_code, rs[0].attempts) == ("budget", 429, 1)
    assert server.count(path) == 1


def test_a_slow_response_times_out_every_attempt(server: MockServerProcess) -> None:
    path = f"/ok/{key()}?delay=0.2"
    rs = fetch_all([server.url + path], timeout=0.03, attempts=3, backoff=FAST)
    assert (rs[0].error_kind, rs[0].attempts) == ("timeout", 3)
    assert all(record.elapsed < 0.2 for record in rs[0].attempt_log)
    assert server.count(path) == 3


def test_a_trickling_body_cannot_hold_an_attempt_past_its_timeout(
    server: MockServerProcess,
) -> None:
    rs = fetch_all([f"{server.url}/trickle/{key()}?interval=0.2&bytes=60"], timeout=1.0, attempts=1)
    assert (rs[0].error_kind, rs[0].status_code) == ("timeout", 200)
    assert rs[0].elapsed < 1.5


def test_a_body_that_stalls_after_late_headers_is_cut_at_the_attempt_end(
    server: MockServerProcess,
) -> None:
    """The socket's read timeout is re-armed to the time left once the headers came late:
    the first body read must not wait the attempt's whole timeout again."""
    path = f"/trickle/{key()}?delay=1.2&interval=5&bytes=2"
    rs = fetch_all([server.url + path], timeout=2.0, attempts=1)
    assert (rs[0].error_kind, rs[0].status_code) == ("timeout", 200)
    assert 1.9 < rs[0].elapsed < 2.6  # waiting the timeout again would end at about 3.2 s


def test_empty_input_and_invalid_options(fresh_server: MockServerProcess) -> None:
    assert len(fetch_all([])) == 0
    with pytest.raises(ValueError, match="concurrency"):
        fetch_all([f"{fresh_server.url}/ok/x"], concurrency=0)
    assert fresh_server.stats()["requests"] == 0


def test_twenty_thousand_items_over_at_most_32_connections(
    fresh_server: MockServerProcess,
) -> None:
    items = (f"{fresh_server.url}/ok/{n}" for n in range(20_000))
    rs = fetch_all(items, concurrency=32)
    assert len(rs) == 20_000
    assert len(rs.ok) == 20_000
    stats = fresh_server.stats()
    assert stats["requests"] == 20_000
    assert stats["connections"] <= 32


def test_called_inside_a_running_event_loop(server: MockServerProcess) -> None:
    async def notebook_cell() -> bool:
        return fetch_all([f"{server.url}/ok/loop"])[0].ok

    assert asyncio.run(notebook_cell())


# Peak RSS from VmHWM, which starts afresh at exec: ru_maxrss would also count the memory of
# the test process this one was forked from.
RSS_PROBE = """
import json, re, sys
from pathlib import Path
from batchsync import fetch_all
rs = fetch_all(sys.argv[1:], attempts=1)
peak = int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text())[1])
print(json.dumps({"kinds": [r.error_kind for r in rs], "peak_rss_mib": peak / 1024}))
"""


def test_huge_bodies_are_refused_without_being_held(server: MockServerProcess) -> None:
    urls = [
        f"{server.url}/huge?mb=256",
        f"{server.url}/huge?mb=256&chunked=1",
        f"{server.url}/huge?mb=256&gzip=1",
    ]
    probe = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, *urls],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(probe.stdout)
    assert report["kinds"] == ["invalid_body"] * 3
    assert report["peak_rss_mib"] < 100


def test_a_cookie_set_by_a_response_goes_with_later_requests(server: MockServerProcess) -> None:
    """As with a plain requests.Session: the session's jar keeps what responses set."""
    items = [f"{server.url}/set-cookie?name=flavour&value=oat", f"{server.url}/echo"]
    rs = fetch_all(items, concurrency=1)
    assert rs[1].data["headers"]["Cookie"] == "flavour=oat"


def test_a_callers_session_keeps_its_auth_hooks_and_headers(server: MockServerProcess) -> None:
    import requests

    session = requests.Session()
    session.auth = ("ann", "secret")
    session.headers["X-App"] = "7"
    seen: list[int] = []
    session.hooks["response"].append(lambda response, **kwargs: seen.append(response.status_code))
    rs = fetch_all([f"{server.url}/echo", f"{server.url}/404/{key()}"], session=session)
    echoed = rs[0].data["headers"]
    assert echoed["Authorization"] == "Basic YW5uOnNlY3JldA=="
    assert echoed["X-App"] == "7"
    assert sorted(seen) == [200, 404]


PROXY_PROBE = """
import json, sys
from batchsync import fetch_all
rs = fetch_all(["http://api.example.invalid/ok/through-the-proxy"], attempts=1)
print(json.dumps([rs[0].ok, rs[0].data]))
"""


def test_a_proxy_from_the_environment_is_honoured(server: MockServerProcess) -> None:
    """The fast lane stands aside for proxied hosts: the request reaches the (local) proxy."""
    env = {**os.environ, "HTTP_PROXY": server.url, "NO_PROXY": ""}
    done = subprocess.run(
        [sys.executable, "-c", PROXY_PROBE], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    ok, data = json.loads(done.stdout)
    assert ok and data == {"path": "/ok/through-the-proxy", "ok": True}
