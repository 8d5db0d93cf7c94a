"""The generic engine: items through a thread pool, one worker per item from claim to Result.

The main thread reads the input lazily and keeps at most ``2 * concurrency`` items handed to
the pool and unfinished, so memory does not grow with the input. Each worker carries one item
through its attempts, waits and give-up decisions, and delivers exactly one Result.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from .budget import Allowance
from .classify import ErrorKind, Verdict, describe
from .limits import GLOBAL, Gates
from .options import EngineOptions
from .redact import redact_url
from .result import AttemptRecord, Result
from .spec import InvalidItem

log = logging.getLogger("batchsync")

# Receives each final Result with the item it is for, from worker threads.
Deliver = Callable[[Result, object], None]

_POLL_SECONDS = 0.1
STOP_GRACE_SECONDS = 3.0
# What the gates are told when an attempt raised instead of returning a Verdict.
_NOT_SENT = Verdict("terminal", "exception", "the attempt raised")


@dataclass(frozen=True, slots=True)
class Task:
    """An item made ready to run: what to report it as, and how to make one attempt.

    ``attempt(bound)`` makes one try that should end within ``bound`` seconds (None: no bound)
    and says what came of it. ``max_attempts`` lowers the batch's attempts for this item, and
    ``no_retry_reason`` says why. ``host`` is the key of the per-host limits.
    """

    url: str | None
    id: Any
    attempt: Callable[[float | None], Verdict]
    max_attempts: int | None = None
    no_retry_reason: str | None = None
    host: str | None = None


class Job(Protocol):
    """What the engine runs: turns items into Tasks. ``timeout`` caps each attempt."""

    @property
    def timeout(self) -> float | None: ...

    def prepare(self, item: object) -> Task:
        """A Task for the item; raises InvalidItem when it cannot be run at all."""
        ...

    def label(self, item: object) -> tuple[str | None, Any]:
        """The (url, id) to report for an item that never became a Task."""
        ...


def _log_retry(task: Task, verdict: Verdict, number: int, limit: int, wait: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    url = redact_url(task.url) if task.url else task.url
    log.info(
        "retry %s: %s (attempt %d of %d); waiting %.2f s",
        url, verdict.error, number, limit, wait,
        extra={
            "url": url, "attempt": number, "status_code": verdict.status_code,
            "error_kind": verdict.error_kind, "wait": wait,
        },
    )  # fmt: skip


def _log_failure(result: Result) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    url = redact_url(result.url) if result.url else result.url
    log.info(
        "failed %s: %s",
        url, result.error,
        extra={
            "url": url, "attempt": result.attempts, "status_code": result.status_code,
            "error_kind": result.error_kind, "wait": None,
        },
    )  # fmt: skip


def _plural(count: int) -> str:
    return f"{count} attempt" if count == 1 else f"{count} attempts"


class Engine:
    """Runs a Job over items with bounded concurrency; see the module docstring."""

    def __init__(
        self,
        options: EngineOptions,
        *,
        gates: Gates | None = None,
        grace: float = STOP_GRACE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.options = options
        self._gates = gates
        self._grace = grace
        self._clock = clock
        self._rand = rand
        self._stop = threading.Event()
        self._stopped_at = 0.0

    def stop(self) -> None:
        """Take no new items; items waiting to retry end as ``cancelled``.

        Attempts in flight get ``grace`` seconds to end before ``run`` stops waiting for them.
        """
        if not self._stop.is_set():
            self._stopped_at = self._clock()
            self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self, job: Job, items: Iterable[tuple[int, object]], deliver: Deliver) -> bool:
        """Deliver one Result per (index, item) pair, from worker threads, as each finishes.

        Returns False when, after a stop or an interrupt, attempts still in flight were
        abandoned once the grace had passed (their worker threads end on their own, within
        the attempt's timeout); True otherwise. A KeyboardInterrupt stops the run the same
        way and is raised again; a second one during the grace is raised at once.
        """
        options = self.options
        self._stop.clear()
        started = self._clock()
        deadline_end = None if options.deadline is None else started + options.deadline
        window_size = 2 * options.concurrency
        window = threading.Semaphore(window_size)
        failures: list[BaseException] = []

        def deliver_logged(result: Result, item: object) -> None:
            if not result.ok:
                _log_failure(result)
            deliver(result, item)

        def work(index: int, item: object) -> None:
            try:
                deliver_logged(self._carry_safely(job, index, item, deadline_end), item)
            except BaseException as exc:  # a sink failed: stop the run and report it
                failures.append(exc)
                self.stop()
            finally:
                window.release()

        pool = ThreadPoolExecutor(options.concurrency, thread_name_prefix="batchsync")
        finished = False
        try:
            for index, item in items:
                if deadline_end is not None and self._clock() >= deadline_end:
                    deliver_logged(self._unstarted(job, index, item, "deadline"), item)
                    continue
                if not self._take(window):
                    break
                pool.submit(work, index, item)
            finished = self._drain(window, window_size)
        except BaseException:
            self.stop()
            finished = self._drain(window, window_size)
            raise
        finally:
            pool.shutdown(wait=finished, cancel_futures=True)
        if failures:
            raise failures[0]
        return finished

    def _take(self, window: threading.Semaphore) -> bool:
        """One slot of the window; False once the run is stopped."""
        # A timed wait keeps the main thread responsive to Ctrl-C and to stop().
        while not self._stop.is_set():
            if window.acquire(timeout=_POLL_SECONDS):
                return True
        return False

    def _drain(self, window: threading.Semaphore, size: int) -> bool:
        """Wait until every item handed out has finished; after a stop, for the grace at most."""
        taken = 0
        while taken < size:
            if window.acquire(timeout=_POLL_SECONDS):
                taken += 1
            elif self._stop.is_set() and self._clock() - self._stopped_at >= self._grace:
                return False
        return True

    def _unstarted(self, job: Job, index: int, item: object, kind: ErrorKind) -> Result:
        url, item_id = job.label(item)
        reason = {
            "deadline": "batch deadline passed before the item started",
            "cancelled": "batch stopped before the item started",
        }.get(kind, kind)
        return Result(index, url, False, item_id, error_kind=kind, error=reason)

    def _carry_safely(
        self, job: Job, index: int, item: object, deadline_end: float | None
    ) -> Result:
        try:
            return self._carry(job, index, item, deadline_end)
        except Exception as exc:  # a bug must not cost the item its Result
            log.exception("internal error on item %d", index)
            url, item_id = job.label(item)
            return Result(
                index,
                url,
                False,
                item_id,
                error_kind="exception",
                error=f"internal error: {describe(exc)}",
            )

    def _carry(self, job: Job, index: int, item: object, deadline_end: float | None) -> Result:
        """Claim to final Result: attempts, classification, waits and give-up decisions."""
        claimed = self._clock()
        if deadline_end is not None and claimed >= deadline_end:
            return self._unstarted(job, index, item, "deadline")
        if self._stop.is_set():
            return self._unstarted(job, index, item, "cancelled")
        try:
            task = job.prepare(item)
        except InvalidItem as exc:
            url, item_id = job.label(item)
            return Result(
                index,
                url,
                False,
                item_id,
                error_kind="invalid_request",
                error=str(exc),
                elapsed=self._clock() - claimed,
            )
        allowance = Allowance(claimed + self.options.budget, deadline_end)
        max_attempts = min(self.options.attempts, task.max_attempts or self.options.attempts)
        records: list[AttemptRecord] = []

        def finish(verdict: Verdict, error: str | None = None) -> Result:
            return Result(
                index=index,
                url=task.url,
                ok=verdict.ok,
                id=task.id,
                status_code=verdict.status_code,
                attempts=len(records),
                error_kind=verdict.error_kind,
                error=error if error is not None else verdict.error,
                data=verdict.data,
                elapsed=self._clock() - claimed,
                attempt_log=tuple(records),
            )

        last: Verdict | None = None
        while True:
            left, nearest = allowance.tightest(self._clock())
            if left <= 0:
                return self._refused(finish, last, nearest, task)
            admission = None
            if self._gates is not None:
                admitted = self._gates.admit(task.host or GLOBAL, allowance, self._stop)
                if isinstance(admitted, str):
                    return self._refused(finish, last, admitted, task)
                admission = admitted
            began = self._clock()
            bound, limit = (
                (None, None) if job.timeout is None else allowance.attempt_bound(job.timeout, began)
            )
            verdict = _NOT_SENT
            try:
                verdict = task.attempt(bound)
            finally:
                if admission is not None and self._gates is not None:
                    self._gates.release(admission, verdict)
            ended = self._clock()
            if verdict.error_kind == "timeout" and limit is not None:
                verdict = replace(
                    verdict,
                    outcome="terminal",
                    error_kind=limit,
                    error=f"{verdict.error} (cut short by the {limit})",
                )
            number = len(records) + 1
            record = AttemptRecord(number, verdict.status_code, verdict.error_kind, ended - began)
            last = verdict
            if verdict.outcome != "retry" or number >= max_attempts:
                records.append(record)
                limited_by_task = max_attempts < self.options.attempts
                return finish(verdict, self._final_error(verdict, number, task, limited_by_task))
            wait = self.options.backoff.wait(number, verdict.retry_after, self._rand())
            refused = allowance.refuses_wait(wait, ended)
            if refused is not None:
                records.append(record)
                return finish(
                    replace(verdict, error_kind=refused),
                    f"{verdict.error} after {_plural(number)}; the next try in {wait:.2f} s "
                    f"would pass the {refused}",
                )
            records.append(replace(record, wait=wait))
            _log_retry(task, verdict, number, max_attempts, wait)
            if self._stop.wait(wait):
                return finish(
                    replace(verdict, error_kind="cancelled"),
                    f"{verdict.error} after {_plural(number)}; stopped while waiting to retry",
                )

    @staticmethod
    def _final_error(
        verdict: Verdict, number: int, task: Task, limited_by_task: bool
    ) -> str | None:
        if verdict.ok:
            return None
        if verdict.outcome == "retry" and limited_by_task and task.no_retry_reason:
            return f"{verdict.error} after {_plural(number)} ({task.no_retry_reason})"
        if verdict.outcome == "retry" or number > 1:
            return f"{verdict.error} after {_plural(number)}"
        return verdict.error

    @staticmethod
    def _refused(
        finish: Callable[[Verdict, str | None], Result],
        last: Verdict | None,
        kind: ErrorKind,
        task: Task,
    ) -> Result:
        """The Result of an item stopped before its next attempt was sent."""
        reason = {
            "budget": "no time left in the budget",
            "deadline": "no time left before the deadline",
            "cancelled": "stopped before the next try",
            "circuit_open": f"the circuit for {task.host} is open",
        }.get(kind, kind)
        if last is None:
            return finish(Verdict("terminal", kind), reason)
        return finish(replace(last, outcome="terminal", error_kind=kind), f"{last.error}; {reason}")
