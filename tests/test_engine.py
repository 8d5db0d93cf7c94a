"""The engine with a scripted job: no network, only the engine's own decisions."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from batchsync.core.backoff import Backoff
from batchsync.core.engine import Engine
from batchsync.core.result import AttemptRecord, Result, describe_attempts
from batchsync.core.task import Route, Task
from batchsync.core.verdict import Feedback, InvalidItem, Verdict, retry, success, terminal
from batchsync.http.classify import host_feedback
from batchsync.http.httpfacts import HttpFacts
from batchsync.jobs.options import EngineOptions

from .fakeclock import FakeClock

FAST = Backoff(base=0.01, factor=2.0, max=0.05, jitter=0.0)


class Clock:
    """The engine's clock, moved only by the scripted attempts: what the engine decides from
    it does not depend on how fast the machine runs the test."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


@dataclass
class ScriptedJob:
    """Item ``name`` answers with the verdicts in ``script[name]``, one per attempt, in order."""

    script: dict[str, list[Verdict]] = field(default_factory=dict)
    delay: float = 0.0
    # With a clock, an attempt moves it on by ``delay`` instead of sleeping.
    clock: Clock | None = None
    timeout: float | None = None
    max_attempts: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    active: int = 0
    peak: int = 0
    bounds: list[float | None] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)

    def label(self, item: object) -> tuple[str | None, Any]:
        return str(item), None

    def feedback(self, verdict: Verdict) -> Feedback:
        return host_feedback(verdict)

    def prepare(self, item: object) -> Task:
        name = str(item)
        if name.startswith("bad"):
            raise InvalidItem("scripted bad item")
        with self.lock:
            self.prepared.append(name)
        answers = iter(self.script.get(name, [success(name)]))
        route = Route(
            lambda ends_at, so_far: self._attempt(answers, ends_at),
            max_attempts=self.max_attempts,
            no_retry_reason="scripted",
        )
        return Task(name, None, route)

    def _attempt(self, answers: Iterator[Verdict], ends_at: float | None) -> Verdict:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            now = time.monotonic() if self.clock is None else self.clock()
            self.bounds.append(None if ends_at is None else ends_at - now)
        try:
            if self.clock is not None:
                self.clock.advance(self.delay)
            else:
                time.sleep(self.delay)
            return next(answers)
        finally:
            with self.lock:
                self.active -= 1


def run(job: ScriptedJob, items: Any, clock: Clock | None = None, **options: Any) -> list[Result]:
    results: dict[int, Result] = {}
    lock = threading.Lock()

    def deliver(result: Result, item: object) -> None:
        assert result.url == item
        with lock:
            assert result.index not in results, "two Results for one item"
            results[result.index] = result

    options.setdefault("backoff", FAST)
    engine = Engine(EngineOptions(**options), clock=clock or time.monotonic)
    engine.run(job, enumerate(items), deliver)
    return [results[index] for index in sorted(results)]


def test_one_result_per_item_in_input_order() -> None:
    items = [f"item-{n}" for n in range(200)]
    results = run(ScriptedJob(delay=0.001), items, concurrency=8)
    assert [r.index for r in results] == list(range(200))
    assert [r.url for r in results] == items
    assert all(r.ok and r.data == r.url and r.attempts == 1 for r in results)


def test_never_more_attempts_at_once_than_the_concurrency() -> None:
    job = ScriptedJob(delay=0.01)
    run(job, [f"i{n}" for n in range(100)], concurrency=5)
    assert 1 < job.peak <= 5


