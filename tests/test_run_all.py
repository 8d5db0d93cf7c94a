from __future__ import annotations

import _thread
import asyncio
import dataclasses
import itertools
import math
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from batchsync import (
    Backoff,
    Breaker,
    CallBatch,
    JournalFailed,
    JournalUnusable,
    Result,
    Retryable,
    run_all,
)

FAST = Backoff(base=0.01, jitter=0.0)


def test_results_are_what_the_callable_returned_in_input_order() -> None:
    rs = run_all(lambda n: n * n, range(50), concurrency=4)
    assert [r.data for r in rs] == [n * n for n in range(50)]
    assert all(r.ok and r.attempts == 1 for r in rs)
    assert len(rs.ok) == 50
    assert rs.failed == []


def test_transient_errors_are_retried_then_succeed() -> None:
    calls: dict[int, int] = {}
    lock = threading.Lock()

    def flaky(n: int) -> int:
        with lock:
            calls[n] = calls.get(n, 0) + 1
            tries = calls[n]
        if tries < 3:
            raise ConnectionResetError("reset by peer")
        return n

    rs = run_all(flaky, range(5), attempts=3, backoff=FAST)
    assert all(r.ok and r.attempts == 3 for r in rs)
    assert [record.error_kind for record in rs[0].attempt_log] == ["connection", "connection", None]


def test_other_exceptions_are_terminal_and_never_escape() -> None:
    calls = 0

    def broken(item: str) -> None:
        nonlocal calls
        calls += 1
        raise KeyError(item)

    rs = run_all(broken, ["a"], attempts=5, backoff=FAST)
    assert calls == 1
    assert (rs[0].ok, rs[0].error_kind, rs[0].error, rs[0].attempts) == (
        False,
        "exception",
        "KeyError: 'a'",
        1,
    )


def test_retryable_with_retry_after_is_a_floor_under_the_wait() -> None:
    seen: list[float] = []

    def busy(item: str) -> str:
        seen.append(time.monotonic())
        if len(seen) == 1:
            raise Retryable("busy", retry_after=0.3)
        return item

    rs = run_all(busy, ["a"], backoff=FAST)
    assert rs[0].ok
    assert seen[1] - seen[0] >= 0.3


def test_retry_if_decides_what_is_retried() -> None:
    rs = run_all(
        lambda item: 1 / 0,
        ["a"],
        attempts=3,
        backoff=FAST,
        retry_if=lambda exc: isinstance(exc, ZeroDivisionError),
    )
    assert (rs[0].attempts, rs[0].error_kind) == (3, "exception")
    assert rs[0].error == "ZeroDivisionError: division by zero after 3 attempts"


def test_budget_stops_retries_whose_wait_does_not_fit() -> None:
    def always_busy(item: str) -> None:
        raise Retryable("busy", retry_after=30)

    started = time.monotonic()
    rs = run_all(always_busy, ["a"], budget=20)
    assert time.monotonic() - started < 10  # waited neither the 30 s nor the budget's 20 s
    assert (rs[0].error_kind, rs[0].attempts) == ("budget", 1)


def test_labels_come_from_url_items() -> None:
    rs = run_all(lambda item: None, ["http://h.test/a", {"url": "http://h.test/b", "id": 9}, 3])
    assert [(r.url, r.id) for r in rs] == [
        ("http://h.test/a", None),
        ("http://h.test/b", 9),
        (None, None),
    ]


def test_empty_input_is_an_empty_result_set() -> None:
    rs = run_all(lambda item: item, [])
    assert len(rs) == 0
    assert rs.summary().total == 0


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"attempts": 0}, "attempts"),
        ({"budget": -1}, "budget"),
        ({"deadline": 0}, "deadline"),
        ({"budget": float("nan")}, "budget"),
    ],
)
def test_invalid_options_fail_before_any_call(options: dict[str, float], field: str) -> None:
    calls: list[str] = []
    with pytest.raises(ValueError, match=f"invalid option: {field}") as caught:
        run_all(calls.append, ["a"], **options)  # type: ignore[arg-type]
    assert calls == []
    assert "\n" not in str(caught.value)


