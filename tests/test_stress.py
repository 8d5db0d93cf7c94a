"""Concurrency stress: thousands of items at concurrency 256 through every limit, dedup,
hedging, the breaker, cookies and a stop, with the invariants a run promises (one Result per
item, at its own index; no limit overdrawn, counted by the server).

The module runs on any build. On a free-threaded build (3.13t and later), where nothing
leans on the GIL, the last test runs it again with ``PYTHON_GIL=0`` when such an interpreter
with batchsync's dependencies is present (``BATCHSYNC_FREE_THREADED_PYTHON``, or one of
``FREE_THREADED_CANDIDATES``); docs/speed.md says how to build one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from batchsync import Breaker, Result, fetch_all, fetch_iter

from .mockserver import MockServerProcess, busiest_second, in_flight_peak

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 256
FREE_THREADED_CANDIDATES = ("python3.14t", "python3.13t", "/opt/venv-313t/bin/python")
_INNER = "BATCHSYNC_STRESS_INNER"


def one_each(results: Sequence[Result], urls: Sequence[str]) -> None:
    """Every item has exactly one Result, at its own index, for its own URL."""
    assert len(results) == len(urls)
    assert [result.index for result in results] == list(range(len(urls)))
    assert [result.url for result in results] == list(urls)


def urls_of(server: MockServerProcess, count: int, path: str = "ok", query: str = "") -> list[str]:
    marker = uuid.uuid4().hex[:10]
    return [f"{server.url}/{path}/{marker}-{n}{query}" for n in range(count)]


def marker_of(urls: Sequence[str]) -> str:
    return urls[0].rsplit("/", 1)[1].split("-")[0]


def test_thousands_of_items_each_get_one_result_at_their_index(server: MockServerProcess) -> None:
    urls = urls_of(server, 5_000, query="?delay=0.005")
    results = fetch_all(urls, concurrency=CONCURRENCY)
    one_each(results, urls)
    assert len(results.ok) == len(urls)
    assert len(server.log(marker_of(urls))) == len(urls)  # each sent once


def test_per_host_slots_are_never_overdrawn(server: MockServerProcess) -> None:
    urls = urls_of(server, 1_500, query="?delay=0.01")
    results = fetch_all(urls, concurrency=CONCURRENCY, per_host=16)
    one_each(results, urls)
    assert len(results.ok) == len(urls)
    assert in_flight_peak(server.log(marker_of(urls))) <= 16


def test_the_rate_is_never_overdrawn_in_any_second(server: MockServerProcess) -> None:
    urls = urls_of(server, 1_200)
    results = fetch_all(urls, concurrency=CONCURRENCY, rate="400/s")
    one_each(results, urls)
    arrivals = [entry["t"] for entry in server.log(marker_of(urls))]
    assert len(arrivals) == len(urls)
    assert busiest_second(arrivals) <= 400


def test_the_token_budget_and_adaptive_limit_hold_every_item(server: MockServerProcess) -> None:
    urls = urls_of(server, 1_000)
    results = fetch_all(
        urls, concurrency=CONCURRENCY, token_rate="20000/s", cost=lambda _: 10, adaptive=True
    )
    one_each(results, urls)
    arrivals = [entry["t"] for entry in server.log(marker_of(urls))]
    assert len(arrivals) == len(urls)
    assert busiest_second(arrivals) <= 2_000  # 20 000 tokens a second, 10 an item


def test_dedup_sends_each_distinct_request_once(server: MockServerProcess) -> None:
    distinct = urls_of(server, 200, query="?delay=0.05")
    urls = [distinct[n % len(distinct)] for n in range(3_000)]
    results = fetch_all(urls, concurrency=CONCURRENCY, dedup=True)
    one_each(results, urls)
    assert len(results.ok) == len(urls)
    sent = server.log(marker_of(distinct))
    assert len(sent) >= len(distinct)
    # (a copy that comes after its twin ended is sent again: never more than once in flight)
    assert in_flight_peak(sent) <= len(distinct)


def test_hedged_requests_give_one_result_each(server: MockServerProcess) -> None:
    family = uuid.uuid4().hex[:10]
    urls = [f"{server.url}/jitter/{family}/{n}?every=7&slow=0.3" for n in range(1_500)]
    results = fetch_all(urls, concurrency=CONCURRENCY, hedge_after=0.05)
    one_each(results, urls)
    assert len(results.ok) == len(urls)
    assert len(server.log(family)) <= 2 * len(urls)


def test_the_breaker_holds_a_failing_host_and_every_item_ends_once(
    server: MockServerProcess,
) -> None:
    family = uuid.uuid4().hex[:10]
    urls = [f"{server.url}/503-then-ok/{family}/{n}?after=100" for n in range(1_000)]
    breaker = Breaker(ratio=0.5, window=20, min_calls=10, reset=0.2)
    results = fetch_all(urls, concurrency=CONCURRENCY, breaker=breaker, budget=30, cooldown="off")
    one_each(results, urls)
    assert {result.error_kind for result in results} <= {None, "status", "circuit_open", "budget"}
    assert len(server.log(family)) <= len(urls) + 100


def test_cookies_set_from_every_thread_at_once(server: MockServerProcess) -> None:
    marker = uuid.uuid4().hex[:10]
    urls = [f"{server.url}/set-cookie?name=c{n % 50}&value={marker}{n}" for n in range(2_000)]
    results = fetch_all(urls, concurrency=CONCURRENCY, cookies=True)
    one_each(results, urls)
    assert len(results.ok) == len(urls)


def test_a_stop_mid_run_leaves_each_result_once_and_no_worker(server: MockServerProcess) -> None:
    urls = urls_of(server, 5_000, query="?delay=0.02")
    before = threading.active_count()
    seen: list[int] = []
    with fetch_iter(urls, concurrency=CONCURRENCY) as results:
        for result in results:
            seen.append(result.index)
            if len(seen) == 1_000:
                break
    assert len(seen) == len(set(seen)) == 1_000
    assert all(urls[index].endswith(f"-{index}?delay=0.02") for index in seen)
    end = time.monotonic() + 30
    while threading.active_count() > before and time.monotonic() < end:
        time.sleep(0.05)
    assert threading.active_count() <= before


def free_threaded_python() -> str | None:
    """A free-threaded interpreter that can import batchsync and pytest, if there is one."""
    given = os.environ.get("BATCHSYNC_FREE_THREADED_PYTHON")
    for candidate in ([given] if given else []) + list(FREE_THREADED_CANDIDATES):
        found = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if found is None:
            continue
        probe = subprocess.run(
            [found, "-c", "import sysconfig, batchsync, pytest, xdist;"
             "assert sysconfig.get_config_var('Py_GIL_DISABLED')"],
            capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False,
        )  # fmt: skip
        if probe.returncode == 0:
            return found
    return None


@pytest.mark.skipif(bool(os.environ.get(_INNER)), reason="(the free-threaded run itself)")
def test_the_stress_cases_pass_without_the_gil() -> None:
    python = free_threaded_python()
    if python is None:
        pytest.skip(
            "no free-threaded Python with batchsync's dependencies here "
            "(docs/speed.md: how to build one; BATCHSYNC_FREE_THREADED_PYTHON names it)"
        )
    env = {**os.environ, "PYTHON_GIL": "0", _INNER: "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [python, "-X", "gil=0", "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
         "-n", "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