def test_items_waiting_to_retry_count_against_the_concurrency() -> None:
    # every item fails once, then waits 0.2 s; with 2 workers, 2 items at most are in progress
    slow_retry = [retry("status", "HTTP 503", HttpFacts(503), retry_after=0.2), success("ok")]
    job = ScriptedJob(script={f"i{n}": list(slow_retry) for n in range(6)})
    in_progress = 0
    peak = 0
    lock = threading.Lock()
    prepare = job.prepare

    def counting_prepare(item: object) -> Task:
        nonlocal in_progress, peak
        with lock:
            in_progress += 1
            peak = max(peak, in_progress)
        return prepare(item)

    job.prepare = counting_prepare  # type: ignore[method-assign]
    results: list[Result] = []

    def deliver(result: Result, item: object) -> None:
        nonlocal in_progress
        with lock:
            in_progress -= 1
        results.append(result)

    started = time.monotonic()
    Engine(EngineOptions(concurrency=2, backoff=FAST)).run(
        job, enumerate(f"i{n}" for n in range(6)), deliver
    )
    assert peak == 2
    assert len(results) == 6
    assert time.monotonic() - started >= 0.6  # three rounds of 0.2 s waits


def test_input_is_consumed_lazily_through_a_bounded_window() -> None:
    pulled = 0
    delivered = 0
    worst_gap = 0
    lock = threading.Lock()

    def items() -> Iterator[str]:
        nonlocal pulled, worst_gap
        for n in range(300):
            with lock:
                pulled += 1
                worst_gap = max(worst_gap, pulled - delivered)
            yield f"i{n}"

    def deliver(result: Result, item: object) -> None:
        nonlocal delivered
        with lock:
            delivered += 1

    Engine(EngineOptions(concurrency=4)).run(ScriptedJob(delay=0.002), enumerate(items()), deliver)
    assert delivered == 300
    assert worst_gap <= 2 * 4 + 1


def test_a_retryable_failure_is_retried_with_the_wait_logged() -> None:
    job = ScriptedJob(
        script={
            "a": [retry("status", "HTTP 503", HttpFacts(503)), success({"x": 1}, HttpFacts(200))]
        }
    )
    (result,) = run(job, ["a"])
    assert (result.ok, result.attempts, result.status_code, result.data) == (True, 2, 200, {"x": 1})
    first, second = result.attempt_log
    assert (first.attempt, first.status_code, first.error_kind) == (1, 503, "status")
    assert first.wait == pytest.approx(0.01)
    assert (second.attempt, second.status_code, second.error_kind, second.wait) == (
        2,
        200,
        None,
        None,
    )


def test_a_terminal_failure_is_not_retried() -> None:
    job = ScriptedJob(
        script={"a": [terminal("status", "HTTP 404", HttpFacts(404)), success("never")]}
    )
    (result,) = run(job, ["a"])
    assert (result.ok, result.attempts, result.error_kind, result.error) == (
        False,
        1,
        "status",
        "HTTP 404",
    )


def test_attempts_are_the_total_tries_and_the_error_says_how_many() -> None:
    job = ScriptedJob(script={"a": [retry("status", "HTTP 503", HttpFacts(503))] * 5})
    (result,) = run(job, ["a"], attempts=3)
    assert (result.attempts, result.error_kind, result.status_code) == (3, "status", 503)
    assert result.error == "HTTP 503 after 3 attempts"
    assert len(result.attempt_log) == 3


def test_a_task_may_allow_fewer_attempts_and_says_why() -> None:
    job = ScriptedJob(script={"a": [retry("timeout", "timed out")] * 3}, max_attempts=1)
    (result,) = run(job, ["a"], attempts=3)
    assert result.attempts == 1
    assert result.error == "timed out after 1 attempt (scripted)"


def test_a_wait_that_does_not_fit_the_budget_gives_up_at_once() -> None:
    job = ScriptedJob(script={"a": [retry("status", "HTTP 429", HttpFacts(429), retry_after=60.0)]})
    started = time.monotonic()
    (result,) = run(job, ["a"], budget=30)
    assert time.monotonic() - started < 15  # waited neither the 60 s nor the budget's 30 s
    assert (result.attempts, result.error_kind, result.status_code) == (1, "budget", 429)
    assert "would pass the budget" in (result.error or "")


