"""What a run under a spend cap reserved and spent, in its journal: each reservation stored
before its attempt is sent and settled after it, so that a run killed at any moment leaves
what it may have spent (its unsettled reservations at their worst case) for the next run of
the journal to count from (``limits.spend.Ledger.keep``)."""

from __future__ import annotations

import threading
from pathlib import Path

from .schema import connect

# How long a reservation waits for the journal's writer to finish a group of Results.
_BUSY_MS = 30_000


class SpendRecord:
    """The journal's ``spend`` table, written from any thread (one statement, one commit)."""

    def __init__(self, path: Path) -> None:
        self._db = connect(path)
        self._db.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
        self._lock = threading.Lock()

    def total(self) -> int:
        """What every run of the journal spent, and reserved without settling (in pico-dollars)."""
        with self._lock:
            row = self._db.execute("SELECT SUM(COALESCE(spent, reserved)) FROM spend").fetchone()
        return int(row[0] or 0)

    def reserve(self, amount: int) -> int:
        """Store a reservation of ``amount``; its number, to settle it by."""
        with self._lock:
            cursor = self._db.execute("INSERT INTO spend (reserved) VALUES (?)", (amount,))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def settle(self, number: int, spent: int) -> bool:
        """The reservation ``number`` turned into ``spent``; False when it was settled before
        (a run killed after settling a part it collected, before it said so)."""
        with self._lock:
            query = "UPDATE spend SET spent = ? WHERE attempt = ? AND spent IS NULL"
            return self._db.execute(query, (spent, number)).rowcount == 1

    def close(self) -> None:
        with self._lock:
            self._db.close()
