"""The journal: every final Result persisted as soon as it exists, so a crash loses nothing done.

An SQLite file in WAL mode with one writer thread. Workers only enqueue; the writer commits
whatever has queued up in one transaction (a group commit; in a busy run, every 20 ms), so
the cost per item stays small while a SIGKILL loses at most the items still in flight and
the last few milliseconds.

The ``meta`` table records what the journal was made for (the input's identity), so that a
run does not resume a journal made for other input.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from .result import PERCENTILES, Result, Summary, rank

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    idx INTEGER PRIMARY KEY,
    ok INTEGER NOT NULL,
    error_kind TEXT,
    status_code INTEGER,
    attempts INTEGER NOT NULL,
    elapsed REAL NOT NULL,
    backoff REAL NOT NULL,
    record TEXT NOT NULL,
    request TEXT
);
"""

# The keys of the input identity that must match for a journal to be resumed.
IDENTITY_KEYS = ("entries", "sha256")

_BATCH_ROWS = 5000
# From this many results a second, the writer lets results gather for _LINGER_SECONDS before
# each commit: a writer that keeps up would otherwise commit every result or two, and
# thousands of small commits a second cost a busy run more than a tenth of its speed. Slower
# runs commit each result as soon as the writer sees it.
BUSY_RESULTS_PER_SECOND = 1000
_LINGER_SECONDS = 0.02

Row = tuple[int, int, str | None, int | None, int, float, float, str, str | None]
# Turns (Result, the item it is for) into the stored result JSON and failed-request JSON.
Encode = Callable[[Result, object], tuple[str, str | None]]


def linger_for(results: int, seconds: float) -> float:
    """How long the writer lets results gather before each commit, after ``results`` came
    in the last ``seconds``."""
    return _LINGER_SECONDS if results >= BUSY_RESULTS_PER_SECOND * seconds else 0.0


class JournalMismatch(ValueError):
    """The journal was made for other input."""


def connect(path: Path) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    # WAL + NORMAL: a committed transaction survives the process being killed.
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.executescript(SCHEMA)
    return connection


def remove(path: Path) -> bool:
    """Delete a journal and its WAL files; True when there was one."""
    existed = path.exists()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return existed


def mismatch(stored: Mapping[str, str], current: Mapping[str, str]) -> str | None:
    """Why a journal recorded for ``stored`` cannot be resumed for ``current``, or None."""
    for key in IDENTITY_KEYS:
        if stored.get(key) != current.get(key):
            return f"its {key} was {stored.get(key)}, the input's is {current.get(key)}"
    return None


class Journal:
    """Stores each final Result from any thread; see the module docstring.

    ``encode(result, item)`` runs on the writer thread. ``meta`` (the input's identity) is
    recorded before anything else.
    """

    def __init__(self, path: Path, encode: Encode, meta: Mapping[str, str]) -> None:
        self.path = path
        self._encode = encode
        self._db = connect(path)
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
        self._queue: queue.SimpleQueue[tuple[Result, object] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._closed = False
        self._writer = threading.Thread(target=self._write, name="batchsync-journal", daemon=True)
        self._writer.start()

    def add(self, result: Result, item: object) -> None:
        """Queue a final Result; raises if the writer has failed (e.g. the disk is full)."""
        if self._error is not None:
            raise OSError(f"the journal {self.path} cannot be written: {self._error}")
        if not self._closed:
            self._queue.put((result, item))

    def _write(self) -> None:
        linger = 0.0
        window_start, window_results = time.monotonic(), 0
        while True:
            first = self._queue.get()
            if first is not None and linger:
                time.sleep(linger)
            pending = [first]
            while len(pending) < _BATCH_ROWS:
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rows = [self._row(*entry) for entry in pending if entry is not None]
            try:
                with self._db:
                    self._db.execute("BEGIN")
                    self._db.executemany(
                        "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
                    )
            except sqlite3.Error as exc:
                self._error = exc
                return
            if None in pending:
                return
            window_results += len(rows)
            elapsed = time.monotonic() - window_start
            if elapsed >= 1.0:
                linger = linger_for(window_results, elapsed)
                window_start, window_results = time.monotonic(), 0

    def _row(self, result: Result, item: object) -> Row:
        record, request = self._encode(result, item)
        backoff = sum(attempt.wait or 0.0 for attempt in result.attempt_log)
        return (
            result.index, int(result.ok), result.error_kind, result.status_code, result.attempts,
            result.elapsed, backoff, record, request,
        )  # fmt: skip

    def close(self) -> None:
        """Write everything queued, then stop the writer; later adds are ignored."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._writer.join()
            self._db.close()
        if self._error is not None:
            raise OSError(f"the journal {self.path} cannot be written: {self._error}")


class JournalReader:
    """Reads a journal: its identity, finished indexes, rows in input order, counts."""

    def __init__(self, path: Path) -> None:
        self._db = connect(path)

    def close(self) -> None:
        self._db.close()

    def meta(self) -> dict[str, str]:
        return {str(key): str(value) for key, value in self._db.execute("SELECT * FROM meta")}

    def done(self, size: int) -> bytearray:
        """One byte per input index below ``size``: 1 where a final Result is stored."""
        marks = bytearray(size)
        for (index,) in self._db.execute("SELECT idx FROM results WHERE idx < ?", (size,)):
            marks[index] = 1
        return marks

    def records(self) -> Iterator[tuple[int, str]]:
        for index, record in self._db.execute("SELECT idx, record FROM results ORDER BY idx"):
            yield int(index), str(record)

    def rows(self) -> Iterator[tuple[str, str | None]]:
        cursor = self._db.execute("SELECT record, request FROM results ORDER BY idx")
        for record, request in cursor:
            yield str(record), None if request is None else str(request)

    def summary(self, elapsed: float | None = None) -> Summary:
        """Counts and statistics over every stored Result, computed in SQLite."""
        db = self._db
        total, ok, sent, backoff = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(ok), 0), COALESCE(SUM(attempts), 0),"
            " COALESCE(SUM(backoff), 0) FROM results"
        ).fetchone()
        (started,) = db.execute("SELECT COUNT(*) FROM results WHERE attempts > 0").fetchone()
        # Several percentiles may fall on one position (few items): each gets its value.
        wanted: dict[int, list[str]] = {}
        for name, share in PERCENTILES.items():
            wanted.setdefault(rank(started, share), []).append(name)
        found: dict[str, float] = {}
        sorted_times = db.execute(
            "SELECT elapsed FROM results WHERE attempts > 0 ORDER BY elapsed"
        )  # one sort, read as a stream: nothing held but the three values
        for position, (seconds,) in enumerate(sorted_times):
            for name in wanted.get(position, ()):
                found[name] = seconds
            if len(found) == len(PERCENTILES):
                break
        latency = {name: found[name] for name in PERCENTILES if name in found}
        kinds = db.execute(
            "SELECT error_kind, COUNT(*) FROM results WHERE error_kind IS NOT NULL GROUP BY 1"
        ).fetchall()
        codes = db.execute(
            "SELECT status_code, COUNT(*) FROM results WHERE status_code IS NOT NULL GROUP BY 1"
        ).fetchall()
        return Summary(
            total=total, ok=ok, failed=total - ok, error_kinds=dict(kinds),
            status_codes=dict(codes), requests_sent=sent, elapsed=elapsed,
            waits={"backoff": backoff} if backoff else {}, latency=latency,
        )  # fmt: skip