def test_each_attempt_gets_at_most_the_budget_left() -> None:
    clock = Clock()
    job = ScriptedJob(
        script={"a": [retry("status", "HTTP 503", HttpFacts(503)), success("ok")]},
        timeout=10.0, delay=0.5, clock=clock,
    )  # fmt: skip
    run(job, ["a"], clock=clock, budget=2.0)
    assert job.bounds == [2.0, 1.5]  # the whole budget, then what the first 0.5 s left


def test_a_timeout_cut_short_by_the_deadline_ends_as_deadline() -> None:
    job = ScriptedJob(script={"a": [retry("timeout", "timed out")]}, timeout=10.0)
    (result,) = run(job, ["a"], deadline=5.0)
    assert job.bounds[0] is not None and job.bounds[0] <= 5.0
    assert (result.error_kind, result.attempts) == ("deadline", 1)


def test_items_not_started_by_the_deadline_are_never_sent() -> None:
    clock = Clock()
    job = ScriptedJob(delay=0.2, clock=clock)
    results = run(job, [f"i{n}" for n in range(10)], clock=clock, concurrency=1, deadline=0.3)
    started = [r for r in results if r.attempts]
    unstarted = [r for r in results if not r.attempts]
    assert len(started) == 2  # at 0 and at 0.2 s; the third would start at 0.4 s
    assert len(started) + len(unstarted) == 10
    assert all(r.error_kind == "deadline" and not r.attempt_log for r in unstarted)
    assert len(job.prepared) == len(started)


def test_an_invalid_item_costs_no_attempt() -> None:
    results = run(ScriptedJob(), ["good", "bad-1", "good2"])
    assert [r.ok for r in results] == [True, False, True]
    assert (results[1].error_kind, results[1].attempts, results[1].error) == (
        "invalid_request",
        0,
        "scripted bad item",
    )


def test_a_bug_in_an_attempt_still_gives_the_item_its_result() -> None:
    class BrokenJob(ScriptedJob):
        def prepare(self, item: object) -> Task:
            def explode(ends_at: float | None, so_far: Result | None) -> Verdict:
                raise RuntimeError("bug")

            return Task(str(item), None, Route(explode))

    (result,) = run(BrokenJob(), ["a"])
    assert (result.ok, result.error_kind) == (False, "exception")
    # Its kind only: the message could hold whatever the item held (the log has it all).
    assert result.error == "internal error: RuntimeError"


def test_a_failing_sink_stops_the_run_and_raises() -> None:
    def deliver(result: Result, item: object) -> None:
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        Engine(EngineOptions(concurrency=2)).run(
            ScriptedJob(), enumerate(f"i{n}" for n in range(50)), deliver
        )


def test_stop_cancels_items_waiting_to_retry() -> None:
    clock = FakeClock()
    engine = Engine(EngineOptions(backoff=Backoff(base=30.0, jitter=0.0)), clock=clock)
    job = ScriptedJob(script={"a": [retry("status", "HTTP 503", HttpFacts(503))] * 3})
    results: list[Result] = []
    clock.at(0.2, engine.stop)
    started = clock.now()
    engine.run(job, enumerate(["a"]), lambda result, item: results.append(result))
    assert clock.now() - started < 15  # well short of the 30 s wait it cancelled
    assert (results[0].error_kind, results[0].attempts) == ("cancelled", 1)


@pytest.mark.parametrize(
    ("record", "shown"),
    [
        (AttemptRecord(1, 503, "status", 0.1, wait=0.5), "#1 503 wait 0.50 s"),
        (AttemptRecord(1, 200, None, 0.1), "#1 200"),
        (AttemptRecord(1, None, "connection", 0.1), "#1 connection"),
        # headers said 200, then the body timed out: that attempt was a timeout
        (AttemptRecord(1, 200, "timeout", 2.0, wait=0.5), "#1 timeout (HTTP 200) wait 0.50 s"),
        (
            AttemptRecord(2, 200, "invalid_body", 0.1, fallback=0),
            "#2 invalid_body (HTTP 200) (fallback 0)",
        ),
    ],
)
def test_the_attempt_log_line_says_what_ended_each_attempt(
    record: AttemptRecord, shown: str
) -> None:
    assert describe_attempts((record,)) == shown
