"""Every core of one machine (``processes=``, ``--processes N|auto``): the items sent from N
worker processes, each the normal engine (its own thread pool, transport and gates) over the
items this process hands it, with a fixed share of every limit (``limits.shares``) or, with a
shared backend (``limits=``, ``--redis``), the backend's limits whole.

This process stays the run's only writer: it reads the input, hands each worker a few chunks
of (index, item) pairs at a time, and takes each Result back through the cluster lane's
``Send`` (``cluster.distributed``), so the journal, resume, retry, progress and report are
those of every other run. A worker lives for the whole run (its gates keep their windows and
its connections stay open); a worker that dies has its unanswered items handed to the others
(a SIGKILL loses nothing); a stop tells each worker to stop its engine. Workers are started
with "spawn", never forked from a process that has threads.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from ..core.engine import Deliver, Earlier
from ..core.redact import RedactingFilter
from ..core.result import Result, judged_by
from ..jobs.options import CallOptions, FetchOptions, FlowOptions
from ..limits.gates import Gates
from ..limits.rates import parse_rate
from ..limits.shares import cores, process_count, split, split_rate, split_token_rate
from .assembly import Ran, Stoppable, fetch, run_calls
from .controller import Send
from .distribute import Wrap, distributed
from .plan import Cluster

if TYPE_CHECKING:
    from ..contrib.dask import Partition

log = logging.getLogger("batchsync")

OptionsT = TypeVar("OptionsT", FetchOptions, CallOptions)
FlowT = TypeVar("FlowT", bound=FlowOptions)

# The options that are observed or called where the attempts run: a worker process cannot
# give them to this one's (hooks, a metrics registry, a tracer, the provider's announced
# rates and the spend cap, which a journal written here keeps).
_REFUSED = {
    "on_attempt": "a hook runs where the attempts do: read the Results as they come "
    "(fetch_iter, run_iter) instead",
    "on_result": "a hook runs where the attempts do: read the Results as they come "
    "(fetch_iter, run_iter) instead",
    "metrics": "each process would count apart: give one process, or scrape each run",
    "tracer": "spans would be made in other processes",
    "max_cost": "the spend cap is kept in the journal this process writes: give one process",
}
# Seconds a worker's engine waits for its next item before it looks for a stop again.
_POLL_SECONDS = 0.05
# Results a worker sends back in one message at most.
_BATCH = 256
# Seconds a stopped worker gets to end on its own before it is killed (the engine's grace,
# then its abort, come first).
_END_SECONDS = 30.0


def process_options(options: OptionsT) -> list[OptionsT]:
    """The options of each worker process: its share of the concurrency and of every limit
    that no shared backend holds; one entry: the run is sent from this process. ValueError,
    before anything is sent, for what cannot be held across processes or sent to them."""
    limits = _whole_limits(options)
    count = process_count(options.processes, limits=list(limits.values()), cpus=cores())
    if count == 1:
        return [options]
    if options.processes != "auto" and count < int(options.processes):
        given = ", ".join(f"{name} {value:g}" for name, value in limits.items())
        log.warning(
            "processes=%s: every process needs at least one of each of %s: %d processes",
            options.processes, given, count,
        )  # fmt: skip
    for name, why in _REFUSED.items():
        if getattr(options, name, None) is not None:
            raise ValueError(f"processes={options.processes!r} with {name}: {why}")
    if options.rate == "auto":
        raise ValueError(
            f"processes={options.processes!r} with rate='auto': the provider announces one "
            "budget, which processes apart would each spend: give the rate itself"
        )
    shares = [_share(options, index, count) for index in range(count)]
    _check_pickles(shares[0])
    return shares


def _whole_limits(options: FlowOptions) -> dict[str, float]:
    """The limits each process needs at least one of, by name: the concurrency, and the slots,
    rates and token budgets no shared backend holds."""
    limits: dict[str, float] = {"concurrency": options.concurrency}
    if options.limits is not None:
        return limits
    if options.slots is not None:
        limits["per_host"] = options.slots
    if options.rate is not None and options.rate != "auto":
        limits["rate"] = parse_rate(options.rate).count
    for name in ("token_rate", "input_token_rate", "output_token_rate"):
        budget = getattr(options, name)
        if budget is not None:
            limits[name] = budget.rate.count
    return limits


def _share(options: OptionsT, index: int, count: int) -> OptionsT:
    """The options of worker ``index`` of ``count``."""
    update: dict[str, Any] = {
        "processes": 1,
        "concurrency": split(options.concurrency, count)[index],
    }
    if options.limits is not None:  # (the backend holds every limit whole: by its URL)
        update["limits"] = getattr(options.limits, "url", options.limits)
    else:
        if options.rate is not None:
            update["rate"] = str(split_rate(parse_rate(options.rate), count)[index])
        for name in ("token_rate", "input_token_rate", "output_token_rate"):
            budget = getattr(options, name)
            if budget is not None:
                update[name] = split_token_rate(budget, count)[index]
        if options.slots is not None:
            update["per_host"] = split(options.slots, count)[index]
    return options.model_copy(update=update)


def _check_pickles(options: FlowOptions) -> None:
    """ValueError naming the first option given that cannot be sent to a worker process."""
    for name in sorted(options.model_fields_set):
        try:
            pickle.dumps(getattr(options, name))
        except Exception as exc:
            raise ValueError(
                f"processes={options.processes!r}: {name} cannot be sent to the worker "
                f"processes ({exc}); give it as a module's function or class, or one process"
            ) from None


def check_callable(fn: Callable[..., Any]) -> None:
    """ValueError when ``fn`` cannot be called in a worker process (started by spawn, which
    imports it by name): a lambda, a closure, a function of an interactive session."""
    module = getattr(fn, "__module__", None)
    main = sys.modules.get("__main__")
    if module == "__main__" and getattr(main, "__file__", None) is None:
        raise ValueError(
            f"processes=: {getattr(fn, '__name__', fn)!r} is defined in an interactive "
            "session, which a worker process cannot import: define it in a module"
        )
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise ValueError(
            f"processes=: {getattr(fn, '__name__', fn)!r} cannot be sent to the worker "
            f"processes ({exc}): define it at the top level of a module"
        ) from None


class Runner(Protocol):
    """What a worker process runs (sent there pickled): the engine over the items it is
    handed, from ``started`` (this run's start, for the deadline)."""

    @property
    def concurrency(self) -> int: ...

    def __call__(
        self,
        items: Iterable[tuple[int, object]],
        deliver: Deliver,
        on_start: Callable[[Stoppable], None],
        started: float,
        earlier: Earlier,
    ) -> Ran: ...


def _left_of(options: FlowT, started: float) -> FlowT:
    """``options`` with the batch deadline counted from ``started``, not from the worker's
    own start."""
    if options.deadline is None:
        return options
    left = options.deadline - (time.time() - started)
    return options.model_copy(update={"deadline": max(left, 1e-3)})


@dataclass(frozen=True)
class InWorker:
    """A worker's run over the items it is handed: ``send`` (``assembly.fetch``, or
    ``run_calls`` with its function bound: see ``fetch_in_worker``, ``calls_in_worker``) with
    the worker's share of the options."""

    options: FlowOptions
    send: Callable[..., Ran]

    @property
    def concurrency(self) -> int:
        return self.options.concurrency

    def __call__(
        self,
        items: Iterable[tuple[int, object]],
        deliver: Deliver,
        on_start: Callable[[Stoppable], None],
        started: float,
        earlier: Earlier,
    ) -> Ran:
        options = _left_of(self.options, started)
        return self.send(
            options, items, deliver, observed=False, on_start=on_start, earlier=earlier
        )


def fetch_in_worker(options: FetchOptions, wrap: Wrap | None = None) -> InWorker:
    """A worker's HTTP run (``wrap`` as in ``cluster.run_partition``)."""
    return InWorker(options, partial(fetch, wrap=wrap))


def calls_in_worker(options: CallOptions, fn: Callable[[Any], Any]) -> InWorker:
    """A worker's run of calls of ``fn``."""
    return InWorker(options, partial(_calls, fn=fn))


def _calls(
    options: CallOptions,
    items: Iterable[tuple[int, object]],
    deliver: Deliver,
    *,
    fn: Callable[[Any], Any],
    **flags: Any,
) -> Ran:
    return run_calls(options, fn, items, deliver, **flags)


def on_processes(runners: Sequence[Runner], on_start: Callable[[Stoppable], None]) -> Send:
    """What sends a run's items to worker processes, one per runner (``controller.Send``)."""
    chunk = max(1, min(runner.concurrency for runner in runners) // 4)
    return distributed(
        lambda gates, earlier: Workers(runners, gates=gates, earlier=earlier), chunk, on_start
    )


def fetch_processes(options: FetchOptions) -> Cluster | None:
    """What makes the Send of an HTTP run's worker processes (``plan.Cluster``); None when
    the run has one process."""
    shares = process_options(options)
    if len(shares) == 1:
        return None

    def make(wrap: Wrap | None, on_start: Callable[[Stoppable], None]) -> Send:
        return on_processes([fetch_in_worker(share, wrap) for share in shares], on_start)

    return make


class WorkersLost(OSError):
    """Every worker process ended before the run did: what finished is journaled, the rest is
    for a resume."""


# --- the worker process ---

_END = None  # (the inbox's last entry: the run has no more items)


def _worker_main(
    runner: Runner, tasks: Connection, answers: Connection, started: float, level: int
) -> None:
    """A worker process: run ``runner`` over the items ``tasks`` brings, send each Result
    back through ``answers`` (a few at a time), then how the run ended. Ctrl-C is this
    process's parent's to handle: it says stop through ``tasks``, or closes it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _log_here(level)
    side = _WorkerSide(tasks, answers)
    threading.Thread(target=side.read, daemon=True, name="batchsync-tasks").start()
    sender = threading.Thread(target=side.send, daemon=True, name="batchsync-answers")
    sender.start()
    try:
        try:
            ran = runner(side.items(), side.deliver, side.started, started, side.earlier)
        finally:
            side.outbox.put(None)
            sender.join()
        answers.send(("ran", ran))
    except BaseException as exc:
        with contextlib.suppress(Exception):
            answers.send(("failed", _travelling(exc)))
    finally:
        sys.stderr.flush()
        os._exit(0)  # (threads of attempts abandoned in flight are not waited for)


class _WorkerSide:
    """A worker process's ends of its pipes: the items it is handed, queued for its engine's
    workers to claim with the earlier Results some came with, and its Results, queued for the
    thread that sends them back."""

    def __init__(self, tasks: Connection, answers: Connection) -> None:
        self._tasks, self._answers = tasks, answers
        self._inbox: queue.SimpleQueue[tuple[int, object] | None] = queue.SimpleQueue()
        self._earlier: dict[int, Result] = {}
        self.outbox: queue.SimpleQueue[Result | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._engines: list[Stoppable] = []

    def stop(self) -> None:
        self._stop.set()
        for engine in list(self._engines):
            engine.stop()

    def started(self, engine: Stoppable) -> None:
        self._engines.append(engine)
        if self._stop.is_set():
            engine.stop()

    def read(self) -> None:
        """What the parent says: items, the end of them, or stop."""
        try:
            while True:
                kind, payload = self._tasks.recv()
                if kind == "items":
                    pairs, earlier = payload
                    self._earlier.update(earlier)
                    for pair in pairs:
                        self._inbox.put(pair)
                elif kind == "end":
                    self._inbox.put(_END)
                else:
                    self.stop()
        except (EOFError, OSError):  # the parent is gone: nobody to send to
            self.stop()

    def items(self) -> Iterator[tuple[int, object]]:
        """The items handed to this worker, as its engine claims them, until the end."""
        while not self._stop.is_set():
            try:
                pair = self._inbox.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            if pair is _END:
                return
            yield pair

    def earlier(self, index: int) -> Result | None:
        """An item's Result from an earlier pass, as the parent handed it on (see ``Workers``)."""
        return self._earlier.get(index)

    def deliver(self, result: Result, item: object) -> None:
        self._earlier.pop(result.index, None)
        self.outbox.put(result)

    def send(self) -> None:
        """The Results, sent back as many at once as are ready (at most ``_BATCH``), until
        the None that ends them."""
        done = False
        while not done:
            first = self.outbox.get()
            batch = [] if first is None else [first]
            done = first is None
            while not done and len(batch) < _BATCH:
                try:
                    more = self.outbox.get_nowait()
                except queue.Empty:
                    break
                done = more is None
                batch.extend(() if more is None else (more,))
            try:
                if batch:
                    self._answers.send(("results", batch))
            except OSError:  # (the parent is gone)
                return


def _travelling(exc: BaseException) -> BaseException:
    """``exc``, or a RuntimeError saying it, when it cannot be pickled."""
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _log_here(level: int) -> None:
    """A worker's log lines on stderr, at its parent's level, masked as its parent's are."""
    logger = logging.getLogger("batchsync")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(RedactingFilter())
    logger.addHandler(handler)
    logger.setLevel(level)


# --- this process ---


@dataclass
class _Worker:
    """One worker process as this one sees it: its pipes, and the items handed to it that
    have no Result yet (by index)."""

    process: Any
    tasks: Connection
    answers: Connection
    ahead: int
    given: dict[int, object] = field(default_factory=dict)
    ran: Ran | None = None
    told: set[str] = field(default_factory=set)  # ("stop", "end": each said once)

    def tell(self, message: tuple[str, object]) -> bool:
        """Send ``message``; False when the worker is gone."""
        try:
            self.tasks.send(message)
        except (OSError, ValueError):
            return False
        return True


def _tell_each(live: list[_Worker], what: Literal["stop", "end"]) -> None:
    """Tell each worker ``what`` (once)."""
    for worker in live:
        if what not in worker.told and worker.tell((what, None)):
            worker.told.add(what)


class Workers:
    """Worker processes for one run (a ``cluster.Distributing``): each kept ``ahead`` items
    (twice its concurrency), handed chunks as its Results come back; ``stop()`` asks each to
    stop its engine. A worker that dies has its unanswered items handed to the others;
    WorkersLost when none is left to take them; a worker's failure is raised once every
    worker has stopped. The items of a retry pass go with what the breaker needs of their
    ``earlier`` Results (``judged_by``), so that each worker judges its hosts as one process
    would."""

    def __init__(
        self,
        runners: Sequence[Runner],
        *,
        gates: Gates | None = None,
        earlier: Earlier | None = None,
    ) -> None:
        self._runners = list(runners)
        self._gates = gates
        self._earlier = earlier
        self._stop = threading.Event()
        self._abandoned = False
        self._failed: BaseException | None = None
        # The run's input, what dead workers left unanswered, and whether the input is read.
        self._source: Iterator[Partition] = iter(())
        self._redo: deque[Partition] = deque()
        self._exhausted = False

    def stop(self) -> None:
        self._stop.set()  # (the loop tells the workers: a signal handler sends nothing)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def abandoned(self) -> bool:
        return self._abandoned

    def run(self, work: Iterable[Partition]) -> Iterator[tuple[Partition, list[Result]]]:
        self._source = iter(work)
        live = [self._start(runner) for runner in self._runners]
        log.info("sending from %d worker processes", len(live))
        try:
            while live:
                if self._stop.is_set():
                    _tell_each(live, "stop")
                else:
                    self._hand_out(live)
                yield from self._answers(live)
        finally:
            self._close(live)
        if self._failed is not None:
            raise self._failed
        if not self._stop.is_set() and (self._redo or not self._exhausted):
            raise WorkersLost(
                "every worker process ended before the run did: what finished is journaled; "
                "--resume (or run() again) sends the rest"
            )

    def _answers(self, live: list[_Worker]) -> Iterator[tuple[Partition, list[Result]]]:
        """What the workers sent within a tenth of a second, and the ends of those that ended."""
        ready = set(wait([w.answers for w in live] + [w.process.sentinel for w in live], 0.1))
        for worker in list(live):
            if worker.answers in ready:
                yield from self._read(worker)
            if worker.process.sentinel in ready:
                yield from self._ended(worker, live)

    def _start(self, runner: Runner) -> _Worker:
        context = multiprocessing.get_context("spawn")
        tasks_out, tasks_in = context.Pipe(duplex=False)
        answers_out, answers_in = context.Pipe(duplex=False)
        level = logging.getLogger("batchsync").getEffectiveLevel()
        process = context.Process(
            target=_worker_main,
            args=(runner, tasks_out, answers_in, time.time(), level),
            daemon=True,
            name="batchsync-worker",
        )
        process.start()
        tasks_out.close()  # (this process's copies: a worker's end closes its pipes)
        answers_in.close()
        return _Worker(process, tasks_in, answers_out, 2 * runner.concurrency)

    def _hand_out(self, live: list[_Worker]) -> None:
        """Give each worker chunks until it holds ``ahead`` items; once the input is read and
        no worker holds any, tell each the run has no more."""
        for worker in sorted(live, key=lambda w: len(w.given)):
            while len(worker.given) < worker.ahead and (chunk := self._next_chunk()):
                worker.given.update(chunk)
                if not worker.tell(("items", (chunk, self._earlier_of(chunk)))):
                    break  # (its items are handed on once its end is seen)
        if self._exhausted and not self._redo and not any(w.given for w in live):
            _tell_each(live, "end")

    def _earlier_of(self, chunk: Partition) -> dict[int, Result]:
        """What the breaker needs of the earlier Results of ``chunk``'s items that have one."""
        earlier = self._earlier
        if earlier is None:
            return {}
        return {index: judged_by(r) for index, _ in chunk if (r := earlier(index)) is not None}

    def _next_chunk(self) -> Partition | None:
        """A dead worker's unanswered items first, then the input's next chunk."""
        if self._redo:
            return self._redo.popleft()
        chunk = None if self._exhausted else next(self._source, None)
        self._exhausted = chunk is None
        return chunk

    def _read(self, worker: _Worker) -> Iterator[tuple[Partition, list[Result]]]:
        """What ``worker`` has sent, as long as a whole message is there."""
        while True:
            try:
                if not worker.answers.poll():
                    return
                kind, payload = worker.answers.recv()
            except (EOFError, OSError):  # (the end of a worker killed in the middle of one)
                return
            if kind == "results":
                results = [r for r in payload if r.index in worker.given]
                yield [(r.index, worker.given.pop(r.index)) for r in results], results
            elif kind == "ran":
                worker.ran = payload
            else:
                self._failed = self._failed or payload
                self._stop.set()

    def _ended(
        self, worker: _Worker, live: list[_Worker]
    ) -> Iterator[tuple[Partition, list[Result]]]:
        """A worker's end: what it had sent taken, its unanswered items handed on."""
        yield from self._read(worker)
        worker.process.join()
        live.remove(worker)
        worker.tasks.close()
        worker.answers.close()
        if worker.ran is not None:
            self._abandoned = self._abandoned or worker.ran.abandoned
            self._count_waits(worker.ran)
        if worker.given and not self._stop.is_set():
            log.warning(
                "a worker process (pid %s) ended with exit code %s: its %d items without a "
                "result go to the others",
                worker.process.pid, worker.process.exitcode, len(worker.given),
            )  # fmt: skip
            self._redo.appendleft(list(worker.given.items()))
        worker.given.clear()

    def _count_waits(self, ran: Ran) -> None:
        """A worker's waits at its gates, added to the run's (its summary and report)."""
        if self._gates is None:
            return
        waits = self._gates.waits
        with waits.lock:
            for gate, seconds in ran.waits.items():
                waits.seconds[gate] = waits.seconds.get(gate, 0.0) + seconds
            for key, seconds in ran.timeline.items():
                waits.timeline[key] = waits.timeline.get(key, 0.0) + seconds

    def _close(self, live: list[_Worker]) -> None:
        """Every worker still running told to stop, given the time to, then ended."""
        for worker in live:
            worker.tell(("stop", None))
        give_up = time.monotonic() + _END_SECONDS
        for worker in live:
            worker.process.join(max(0.0, give_up - time.monotonic()))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.tasks.close()
            worker.answers.close()