def test_works_inside_a_running_event_loop() -> None:
    async def notebook_cell() -> list[int]:
        rs = run_all(lambda n: n + 1, [1, 2, 3])
        return [r.data for r in rs]

    assert asyncio.run(notebook_cell()) == [2, 3, 4]


def test_urls_and_errors_are_masked_by_shape() -> None:
    # A callable's exception often quotes the URL it called (requests' HTTPError does).
    def call(url: str) -> None:
        raise ValueError(f"500 Server Error for url: {url}")

    (result,) = run_all(call, ["http://user:pw@h.test/x?api_key=K3Y"], attempts=1)
    assert result.url == "http://***@h.test/x?api_key=***"
    assert result.error == "ValueError: 500 Server Error for url: http://***@h.test/x?api_key=***"


@dataclasses.dataclass(frozen=True)
class Quote:
    sku: str
    price: float


def test_a_journaled_run_all_continues_where_it_stopped(tmp_path: Path) -> None:
    called: list[int] = []
    lock = threading.Lock()

    def price(n: int) -> dict[str, int]:
        with lock:
            called.append(n)
        time.sleep(0.02)
        return {"n": n, "price": n * 10}

    journal = tmp_path / "prices.sqlite3"
    stop_after = itertools.count(1)

    def interrupt(result: Result) -> None:
        if next(stop_after) == 5:
            _thread.interrupt_main()

    with pytest.raises(KeyboardInterrupt):
        run_all(price, range(40), concurrency=2, journal=journal, on_result=interrupt)
    first = sorted(called)
    assert 5 <= len(first) < 40
    called.clear()
    rs = run_all(price, range(40), concurrency=2, journal=journal)
    assert [r.data for r in rs] == [{"n": n, "price": n * 10} for n in range(40)]
    assert sorted(called + first) == list(range(40))  # nothing called twice
    with pytest.raises(ValueError, match="made for other items"):
        run_all(price, range(41), journal=journal)


def test_encode_and_decode_store_what_json_cannot_hold(tmp_path: Path) -> None:
    journal = tmp_path / "quotes.sqlite3"
    skus = ["a1", "b2", "c3"]
    options: dict[str, Any] = {
        "journal": journal, "encode": dataclasses.asdict, "decode": lambda d: Quote(**d)
    }  # fmt: skip
    rs = run_all(lambda sku: Quote(sku, 9.5), skus, **options)
    assert [r.data for r in rs] == [Quote(sku, 9.5) for sku in skus]
    again = run_all(lambda sku: pytest.fail("already journaled"), skus, **options)
    assert [r.data for r in again] == [Quote(sku, 9.5) for sku in skus]


def test_a_function_that_says_it_returns_what_json_cannot_hold_is_refused_up_front(
    tmp_path: Path,
) -> None:
    def quote(sku: str) -> Quote:
        return pytest.fail("called")

    with pytest.raises(ValueError, match=r"returns .*Quote.*give encode="):
        run_all(quote, ["a1"], journal=tmp_path / "j.sqlite3")
    assert not (tmp_path / "j.sqlite3").exists()


def test_a_value_json_cannot_hold_fails_the_run_at_its_first_results(tmp_path: Path) -> None:
    called = itertools.count()

    def make(n):  # type: ignore[no-untyped-def]  # (says nothing of what it returns)
        next(called)
        time.sleep(0.01)
        return Quote("x", n)

    with pytest.raises(JournalFailed):
        run_all(make, range(500), concurrency=2, journal=tmp_path / "objects.sqlite3")
    assert next(called) < 50  # stopped at the first Results, not after all 500


