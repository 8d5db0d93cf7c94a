"""The journal's writer: every final Result persisted as soon as it exists, so that a crash
loses nothing done, and the lock that keeps a second run out of the same journal.

An SQLite file in WAL mode with one writer thread. Workers only enqueue; the writer commits
whatever has queued up in one transaction (a group commit; in a busy run, every 20 ms), so
the cost per item stays small while a SIGKILL loses at most the items still in flight and
the last few milliseconds. Anything the writer cannot store fails the run (``JournalFailed``)
rather than losing a Result quietly.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from ...core.clock import SYSTEM, Clock, clock_of
from ...core.history import Pass, Stint
from ...core.result import Result, kept
from .schema import JournalFailed, JournalInUse, connect, create, meta_rows

_BATCH_ROWS = 5000
# Results waiting for the writer at most (besides the group it is storing): beyond that,
# workers wait (back-pressure), so a run whose results come faster than SQLite commits them
# does not grow without bound.
QUEUE_ROWS = 5000
# How often a worker waiting for room in the queue checks that the writer is still alive.
_PUT_POLL_SECONDS = 0.1
# From this many results a second, the writer lets results gather for _LINGER_SECONDS before
# each commit: a writer that keeps up would otherwise commit every result or two, and
# thousands of small commits a second cost a busy run more than a tenth of its speed. Slower
# runs commit each result as soon as the writer sees it.
BUSY_RESULTS_PER_SECOND = 1000
_LINGER_SECONDS = 0.02

Row = tuple[
    int, int, str | None, int | None, int, float, float, str, str | None, str | None, float, int
]
# Turns (Result, the item it is for) into the stored result JSON and failed-request JSON.
Encode = Callable[[Result, object], tuple[str, str | None]]


def linger_for(results: int, seconds: float) -> float:
    """How long the writer lets results gather before each commit, after ``results`` came
    in the last ``seconds``."""
    return _LINGER_SECONDS if results >= BUSY_RESULTS_PER_SECOND * seconds else 0.0


def lock_path(path: Path) -> Path:
    return Path(f"{path}.lock")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the journal's lock file for the block: JournalInUse when another run holds it.

    An exclusive ``flock``, released by the kernel when the process dies, so a killed run
    never leaves a stale lock. Creating the lock file also proves the folder writable (an
    OSError otherwise). The file stays: deleting it would let two runs lock different files.
    """
    descriptor = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalInUse(f"the journal {path} is in use by another run") from None
        yield
    finally:
        os.close(descriptor)


