"""Results as they come (``Batch.stream``, ``fetch_iter``, ``run_iter``): each Result is yielded
once, as it is kept, while the run goes on; leaving the loop stops the run as Ctrl-C does, and a
later stream goes on with the rest, no item sent twice (counted by the server)."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from batchsync import Batch, CallBatch, JournalFailed, JournalInUse, fetch_iter, run_iter
from batchsync.core.result import Result

from .mockserver import MockServerProcess
from .test_batch_api import KEY_HEADER, stats

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.integration


def urls_of(server: MockServerProcess, count: int, delay: float = 0.05) -> list[str]:
    marker = uuid.uuid4().hex[:8]
    return [f"{server.url}/ok/stream-{marker}-{n}?delay={delay}" for n in range(count)]


def sent(server: MockServerProcess, urls: list[str]) -> dict[str, int]:
    """How often the server was asked for each of ``urls`` (those asked at all)."""
    counts: dict[str, int] = server.stats()["counts"]
    targets = {url.removeprefix(server.url) for url in urls}
    return {target: n for target, n in counts.items() if target in targets}


def stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "batchsync-stream"]


def test_each_result_comes_once_as_it_is_kept_while_the_others_are_still_on_their_way(
    server: MockServerProcess,
) -> None:
    urls = urls_of(server, 20)
    urls[0] = urls[0].replace("delay=0.05", "delay=1.5")  # (the first item finishes last)
    order: list[int] = []
    answered_at_first = None
    for result in fetch_iter(urls, concurrency=4, progress=False):
        if answered_at_first is None:
            answered_at_first = sum(sent(server, urls).values())
        order.append(result.index)
        assert result.ok and result.url == urls[result.index]
    assert sorted(order) == list(range(20))
    assert order[-1] == 0, "in the order they finish, not input order"
    # The first Result came while most of the items were still to be sent (the server counts).
    assert answered_at_first is not None and answered_at_first < 20
    assert stream_threads() == []


def test_breaking_out_stops_the_run_and_a_later_stream_goes_on_with_the_rest(
    server: MockServerProcess, tmp_path: Path
) -> None:
    urls = urls_of(server, 60)
    journal = tmp_path / "stream.sqlite3"
    batch = Batch(urls, concurrency=4, journal=journal, progress=False)
    first: list[Result] = []
    for result in batch.stream():
        first.append(result)
        if len(first) == 10:
            break
    at_break = sum(sent(server, urls).values())
    assert stream_threads() == [], "the run ended with the loop"
    time.sleep(0.5)
    # Stopped: no item was sent once the loop had left (and few beyond the ten yielded: those
    # in flight, and those the workers took while the loop was leaving).
    assert sum(sent(server, urls).values()) == at_break < 30
    assert 0 < batch.pending <= 50

    # The same batch: what finished while it stopped comes first, then the rest; each once.
    rest = list(batch.stream())
    yielded = [r.index for r in first + rest]
    assert sorted(yielded) == list(range(60))
    assert batch.pending == 0
    assert set(sent(server, urls).values()) == {1}, "no item sent twice"
    assert list(batch.stream()) == [], "nothing left to yield"

    # A new batch over the journal yields what the journal holds, sending nothing.
    again = [r.index for r in Batch(urls, journal=journal, progress=False).stream()]
    assert sorted(again) == list(range(60))
    assert set(sent(server, urls).values()) == {1}


def test_fetch_iter_broken_out_of_then_called_again_sends_each_item_once(
    server: MockServerProcess, tmp_path: Path
) -> None:
    urls = urls_of(server, 40)
    journal = tmp_path / "iter.sqlite3"
    for count, _ in enumerate(fetch_iter(urls, journal=journal, concurrency=4, progress=False)):
        if count == 9:
            break
    second = [r.index for r in fetch_iter(urls, journal=journal, concurrency=4, progress=False)]
    assert sorted(second) == list(range(40)), "the journal's first, then the rest"
    assert set(sent(server, urls).values()) == {1}


def test_an_exception_in_the_loop_stops_the_run_and_is_raised(
    server: MockServerProcess,
) -> None:
    urls = urls_of(server, 60)
    with pytest.raises(RuntimeError, match="the caller's own"):
        for _ in fetch_iter(urls, concurrency=4, progress=False):
            raise RuntimeError("the caller's own")
    assert stream_threads() == []
    at_stop = sum(sent(server, urls).values())
    time.sleep(0.5)
    assert sum(sent(server, urls).values()) == at_stop < 30


def test_what_the_run_raises_is_raised_in_the_loop(
    server: MockServerProcess, tmp_path: Path
) -> None:
    journal = tmp_path / "busy.sqlite3"
    urls = urls_of(server, 3)
    holder = Batch(urls, journal=journal, progress=False)
    with holder._controller(), pytest.raises(JournalInUse):  # (another run has the journal)
        list(Batch(urls, journal=journal, progress=False).stream())
    assert stream_threads() == []
    assert sent(server, urls) == {}


def test_run_iter_and_a_call_batch_stream_each_call_once() -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def square(n: int) -> int:
        with lock:
            calls.append(n)
        time.sleep(0.01)
        return n * n

    got = {r.index: r.data for r in run_iter(square, range(30), concurrency=3, progress=False)}
    assert got == {n: n * n for n in range(30)}
    assert sorted(calls) == list(range(30))

    calls.clear()
    batch = CallBatch(square, range(30), concurrency=3, progress=False)
    first = []
    for result in batch.stream():
        first.append(result.index)
        if len(first) == 5:
            break
    rest = [r.index for r in batch.stream()]
    assert sorted(first + rest) == list(range(30))
    assert sorted(calls) == list(range(30)), "no call made twice"


def test_a_batch_endpoint_streams_its_rows_and_a_broken_stream_submits_no_part_twice(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:10]
    url = f"{server.url}/llm/{key}/pace=0.05/v1/chat/completions"
    rows = [{"text": f"question {n}"} for n in range(30)]
    body = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}

    def batch() -> Batch:
        return Batch(
            rows, url=url, body=body, batch_api="auto", poll=0.05, batch_rows=10,
            headers=KEY_HEADER, journal=tmp_path / "batches.sqlite3", progress=False,
        )  # fmt: skip

    first = []
    for result in batch().stream():
        first.append(result.index)
        if len(first) == 3:
            break
    assert stream_threads() == []
    rest = [r.index for r in batch().stream()]
    assert sorted(rest) == list(range(30))
    assert set(first) <= set(rest)
    counts = stats(server, key)
    assert counts["batches_created"] == 3 and counts["twice"] == []
    assert counts["rows_run"] == 30


def test_the_plain_script_example_runs_against_the_bundled_mock_api() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "stream_results.py")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("50 items: 10 written before the stop, 50 on the second call;")
    assert done.stdout.rstrip().endswith("each once: True")


def test_a_result_is_yielded_only_once_the_journal_holds_it(tmp_path: Path) -> None:
    journal = tmp_path / "kept.sqlite3"
    batch = CallBatch(lambda n: n, range(300), concurrency=8, journal=journal, progress=False)
    checked = 0
    with batch.stream() as results:
        for result in results:
            with closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as db:
                held = db.execute("SELECT 1 FROM results WHERE idx = ?", (result.index,))
                assert held.fetchone() is not None, f"item {result.index} yielded unjournaled"
            checked += 1
            if checked == 40:
                break
    assert stream_threads() == []


def test_one_run_of_a_batch_at_a_time() -> None:
    calls: list[int] = []

    def slow(n: int) -> int:
        calls.append(n)
        time.sleep(0.02)
        return n

    batch = CallBatch(slow, range(40), concurrency=4, progress=False)
    results = batch.stream()
    next(results)
    with pytest.raises(ValueError, match="running already"):
        batch.run()
    with pytest.raises(ValueError, match="running already"):
        list(batch.stream())
    results.close()
    assert stream_threads() == []
    batch.run()
    assert sorted(calls) == list(range(40)), "no item called twice"


def test_a_stream_kept_in_a_variable_stops_its_run_when_closed_or_left(
    server: MockServerProcess,
) -> None:
    urls = urls_of(server, 60, delay=0.1)
    batch = Batch(urls, concurrency=2, progress=False)
    with batch.stream() as results:
        for _ in results:
            break
    assert stream_threads() == [], "the with block closed it"
    at_close = sum(sent(server, urls).values())
    time.sleep(0.5)
    assert sum(sent(server, urls).values()) == at_close < 60


def test_what_a_run_raises_after_the_loop_left_is_raised_by_close_and_logged_if_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def encode(value: int) -> int:
        if value >= 1:
            raise RuntimeError("cannot encode")
        return value

    def fn(n: int) -> int:
        time.sleep(0.05 if n == 0 else 0.3)
        return n

    def batch(name: str) -> CallBatch:
        return CallBatch(
            fn, range(10), concurrency=4, journal=tmp_path / name, encode=encode,
            decode=lambda v: v, progress=False,
        )  # fmt: skip

    results = batch("closed.sqlite3").stream()
    next(results)
    with pytest.raises(JournalFailed, match="cannot encode"):
        results.close()
    with caplog.at_level(logging.ERROR, logger="batchsync"):
        for _ in batch("dropped.sqlite3").stream():
            break
    assert "stopped its run, which failed" in caplog.text and "cannot encode" in caplog.text
