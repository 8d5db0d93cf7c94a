"""The journal: every final Result persisted as soon as it exists, so a crash loses nothing done.

An SQLite file in WAL mode with one writer thread. Workers only enqueue; the writer commits
whatever has queued up in one transaction (a group commit), so the cost per item stays small
while a SIGKILL loses at most the items still in flight and the last few milliseconds.
"""

from __future__ import annotations

import queue
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .result import Result, Summary

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    idx INTEGER PRIMARY KEY,
    ok INTEGER NOT NULL,
    error_kind TEXT,
    status_code INTEGER,
    attempts INTEGER NOT NULL,
    record TEXT NOT NULL,
    request TEXT
);
"""

_BATCH_ROWS = 5000
_STOP = None

Row = tuple[int, int, str | None, int | None, int, str, str | None]
# Turns (Result, the item's failed-request object or None) into the JSON texts to store.
Encode = Callable[[Result, object], tuple[str, str | None]]


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


class Journal:
    """Stores each final Result (as its output JSON) from any thread; see the module docstring.

    ``encode(result, extra)`` runs on the writer thread and returns the stored result JSON and
    the failed-request JSON (None for a success).
    """

    def __init__(self, path: Path, encode: Encode) -> None:
        self.path = path
        self._encode = encode
        self._db = connect(path)
        self._queue: queue.SimpleQueue[tuple[Result, object] | None] = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._writer = threading.Thread(target=self._write, name="batchsync-journal", daemon=True)
        self._writer.start()

    def add(self, result: Result, extra: object) -> None:
        """Queue a final Result; raises if the writer has failed (e.g. the disk is full)."""
        if self._error is not None:
            raise OSError(f"the journal {self.path} cannot be written: {self._error}")
        self._queue.put((result, extra))

    def _write(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            pending: list[tuple[Result, object] | None] = [first]
            while len(pending) < _BATCH_ROWS:
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = _STOP in pending
            rows = [self._row(*entry) for entry in pending if entry is not None]
            try:
                with self._db:
                    self._db.execute("BEGIN")
                    self._db.executemany(
                        "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?)", rows
                    )
            except sqlite3.Error as exc:
                self._error = exc
                return
            if stop:
                return

    def _row(self, result: Result, extra: object) -> Row:
        record, request = self._encode(result, extra)
        return (
            result.index, int(result.ok), result.error_kind, result.status_code, result.attempts,
            record, request,
        )  # fmt: skip

    def close(self) -> None:
        """Write everything queued, then stop the writer."""
        if self._writer.is_alive():
            self._queue.put(_STOP)
            self._writer.join()
        self._db.close()
        if self._error is not None:
            raise OSError(f"the journal {self.path} cannot be written: {self._error}")

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, values: dict[str, Any]) -> None:
        with self._db:
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [(key, str(value)) for key, value in values.items()],
            )


class JournalReader:
    """Reads a closed journal: rows in input order and counts by outcome."""

    def __init__(self, path: Path) -> None:
        self._db = connect(path)

    def close(self) -> None:
        self._db.close()

    def rows(self) -> Iterator[tuple[str, str | None]]:
        cursor = self._db.execute("SELECT record, request FROM results ORDER BY idx")
        for record, request in cursor:
            yield str(record), None if request is None else str(request)

    def summary(self, elapsed: float | None = None) -> Summary:
        db = self._db
        total, ok, sent = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(ok), 0), COALESCE(SUM(attempts), 0) FROM results"
        ).fetchone()
        kinds = db.execute(
            "SELECT error_kind, COUNT(*) FROM results WHERE error_kind IS NOT NULL GROUP BY 1"
        ).fetchall()
        codes = db.execute(
            "SELECT status_code, COUNT(*) FROM results WHERE status_code IS NOT NULL GROUP BY 1"
        ).fetchall()
        return Summary(
            total=total, ok=ok, failed=total - ok, error_kinds=dict(kinds),
            status_codes=dict(codes), requests_sent=sent, elapsed=elapsed,
        )  # fmt: skip