class Journal:
    """Stores each final Result from any thread; see the module docstring.

    ``encode(result, item)`` runs on the writer thread. ``meta`` (the input's identity) is
    recorded before anything else, with the schema version, and ``passing``, the pass the
    Results belong to (recorded when given: a run that sends nothing records no pass).
    ``progress`` says what this process has done so far: recorded as its row of ``runs``
    with every group of Results (so a process killed at any moment still counts), and once
    more by ``close``. ``committed`` is told each Result once it is committed (on the writer
    thread): what is handed on from there is on disk.
    Workers wait while ``QUEUE_ROWS`` Results are queued; once the writer has failed, ``add``
    and ``close`` raise JournalFailed.
    """

    def __init__(
        self,
        path: Path,
        encode: Encode,
        meta: Mapping[str, str],
        *,
        passing: Pass | None = None,
        progress: Callable[[], Stint] | None = None,
        clock: Clock | Callable[[], float] = SYSTEM,
        sleep: Callable[[float], None] | None = None,
        committed: Callable[[Result], None] | None = None,
    ) -> None:
        self.path = path
        self._encode = encode
        self._committed = committed
        # The writer's clock (to measure the pace of results) and its linger (the clock's
        # own sleep unless given): tests pass their own, so that what they check does not
        # depend on the machine's speed.
        measured = clock_of(clock)
        self._clock = measured.now
        self._sleep = measured.sleep if sleep is None else sleep
        if not path.exists():
            create(path, meta)
        self._db = connect(path)
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta_rows(meta))
            if passing is not None:
                retry = None if passing.retry is None else json.dumps(sorted(passing.retry))
                self._db.execute(
                    "INSERT OR IGNORE INTO passes VALUES (?, ?)", (passing.number, retry)
                )
            self._progress = None if passing is None else progress
            self._run_row: int | None = None
            if self._progress is not None:
                stint = self._progress()
                self._run_row = self._db.execute(
                    "INSERT INTO runs VALUES (?, ?, 0, 0, 0, '{}', 0)",
                    (stint.passing.number, stint.started),
                ).lastrowid
        self._pass_number = 1 if passing is None else passing.number
        self._queue: queue.SimpleQueue[tuple[Result, object] | None] = queue.SimpleQueue()
        # Room in the queue: each add takes a place, and the writer gives back what it took
        # once per group (a bounded queue.Queue, waking a worker on every get, cut the
        # journal's pace by a quarter).
        self._room = threading.Semaphore(QUEUE_ROWS)
        self._error: BaseException | None = None
        self._closed = False
        self._writer = threading.Thread(target=self._write, name="batchsync-journal", daemon=True)
        self._writer.start()

    def add(self, result: Result, item: object) -> None:
        """Queue a final Result, waiting while the queue is full; raises JournalFailed once the
        writer has failed (the disk is full, a Result cannot be encoded, ...)."""
        while not self._closed:
            if self._error is not None:
                raise self._failure()
            # With a timeout: a writer that dies meanwhile must not hold this worker forever.
            if self._room.acquire(timeout=_PUT_POLL_SECONDS):
                self._queue.put((result, item))
                return

    def _failure(self) -> JournalFailed:
        reason = str(self._error) or type(self._error).__name__
        return JournalFailed(f"the journal {self.path} cannot be written: {reason}")

    def _write(self) -> None:
        linger = 0.0
        try:
            window_start, window_results = self._clock(), 0
            while True:
                pending = self._gather(linger)
                taken = [entry for entry in pending if entry is not None]
                if taken:
                    self._room.release(len(taken))
                self._store_group(taken)
                if None in pending:
                    return
                window_results += len(taken)
                elapsed = self._clock() - window_start
                if elapsed >= 1.0:
                    linger = linger_for(window_results, elapsed)
                    window_start, window_results = self._clock(), 0
        except BaseException as exc:  # whatever it is, the run must hear of it
            self._error = exc

    def _gather(self, linger: float) -> list[tuple[Result, object] | None]:
        """The next group: what queued up by the first entry and ``linger`` after (None: end)."""
        first = self._queue.get()
        if first is not None and linger:
            self._sleep(linger)
        pending = [first]
        while len(pending) < _BATCH_ROWS:
            try:
                pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return pending

    def _store_group(self, taken: list[tuple[Result, object]]) -> None:
        """One group stored, then each of its Results told to ``committed``."""
        self._store([self._row(*entry) for entry in taken])
        if self._committed is not None:
            for result, _ in taken:
                self._committed(result)

    def _store(self, rows: list[Row]) -> None:
        """One group of Results, with this process's progress, in one transaction."""
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
            self._record_progress()

    def _row(self, result: Result, item: object) -> Row:
        record, request = self._encode(result, item)
        # (the columns keep the record's seconds: a summary of them is one of the records)
        backoff = sum(kept(attempt.wait or 0.0) for attempt in result.attempt_log)
        resume = None if result.continuation is None else json.dumps(result.continuation)
        # When it finished (unix seconds), for the report; a Result made outside a run's
        # workers has no such time: when the writer stores it, then.
        finished = time.time() if result.finished is None else result.finished
        return (result.index, int(result.ok), result.error_kind, result.status_code,
                result.attempts, kept(result.elapsed), backoff, record, request, resume,
                finished, self._pass_number)  # fmt: skip

    def _record_progress(self, stint: Stint | None = None) -> None:
        """This process's row of ``runs`` brought up to date (within a transaction), to
        ``stint`` when given."""
        if self._progress is None or self._run_row is None:
            return
        stint = self._progress() if stint is None else stint
        self._db.execute(
            "UPDATE runs SET elapsed = ?, items = ?, requests = ?, waits = ?, circuits = ? "
            "WHERE rowid = ?",
            (stint.elapsed, stint.items, stint.requests, json.dumps(dict(stint.waits)),
             stint.circuits_opened, self._run_row),
        )  # fmt: skip

    def close(
        self, timeline: Mapping[tuple[str, int], float] | None = None, stint: Stint | None = None
    ) -> None:
        """Write everything queued, then stop the writer; later adds are ignored. Records
        this process's progress a last time (as ``stint``, when given), with the seconds its
        gates waited by second (``timeline``). Raises JournalFailed if anything could not be
        written."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._writer.join()
            try:
                if self._error is None and self._run_row is not None:
                    self._record(timeline or {}, stint)
            except sqlite3.Error as exc:
                self._error = exc
            finally:
                self._db.close()
        if self._error is not None:
            raise self._failure()

    def _record(self, timeline: Mapping[tuple[str, int], float], stint: Stint | None) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._record_progress(stint)
            self._db.executemany(
                "INSERT INTO waits VALUES (?, ?, ?) ON CONFLICT (gate, second) "
                "DO UPDATE SET seconds = seconds + excluded.seconds",
                [(gate, second, seconds) for (gate, second), seconds in timeline.items()],
            )
