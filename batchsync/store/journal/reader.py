"""The journal's reader: what a journal holds, for the run that goes on with it and for the
outputs (the results and failed files, the summary, the report), which read nothing else of it.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...core.history import Pass, Stint
from ...core.kinds import NOT_FINAL
from ...core.result import how_many
from ..submissions import COLUMNS, Part, part_of
from .schema import open_for_reading, upgrade

# The kinds a resumed run sends again, as SQL: an item stopped partway with them is not done.
_NOT_FINAL = ", ".join(f"'{kind}'" for kind in sorted(NOT_FINAL))


class JournalReader:
    """Reads a journal: its identity, finished indexes, rows in input order, counts.

    Opens the file read-only and checks that it is a journal of this batchsync's layout
    (JournalMismatch otherwise), so that a foreign or older file is left exactly as it was.
    A journal of the version before can be described (``meta``, ``holding``); the rest needs
    ``upgrade`` first (``resumed`` does it). Its rows are read as they are: ``resumed`` checks
    them before a run trusts them.
    """

    def __init__(self, path: Path) -> None:
        self._db = open_for_reading(path)

    def close(self) -> None:
        self._db.close()

    def upgrade(self) -> None:
        """Bring a journal of the version before up to this layout (to go on with it; a
        journal only looked at stays as it was)."""
        upgrade(self._db)

    def meta(self) -> dict[str, str]:
        return {str(key): str(value) for key, value in self._db.execute("SELECT * FROM meta")}

    def latest_pass(self) -> Pass:
        """The last pass recorded (the first when none was: nothing was sent yet)."""
        row = self._db.execute("SELECT number, retry FROM passes ORDER BY number DESC").fetchone()
        return Pass() if row is None else _pass(*row)

    def outstanding(self, size: int, current: Pass) -> bytearray:
        """One byte per input index below ``size``, saying what pass ``current`` does with
        it (``Pass.does``; ``TO_SEND``: no final Result yet)."""
        marks = bytearray(size)  # (history.TO_SEND is 0)
        query = "SELECT idx, ok, error_kind, pass, resume FROM results WHERE idx < ?"
        for index, ok, kind, made_in, resume in self._db.execute(query, (size,)):
            marks[index] = current.does(bool(ok), kind, int(made_in), resume is not None)
        return marks

    def record(self, index: int) -> str | None:
        """The stored Result of one item, as its record's JSON text (None: none stored)."""
        row = self._db.execute("SELECT record FROM results WHERE idx = ?", (index,)).fetchone()
        return None if row is None else str(row[0])

    def unfinished(self, size: int) -> dict[int, tuple[Any, str]]:
        """The paginated items that stopped partway, by index: where each goes on (its
        ``Result.continuation``) and its stored record."""
        query = "SELECT idx, resume, record FROM results WHERE idx < ? AND resume IS NOT NULL"
        return {
            int(index): (json.loads(resume), str(record))
            for index, resume, record in self._db.execute(query, (size,))
        }

    def parts(self) -> list[Part]:
        """The submissions to a batch endpoint (none for a journal made before them)."""
        try:
            rows = self._db.execute(f"SELECT {COLUMNS} FROM submissions ORDER BY part").fetchall()
        except sqlite3.OperationalError:  # (no such table)
            return []
        return [part_of(row) for row in rows]

    def finals(self) -> Iterator[tuple[int, str, str | None, float | None]]:
        """Each stored Result in input order as the outputs read it: its index, record,
        failed-file line and finish time (``resultset.StoredResults``)."""
        query = "SELECT idx, record, request, finished FROM results ORDER BY idx"
        for index, record, request, finished in self._db.execute(query):
            yield int(index), str(record), None if request is None else str(request), finished

    def stints(self) -> list[Stint]:
        """What each process that worked on the run did, in the order they ran."""
        query = (
            "SELECT pass, retry, started, elapsed, items, requests, waits, circuits FROM runs "
            "LEFT JOIN passes ON passes.number = runs.pass ORDER BY started"
        )
        return [
            Stint(_pass(number, retry), started, elapsed, items, sent, _by_gate(waits), circuits)
            for number, retry, started, elapsed, items, sent, waits, circuits
            in self._db.execute(query)
        ]  # fmt: skip

    def timeline(self) -> dict[tuple[str, int], float]:
        """Seconds waited at each gate by (gate, unix second), over every process."""
        timeline: dict[tuple[str, int], float] = {}
        for gate, second, seconds in self._db.execute("SELECT gate, second, seconds FROM waits"):
            key = (RENAMED_GATES.get(gate, str(gate)), int(second))
            timeline[key] = timeline.get(key, 0.0) + seconds
        return timeline

    def holding(self) -> str:
        """What the journal holds, in a few words: its input, items done of all, failed."""
        meta = self.meta()
        done, failed = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(1 - ok), 0) FROM results "
            f"WHERE resume IS NULL OR error_kind IS NULL OR error_kind NOT IN ({_NOT_FINAL})"
        ).fetchone()
        entries, source = meta.get("entries", "?"), meta.get("input")
        what = f"a run of {source}" if source else "a run"
        return f"{what}: {done} of {how_many(entries, 'item')} done, {failed} failed"


# Gates a journal of an earlier batchsync named otherwise: the request rate was "token".
RENAMED_GATES = {"token": "rate"}


def _by_gate(waits: str) -> dict[str, float]:
    """A run's seconds waited by gate, under the gates' names of today."""
    named: dict[str, float] = {}
    for gate, seconds in json.loads(waits).items():
        name = RENAMED_GATES.get(gate, gate)
        named[name] = named.get(name, 0.0) + seconds
    return named


def _pass(number: int, retry: str | None) -> Pass:
    """A ``passes`` row as the Pass it records."""
    return Pass(int(number), None if retry is None else frozenset(json.loads(retry)))