def test_a_call_batch_keeps_what_finished_on_interrupt_and_runs_the_rest() -> None:
    """The notebook form: interrupted, ``run()`` again calls only what had not finished."""
    called = itertools.count()
    finished = itertools.count(1)

    def slow_square(n: int) -> int:
        next(called)
        time.sleep(0.02)
        return n * n

    def interrupt(result: Result) -> None:
        if next(finished) == 6:
            _thread.interrupt_main()

    batch = CallBatch(slow_square, range(30), concurrency=2, on_result=interrupt)
    with pytest.raises(KeyboardInterrupt):
        batch.run()
    kept = len(batch.results)
    assert 6 <= kept < 30 and batch.pending == 30 - kept
    rs = batch.run()
    assert [r.data for r in rs] == [n * n for n in range(30)]
    assert next(called) == 30  # every item called once


def test_a_slow_call_is_hedged_and_the_first_answer_wins() -> None:
    """Item 0's first call hangs; after hedge_after a second one starts and answers."""
    started: list[int] = []
    lock = threading.Lock()
    release = threading.Event()

    def lookup(n: int) -> str:
        with lock:
            started.append(n)
            first_of_zero = n == 0 and started.count(0) == 1
        if first_of_zero:
            release.wait(10)  # the slow one
            return "slow"
        return f"fast {n}"

    begun = time.monotonic()
    rs = run_all(lookup, range(3), hedge_after=0.2, breaker=None)
    release.set()
    assert [r.data for r in rs] == ["fast 0", "fast 1", "fast 2"]
    assert time.monotonic() - begun < 5  # the hung call was not waited for
    assert started.count(0) == 2 and rs[0].attempts == 2  # two calls, one attempt hedged


def test_one_items_wait_hint_holds_that_item_alone() -> None:
    """``Retryable(retry_after=…)`` is about that item; the rest of the batch goes on."""

    def lookup(n: int) -> int:
        if n == 0:
            raise Retryable("not replicated yet", retry_after=100)
        return n

    started = time.monotonic()
    rs = run_all(lookup, range(20), budget=30)
    assert [r.ok for r in rs] == [False] + [True] * 19
    assert rs[0].error_kind == "budget"
    assert time.monotonic() - started < 10


def test_failing_items_do_not_trip_a_breaker_over_the_healthy_ones() -> None:
    """Calls share no host: by default no breaker stands between one item and another."""

    def reach(n: int) -> int:
        if n < 25:
            raise ConnectionError(f"host {n} is gone")
        return n

    rs = run_all(reach, range(40), attempts=1, budget=3)
    assert [r.ok for r in rs] == [False] * 25 + [True] * 15


def test_what_a_callable_may_not_catch_ends_the_run_loudly() -> None:
    """A SystemExit from deep in a library: no run_all that quietly lacks Results."""

    def exits(n: int) -> int:
        if n == 1:
            raise SystemExit(3)
        return n

    with pytest.raises(SystemExit):
        run_all(exits, range(4))


def test_a_retry_if_that_raises_still_leaves_the_item_its_result() -> None:
    def broken(exc: BaseException) -> bool:
        raise RuntimeError("bug in retry_if")

    (result,) = run_all(lambda n: 1 / 0, [1], retry_if=broken)
    assert (result.ok, result.error_kind) == (False, "exception")
    assert result.error == (
        "ZeroDivisionError: division by zero (retry_if raised RuntimeError: bug in retry_if)"
    )


