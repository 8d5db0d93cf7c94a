"""The generic engine: items through a thread pool, one worker per item from claim to Result.

Workers read the input lazily themselves, one item at a time, and at most ``2 * concurrency``
items are claimed and unfinished (items waiting on an identical request included), so memory
does not grow with the input. Each worker carries one item through its attempts, waits and
give-up decisions, and delivers exactly one Result.

Workers follow the work: a run starts one, and each worker starts the next when it claims its
first item, up to ``concurrency``. So a run never has more than one worker beyond the items it
has read (a one-item input starts two threads, whatever the concurrency), and the pool fills
as fast as the input comes.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import chain, count
from typing import Any, Protocol

from .admission import GLOBAL, Admission, Admitter, Refusal
from .backoff import Backoff
from .budget import Allowance
from .clock import SYSTEM, Clock, clock_of
from .decide import Attempted, Decision, cut_short, decide, plural
from .kinds import may_fall_back, stopped_reason, unstarted_reason
from .observe import Hooks, Observer, Observers
from .result import (
    ATTEMPT_EARLIER,
    AttemptRecord,
    Result,
    answer_of,
    describe_attempts,
    for_the_limits,
    result_of,
)
from .stop import Stop
from .task import Route, Task
from .verdict import ErrorKind, Feedback, InvalidItem, Verdict

log = logging.getLogger("batchsync")

# Receives each final Result with the item it is for, from worker threads.
Deliver = Callable[[Result, object], None]
# An item's Result from an earlier pass, by its index (None: it has none).
Earlier = Callable[[int], Result | None]

_POLL_SECONDS = 0.1
STOP_GRACE_SECONDS = 3.0
ABORT_GRACE_SECONDS = 1.0


class EngineSettings(Protocol):
    """What the engine reads of a run's options (``options.EngineOptions`` has them)."""

    @property
    def concurrency(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def budget(self) -> float: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def backoff(self) -> Backoff: ...
    @property
    def on_attempt(self) -> Callable[[Any, AttemptRecord], None] | None: ...
    @property
    def on_result(self) -> Callable[[Result], None] | None: ...


@dataclass(slots=True)  # built per item, never changed (frozen would cost 6x to build)
class _Copy:
    """An item waiting for an identical one in flight to land."""

    index: int
    item: object
    url: str | None
    id: Any
    claimed: float


@dataclass(slots=True)  # one per item carried
class _Carried:
    """An item on its way through its routes, with the record of every attempt so far."""

    job: Job
    task: Task
    index: int
    claimed: float
    allowance: Allowance
    records: list[AttemptRecord] = field(default_factory=list)
    # Called once, when the item gets going: its first attempt passed the limits (with no
    # other left in line behind it at a rate), or had none to pass, or a limit holds it where
    # other items need not wait behind it (see ``_Run.work``).
    going: Callable[[], None] | None = None
    # Its Result from an earlier pass, when a retry pass sends it again (see ``repeats``).
    earlier: Result | None = None

    def go(self) -> None:
        going, self.going = self.going, None
        if going is not None:
            going()


@dataclass(slots=True)
class _Flight:
    """One request in flight and the identical items waiting for its Result."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    copies: list[_Copy] = field(default_factory=list)
    landed: bool = False


@dataclass
class _Flights:
    """Identical requests in flight: the first is sent, copies wait for its Result. A key is
    kept only while its first request is in flight, so memory stays bounded; no lock is shared
    between keys: the dict's own atomic setdefault/pop decide who leads."""

    _flights: dict[Hashable, _Flight] = field(default_factory=dict)

    def join(self, key: Hashable, copy: _Copy) -> bool:
        """True when an identical request is in flight (``copy`` now waits for it); else
        the caller leads: it sends the request and must ``land`` the key."""
        while True:
            fresh = _Flight()
            flight = self._flights.setdefault(key, fresh)
            if flight is fresh:
                return False
            with flight.lock:
                if not flight.landed:
                    flight.copies.append(copy)
                    return True
            # That flight landed as we came: lead the next one.

    def land(self, key: Hashable) -> list[_Copy]:
        flight = self._flights.pop(key)
        with flight.lock:
            flight.landed = True
            return flight.copies


class Job(Protocol):
    """What the engine runs: turns items into Tasks. ``timeout`` caps each attempt."""

    @property
    def timeout(self) -> float | None: ...

    def prepare(self, item: object) -> Task:
        """A Task for the item; raises InvalidItem when it cannot be run at all."""

    def label(self, item: object) -> tuple[str | None, Any]:
        """The (url, id) to report for an item that never became a Task."""

    def feedback(self, verdict: Verdict) -> Feedback:
        """What an attempt's Verdict tells the limits of the host it went to."""


# The fields of a retry's or a failure's log record, for structured handlers.
_LOGGED = ("url", "attempt", "status_code", "error_kind", "wait")


def _priced(admission: Admission | None) -> tuple[float | None, float | None, str | None]:
    """An attempt's spend under a spend cap, as its record keeps it: dollars spent, dollars
    reserved, the model priced (all None without a cap)."""
    if admission is None or admission.price is None:
        return None, None, None
    return admission.cost_in_dollars, admission.reserved_in_dollars, admission.model


def _log_retry(url: str | None, verdict: Verdict, number: int, limit: int, wait: float) -> None:
    if log.isEnabledFor(logging.INFO):
        logged = (url, number, answer_of(verdict).status_code, verdict.error_kind, wait)
        log.info("retry %s: %s (attempt %d of %d); waiting %.2f s", url, verdict.error, number,
                 limit, wait, extra=dict(zip(_LOGGED, logged, strict=True)))  # fmt: skip


class _Run:
    """One run's shared state and the loop each worker runs."""

    def __init__(
        self,
        engine: Engine,
        job: Job,
        source: Iterator[tuple[int, object]],
        deliver: Deliver,
        deadline_end: float | None,
        *,
        earlier: Earlier | None,
    ) -> None:
        self._engine = engine
        self._earlier = earlier
        self._job = job
        self._source = source
        self._source_lock = threading.Lock()
        self._deliver = deliver
        self._deadline_end = deadline_end
        self._stopped = engine._stop.is_set  # (read on every claim: the Event's own method)
        # Items parked on an identical request in flight: at most one per worker, each taking
        # a token (a SimpleQueue rather than a Semaphore: taking and giving cost a C call).
        self._parked: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(engine.options.concurrency):
            self._parked.put(None)
        self.failures: list[BaseException] = []
        self._pool = ThreadPoolExecutor(engine.options.concurrency, thread_name_prefix="batchsync")
        self._workers: list[Future[None]] = []
        self._workers_lock = threading.Lock()
        self._closed = False
        # Workers ready to claim (started, or back for another item): while one is, no other
        # is started: it would only wait beside it.
        self._ready = 0
        # Workers running, and set when none is: what the main thread waits on (waiting on
        # every worker's future, ten times a second, cost CPU in proportion to the workers).
        self._running = 0
        self.all_ended = threading.Event()
        self.all_ended.set()

    def start(self) -> None:
        """Start one more worker, while the pool has room, the run goes on and no worker is
        ready to claim."""
        with self._workers_lock:
            room = len(self._workers) < self._engine.options.concurrency
            if room and not self._ready and not self._closed and not self._stopped():
                self._workers.append(self._pool.submit(self._worker))
                self._running += 1
                self._ready += 1
                self.all_ended.clear()

    def _count_ready(self, change: int) -> None:
        with self._workers_lock:
            self._ready += change

    def _worker(self) -> None:
        try:
            self.work()
        finally:
            with self._workers_lock:
                self._running -= 1
                if not self._running:
                    self.all_ended.set()

    @property
    def workers(self) -> list[Future[None]]:
        """The workers started so far (a worker starts the next before it ends)."""
        with self._workers_lock:
            return list(self._workers)

    def shutdown(self, *, wait: bool) -> None:
        with self._workers_lock:
            self._closed = True
        self._pool.shutdown(wait=wait)

    def work(self) -> None:
        """Claim items until there are none; each worker carries one item at a time.

        Workers follow the work: a worker starts another, while no worker is ready to claim,
        when its item gets going: its attempt passed the limits with no other attempt left in
        line behind it at a rate (``Admission.held_back``: the rate, not the workers, sets
        the pace then), or a limit holds it where other items need not wait behind it (a
        host's circuit, cooldown or slots: ``Admission.going``). The same rule holds for
        every run, a resume or a retry pass as much as a first run.
        """
        engine = self._engine
        while True:
            entry = self._claim()
            self._count_ready(-1)  # (carrying an item, or ending)
            if entry is None:
                return
            index, item = entry
            before = None if self._earlier is None else self._earlier(index)
            delivered = engine.carry(
                self._job, index, item, self._deadline_end, going=self.start, earlier=before
            )
            if not delivered and not self._hold_slot():  # (parked on an identical request:
                return  # a slot is held until it lands)
            for result, its_item in delivered:
                engine._report(result)
                try:
                    self._deliver(result, its_item)
                except BaseException as exc:  # a sink failed: stop the run and report it
                    self._fail(exc)
            for _ in delivered[1:]:  # the copies that were parked on this one
                self._parked.put(None)
            self._count_ready(1)  # (back for another)

    def _claim(self) -> tuple[int, object] | None:
        """The next item, read lazily by whichever worker is free; None when done."""
        with self._source_lock:
            if self._stopped():
                return None
            try:
                return next(self._source)
            except StopIteration:
                return None
            except BaseException as exc:  # the input failed: stop the run and report it
                self._fail(exc)
                return None

    def _hold_slot(self) -> bool:
        while not self._engine.stopped:
            with contextlib.suppress(queue.Empty):
                self._parked.get(timeout=_POLL_SECONDS)
                return True
        return False

    def _fail(self, exc: BaseException) -> None:
        self.failures.append(exc)
        self._engine.stop()


class Engine:
    """Runs a Job over items with bounded concurrency; see the module docstring."""

    def __init__(
        self,
        options: EngineSettings,
        *,
        gates: Admitter | None = None,
        observers: Iterable[Observer] = (),
        abort: Callable[[], None] | None = None,
        grace: float = STOP_GRACE_SECONDS,
        clock: Clock | Callable[[], float] = SYSTEM,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.options = options
        self._gates = gates
        self._abort = abort
        hooked = options.on_attempt or options.on_result
        hooks = [Hooks(options.on_attempt, options.on_result)] if hooked else []
        self.observers = Observers([*observers, *hooks])
        self._flights = _Flights()
        self._grace = grace
        # (its readings, called often, and its waits)
        self._time = clock_of(clock)
        self._clock = self._time.now
        self._rand = rand
        self._stop = Stop()
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

    def run(
        self,
        job: Job,
        items: Iterable[tuple[int, object]],
        deliver: Deliver,
        *,
        earlier: Earlier | None = None,
    ) -> bool:
        """Deliver one Result per (index, item) pair, from worker threads, as each finishes;
        ``earlier``: an item's Result from an earlier pass, by its index (a retry pass's).

        Returns False when, after a stop or an interrupt, attempts still in flight were
        abandoned once the grace had passed and ``abort`` (if any) did not end them (their
        worker threads end on their own, within the attempt's timeout); True otherwise. A
        KeyboardInterrupt stops the run the same way and is raised again; a second one during
        the grace is raised at once.
        """
        options = self.options
        self._stop.clear()
        started = self._clock()
        deadline_end = None if options.deadline is None else started + options.deadline
        run = _Run(self, job, iter(items), deliver, deadline_end, earlier=earlier)
        finished = False
        try:
            run.start()
            finished = self._drain(run)
        except BaseException:
            self.stop()
            finished = self._drain(run)
            raise
        finally:
            run.shutdown(wait=finished)
        # A worker ended by what no item may catch (SystemExit from a callable, say): the run
        # cannot give every item its Result, so it says so rather than return fewer.
        escaped = [exc for w in run.workers if w.done() and (exc := w.exception()) is not None]
        failures = [*run.failures, *escaped]
        if failures:
            raise failures[0]
        return finished

    def _drain(self, run: _Run) -> bool:
        """Wait until every worker has run out of items. After a stop, attempts in flight get
        the grace; then ``abort`` cuts them (their items end as ``cancelled``) and they get a
        moment more. False if some are still running."""
        aborted_at: float | None = None
        # (a timed wait keeps the main thread responsive to Ctrl-C; a worker starts the next
        # before it ends, so none running means none will)
        while not run.all_ended.wait(_POLL_SECONDS):
            if not self._stop.is_set() or self._clock() - self._stopped_at < self._grace:
                continue
            if self._abort is not None and aborted_at is None:
                self._abort()
                aborted_at = self._clock()
            elif aborted_at is None or self._clock() - aborted_at >= ABORT_GRACE_SECONDS:
                return False
        return True

    def run_one(self, job: Job, item: object) -> Result:
        """One item carried to its final Result in the calling thread (no pool, no stop)."""
        deadline = self.options.deadline
        deadline_end = None if deadline is None else self._clock() + deadline
        ((result, _), *_) = self.carry(job, 0, item, deadline_end)
        self._report(result)
        return result

    def _report(self, result: Result) -> None:
        """An item's final Result, logged when it failed and shown to the observers."""
        if not result.ok and log.isEnabledFor(logging.INFO):
            url, attempts = result.url, result.attempt_log
            logged = (url, result.attempts, result.status_code, result.error_kind, None)
            described = f" [{describe_attempts(attempts)}]" if attempts else ""
            log.info("failed %s: %s%s", url, result.error, described,
                     extra=dict(zip(_LOGGED, logged, strict=True)))  # fmt: skip
        if self.observers.sees_item_finished:
            self.observers.item_finished(result)

    def carry(
        self,
        job: Job,
        index: int,
        item: object,
        deadline_end: float | None,
        *,
        going: Callable[[], None] | None = None,
        earlier: Result | None = None,
    ) -> list[tuple[Result, object]]:
        """Claim to final Result: the item's Result, then one for each identical item that
        waited on it; nothing when the item itself waits on an identical one. Never raises.
        ``going``: called when the item gets going (see ``_Run.work``), or parks on its twin;
        ``earlier``: its Result from an earlier pass (a retry pass sends it again)."""
        claimed = self._clock()
        try:
            task = self._prepare(job, index, item, claimed, deadline_end)
            if isinstance(task, Result):
                return [(task, item)]
        except Exception as exc:  # a bug must not cost the item its Result
            return [(self._internal_error(job, index, item, exc), item)]
        key = task.dedup_key
        if key is not None and self._parked(
            key, _Copy(index, item, task.url, task.id, claimed), going
        ):
            return []
        if self.observers.sees_item_started:
            self.observers.item_started(index, task)
        try:
            result = self._attempts(
                job, task, index, claimed, deadline_end, going=going, earlier=earlier
            )
        except Exception as exc:
            result = self._internal_error(job, index, item, exc)
        finally:
            copies = self._flights.land(key) if key is not None else []
        if not copies:
            return [(result, item)]
        return [(result, item), *((self._copy(result, copy), copy.item) for copy in copies)]

    def _parked(self, key: Hashable, copy: _Copy, going: Callable[[], None] | None) -> bool:
        """Whether the item waits on an identical request in flight, whose Result will be its
        too; then another worker takes the next item (``going``)."""
        if not self._flights.join(key, copy):
            return False
        if going is not None:
            going()
        return True

    def _internal_error(self, job: Job, index: int, item: object, exc: Exception) -> Result:
        log.exception("internal error on item %d", index)
        # (the kind only: the message could hold anything the item held)
        return self._failure(job, index, item, "exception", f"internal error: {type(exc).__name__}")

    def _failure(self, job: Job, index: int, item: object, kind: ErrorKind, error: str) -> Result:
        """A failed Result that no attempt of the item made: its kind and error line only."""
        url, id_ = job.label(item)
        return Result(index, url, False, id_, error_kind=kind, error=error, finished=time.time())

    def _copy(self, result: Result, copy: _Copy) -> Result:
        """The Result of an item that shared an identical item's request: none of its own."""
        elapsed, finished = self._clock() - copy.claimed, time.time()
        return replace(result, index=copy.index, url=copy.url, id=copy.id, attempts=0,
                       attempt_log=(), elapsed=elapsed, finished=finished)  # fmt: skip

    def _prepare(
        self, job: Job, index: int, item: object, claimed: float, deadline_end: float | None
    ) -> Task | Result:
        """The item's Task, or the Result of an item that is not to be sent at all."""
        if deadline_end is not None and claimed >= deadline_end:
            return self._failure(job, index, item, "deadline", unstarted_reason("deadline"))
        if self._stop.is_set():
            return self._failure(job, index, item, "cancelled", unstarted_reason("cancelled"))
        try:
            return job.prepare(item)
        except InvalidItem as exc:
            invalid = self._failure(job, index, item, exc.kind, str(exc))
            return replace(invalid, elapsed=self._clock() - claimed)

    def _attempts(
        self,
        job: Job,
        task: Task,
        index: int,
        claimed: float,
        deadline_end: float | None,
        *,
        going: Callable[[], None] | None,
        earlier: Result | None,
    ) -> Result:
        """The item's final Result (``_routes``); in a retry pass, with its ``earlier`` Result
        known to the requests its attempts send beside their own (``ATTEMPT_EARLIER``: a
        hedge's is judged as the attempt is)."""
        allowance = Allowance(claimed + self.options.budget, deadline_end)
        item = _Carried(job, task, index, claimed, allowance, going=going, earlier=earlier)
        # (most items; none known in the thread either: one started by another item's
        # attempt may hold that item's: a free-threaded 3.14 copies the starter's context)
        if earlier is None and ATTEMPT_EARLIER.get() is None:
            return self._routes(item)
        known = ATTEMPT_EARLIER.set(earlier)
        try:
            return self._routes(item)
        finally:
            ATTEMPT_EARLIER.reset(known)

    def _routes(self, item: _Carried) -> Result:
        """The item's route, then its fallbacks while they are allowed, to a final Result."""
        task = item.task
        errors: list[str] = []
        so_far: Result | None = None
        # Each route with its number as a fallback (None for the item's own).
        numbers = chain((None,), count())
        for fallback, route in zip(numbers, (task.route, *task.fallbacks), strict=False):
            verdict, error, steps = self._route(item, route, fallback, so_far)
            if verdict.outcome == "success":
                return self._result(item, verdict, None, fallback, steps)
            # A step that failed ends the item with what the steps before it gave (a first
            # one that failed is the item's own route failing, as without steps).
            if steps is not None and steps.done:
                return self._result(item, verdict, error, fallback, steps)
            errors.append(error if fallback is None else f"fallback {fallback}: {error}")
            so_far = self._result(item, verdict, "; ".join(errors), None, steps)
            if not may_fall_back(verdict, primary=fallback is None):
                break
        assert so_far is not None
        return so_far

    def _result(
        self,
        item: _Carried,
        verdict: Verdict,
        error: str | None,
        fallback: int | None,
        steps: Steps | None = None,
    ) -> Result:
        """The item's Result as its attempts so far leave it."""
        going_on = steps is not None and steps.done > 0 and not verdict.ok
        return result_of(
            index=item.index,
            url=item.task.url,
            id=item.task.id,
            verdict=verdict,
            error=error,
            data=verdict.data if steps is None else steps.data,
            records=item.records,
            elapsed=self._clock() - item.claimed,
            finished=time.time(),  # (wall-clock time, for the report's charts)
            fallback_used=fallback,
            pages=None if steps is None else steps.done,
            continuation=steps.continuation if going_on and steps else None,
        )

    def _route(
        self, item: _Carried, route: Route, fallback: int | None, so_far: Result | None
    ) -> tuple[Verdict, str, Steps | None]:
        """A route followed to its end: its last Verdict and error line, and for an item made
        of steps (pages) how far they came (None for any other). Each step is a route of its
        own (its own retries, the item's budget); after a stop no next step starts: the item
        ends ``cancelled``, to go on from there."""
        verdict, error = self._follow(item, route, fallback, so_far)
        if route.then is None:  # (an item of one request)
            return verdict, error, None
        steps = Steps(item.task.steps or 0, item.task.data, route.continuation)
        while verdict.ok and route.then is not None:
            steps.data, following = route.then(verdict)
            steps.done += 1
            if following is None:
                break
            if isinstance(following, Verdict):  # the item cannot go on: it ends with this
                steps.continuation = None
                return following, following.error or "", steps
            route = following
            steps.continuation = route.continuation
            if self._stop.is_set():
                stopped, reason = self._stopped_short(None, "cancelled", route)
                return stopped, reason, steps
            verdict, error = self._follow(item, route, fallback, so_far)
        return verdict, error, steps

    def _follow(
        self, item: _Carried, route: Route, fallback: int | None, so_far: Result | None
    ) -> tuple[Verdict, str]:
        """Attempts on one route until success, a final failure or no retries left: the last
        Verdict (outcome ``retry`` only when the retries ran out) and the route's error line."""
        attempts = self.options.attempts
        max_attempts = min(attempts, route.max_attempts or attempts)
        number = 0
        last: Verdict | None = None
        while True:
            admission = self._enter(item, route, last)
            if isinstance(admission, tuple):  # (the route ends before this attempt)
                return admission
            verdict, began, ended = self._sent(item, route, so_far, admission)
            number += 1
            if verdict.outcome == "success":  # (nothing to decide: the route's answer)
                decision = Decision(verdict, error=verdict.error or "")
            else:
                attempted = Attempted(number, max_attempts, attempts, ended, route.no_retry_reason)
                decision = decide(
                    verdict, attempted, self.options.backoff, self._rand(), item.allowance
                )
            last = decision.verdict
            # The attempt's record, kept in the item's log and shown to the observers.
            status, took = answer_of(last).status_code, ended - began
            record = AttemptRecord(len(item.records) + 1, status, last.error_kind, took,
                                   decision.wait, fallback, last.hedged, last.resent,
                                   *_priced(admission))  # fmt: skip
            item.records.append(record)
            if self.observers.sees_attempt_finished:
                self.observers.attempt_finished(item.index, item.task, record)
            if decision.wait is None:
                return last, decision.error
            _log_retry(item.task.url, last, number, max_attempts, decision.wait)
            if self._time.wait(self._stop, decision.wait):
                return replace(last, outcome="terminal", error_kind="cancelled"), (
                    f"{last.error} after {plural(number)}; stopped while waiting to retry"
                )

    def _enter(
        self, item: _Carried, route: Route, last: Verdict | None
    ) -> Admission | tuple[Verdict, str] | None:
        """The place the route's next attempt holds at the limits (None: not gated), or its
        last Verdict and error line when the budget, the deadline or a limit ends it first."""
        left, nearest = item.allowance.tightest(self._clock())
        if left <= 0:
            return self._stopped_short(last, nearest, route)
        if self._gates is None or not route.gated:
            item.go()
            return None
        task = item.task
        admitted = self._gates.enter(
            route.host or GLOBAL,
            item.allowance,
            self._stop,
            task.cost,
            price=task.price,
            sides=task.sides,
            going=item.go if item.going is not None else None,
        )
        if isinstance(admitted, Refusal):
            return self._stopped_short(last, admitted.kind, route, admitted.why)
        if not admitted.held_back:
            item.go()
        return admitted

    def _sent(
        self, item: _Carried, route: Route, so_far: Result | None, admission: Admission | None
    ) -> tuple[Verdict, float, float]:
        """One attempt, bounded by the job's timeout within the item's allowance and told to
        the limits, with when it began and ended; a bug in it is its final failure."""
        if self.observers.sees_attempt_started:
            self.observers.attempt_started(item.index)
        began = self._clock()
        if admission is not None:
            admission.sent = began
        timeout = item.job.timeout
        wall_end, limit = (
            (None, None) if timeout is None else item.allowance.attempt_end(timeout, began)
        )
        try:
            verdict = route.attempt(wall_end, so_far)
        except Exception as exc:
            log.exception("internal error in an attempt of %s", item.task.url)
            verdict = Verdict("terminal", "exception", f"internal error: {type(exc).__name__}")
        except BaseException:
            if admission is not None and self._gates is not None:
                self._gates.abandon(admission)
            raise
        ended = self._clock()
        if limit is not None:
            # (a timeout the budget cut short says nothing of the host: its limits see that)
            verdict = cut_short(verdict, limit)
        if admission is not None:
            self._release(admission, item, verdict)
        return verdict, began, ended

    def _release(self, admission: Admission, item: _Carried, verdict: Verdict) -> None:
        """Tell the limits what an attempt came to (``Gates.release`` keeps each gate's failure
        to itself). Whatever reading the answer for them raises, the attempt stays counted and
        its answer kept; the limits get back what they held, and learn nothing from it. The
        failure an item had in an earlier pass, repeated, is not the breaker's (``repeats``)."""
        if self._gates is None:
            return
        try:
            feedback = item.job.feedback(verdict)
            if item.earlier is not None:  # (most attempts: no call more)
                feedback = for_the_limits(feedback, verdict, item.earlier)
        except Exception as exc:
            log.warning(
                "the limits could not read an answer of %s: %s", item.task.url, type(exc).__name__
            )
            log.debug("the limits' failure", exc_info=True)
            with contextlib.suppress(Exception):
                self._gates.abandon(admission)
            return
        self._gates.release(admission, feedback)

    @staticmethod
    def _stopped_short(
        last: Verdict | None, kind: ErrorKind, route: Route, why: str | None = None
    ) -> tuple[Verdict, str]:
        """A route ended before its next attempt was sent: by a limit, a stop or an open
        circuit; ``why``, when a gate said more than the kind does."""
        reason = why or stopped_reason(kind, route.host)
        if last is None:
            return Verdict("terminal", kind, reason), reason
        return replace(last, outcome="terminal", error_kind=kind), f"{last.error}; {reason}"


@dataclass(slots=True)
class Steps:
    """How far an item made of steps has come: steps done, the data they gave, and where it
    would start again."""

    done: int
    data: Any
    continuation: Any