@pytest.mark.parametrize("said", ["no", 1, 0, ["sk-secret"]])
def test_a_retry_if_that_answers_no_bool_ends_the_item_naming_it_and_the_type(
    said: object,
) -> None:
    """As with fetch_all: not retried, not taken by its truth; the type shown, not the value."""
    calls: list[int] = []

    def fails(n: int) -> int:
        calls.append(n)
        raise TimeoutError("slow")  # (retried without a retry_if)

    def policy(exc: BaseException) -> bool:
        return said  # type: ignore[return-value]

    (result,) = run_all(fails, [1], attempts=3, backoff=FAST, retry_if=policy)
    assert (result.ok, result.attempts, result.error_kind, calls) == (False, 1, "timeout", [1])
    assert result.error == (
        "TimeoutError: slow (retry_if test_a_retry_if_that_answers_no_bool_ends_the_item_naming_"
        f"it_and_the_type.<locals>.policy returned {type(said).__name__}, not True, False or None)"
    )


def test_a_journal_refuses_what_it_could_not_resume(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"item 0 cannot be journaled"):
        run_all(str, [object()], journal=tmp_path / "j.sqlite3")
    with pytest.raises(ValueError, match="give journal= too"):
        run_all(str, [1], encode=str)
    journal = tmp_path / "decode.sqlite3"
    run_all(str, [1], journal=journal)

    def broken(value: Any) -> Any:
        raise KeyError("bug in decode")

    with pytest.raises(JournalUnusable, match="item 0 cannot be read back: KeyError"):
        run_all(str, [1], journal=journal, decode=broken)


def test_a_secret_in_a_key_or_an_encode_error_never_shows(tmp_path: Path) -> None:
    """Both texts reach a Result's error or the run's: masked like every other."""

    def down(n: int) -> int:
        raise ConnectionError("refused")

    rs = run_all(
        down, range(6), attempts=1, budget=1,
        per_key=lambda n: "https://api.test/v1?token=S3cretKeyTok",
        breaker=Breaker(ratio=0.5, window=2, min_calls=2, reset=60),
    )  # fmt: skip
    assert rs[-1].error_kind == "circuit_open"
    assert all("S3cretKeyTok" not in (r.error or "") for r in rs)

    def leaky_encode(value: Any) -> Any:
        raise ValueError("cannot post to https://api.test/v1?api_key=S3cretEncKey")

    with pytest.raises(JournalFailed) as failed:
        run_all(str, [1], journal=tmp_path / "j.sqlite3", encode=leaky_encode)
    assert "S3cretEncKey" not in str(failed.value)
    assert "encode failed on item 0" in str(failed.value)


def test_a_function_that_says_it_returns_what_json_would_change_is_refused_up_front(
    tmp_path: Path,
) -> None:
    def pair(n: int) -> tuple[int, int]:
        return n, n

    def by_number(n: int) -> dict[int, str]:
        return {n: "x"}

    for fn in (pair, by_number):
        with pytest.raises(ValueError, match="the journal cannot store as JSON"):
            run_all(fn, [0], journal=tmp_path / "j.sqlite3")
    assert not (tmp_path / "j.sqlite3").exists()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ((1, 2), "a tuple, which JSON gives back as a list"),
        ({1: "a"}, "a key that is not a str, which JSON gives back as a str"),
        ({"x": [math.nan]}, "NaN or an infinity, which JSON gives back as null"),
        (math.inf, "NaN or an infinity, which JSON gives back as null"),
    ],
)
def test_a_value_json_would_change_is_refused_at_journaling(
    tmp_path: Path, value: Any, reason: str
) -> None:
    """A resumed run would give back another value (a list for a tuple, "1" for 1, None for
    NaN): the journal refuses it at the first Result, as it refuses what JSON cannot hold."""
    with pytest.raises(JournalFailed, match=f"item 0 returned {reason}: give encode="):
        run_all(lambda n: value, [0], journal=tmp_path / "j.sqlite3")
    # What comes back equal is kept, and comes back equal after a resume.
    faithful = {"a": [1, 2.5, None, True, "\ud800"], "b": {"c": -0.0}}
    journal = tmp_path / "ok.sqlite3"
    assert run_all(lambda n: faithful, [0], journal=journal)[0].data == faithful
    assert run_all(lambda n: faithful, [0], journal=journal)[0].data == faithful
