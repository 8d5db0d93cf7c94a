"""The journal: every final Result persisted as soon as it exists, so a crash loses nothing done.

An SQLite file in WAL mode with one writer thread. Workers only enqueue; the writer commits
whatever has queued up in one transaction (a group commit; in a busy run, every 20 ms), so
the cost per item stays small while a SIGKILL loses at most the items still in flight and
the last few milliseconds.

The ``meta`` table records what the journal was made for (the input's identity) and its
``schema``, so that a run does not resume a journal made for other input, by an older
batchsync, or by something else altogether. Anything the writer cannot store fails the run
(``JournalFailed``) rather than losing a Result quietly; a lock file beside the journal keeps
a second run from using the same journal at once.
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .clock import SYSTEM, Clock, clock_of
from .history import Pass, Stint, totals
from .kinds import NOT_FINAL
from .result import Listing, Result, Summary, Trace, summarize

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
    request TEXT,
    resume TEXT,
    finished REAL,
    pass INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS passes (number INTEGER PRIMARY KEY, retry TEXT);
CREATE TABLE IF NOT EXISTS runs (
    pass INTEGER NOT NULL,
    started REAL NOT NULL,
    elapsed REAL NOT NULL,
    items INTEGER NOT NULL,
    requests INTEGER NOT NULL,
    waits TEXT NOT NULL,
    circuits INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS waits (
    gate TEXT NOT NULL,
    second INTEGER NOT NULL,
    seconds REAL NOT NULL,
    PRIMARY KEY (gate, second)
);
"""
# ``passes``: each pass over the items (the first; then each retry of the failures, ``retry``
# the JSON list of the error kinds it retried, empty for all); ``results.pass``: the pass that
# made each Result. ``runs``: what each process (or batch ``run()``) did, and ``waits`` the
# seconds its attempts waited at each gate by unix second, summed: a resumed run's report and
# summary cover every process that worked on it.

# The keys of the input identity that must match for a journal to be resumed.
# ``template``: the options that turn a table's rows into requests (absent: none).
# ``paging``: how items were paginated (absent: they were not).
IDENTITY_KEYS = ("entries", "sha256", "template", "paging")
# The ``meta`` row that marks a journal of this layout; journals without it are refused.
SCHEMA_VERSION = "batchsync-journal 4"
# Journals of this layout are brought up to SCHEMA_VERSION when opened: version 3 lacked the
# passes, the runs and the waits (its runs count from their next process on).
_UPGRADABLE = "batchsync-journal 3"

# The first row a journal cannot be trusted with, and which of _TAMPERINGS it is: an index
# outside the input, a record that is no JSON or names another item, a text of more lines.
_TAMPERED = """
SELECT idx, CASE
    WHEN idx < 0 OR idx >= ?1 THEN 0
    WHEN json_valid(record) = 0 OR json_extract(record, '$.index') IS NOT idx THEN 1
    WHEN instr(record, char(10)) OR instr(record, char(13))
        OR instr(request, char(10)) OR instr(request, char(13)) THEN 2
END AS problem
FROM results WHERE problem IS NOT NULL ORDER BY problem LIMIT 1
"""
_TAMPERINGS = (
    "item {index} is not in the input of {size} items",
    "the record of item {index} is not that item's",
    "the record of item {index} is not one line",
)

# What a pass does with each item of a journal (``JournalReader.outstanding``).
TO_SEND, DONE, TO_REDO, TO_GO_ON, TO_FINISH = range(5)

_BATCH_ROWS = 5000
# The kinds a resumed run sends again, as SQL: an item stopped partway with them is not done.
_NOT_FINAL = ", ".join(f"'{kind}'" for kind in sorted(NOT_FINAL))
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


class JournalUnusable(ValueError):
    """The journal cannot be used for this run; found before anything is sent."""


class JournalMismatch(JournalUnusable):
    """The journal was made for other input, by an older batchsync, or is not a journal."""


class JournalInUse(JournalUnusable):
    """Another run (or another ``Batch``) holds the journal's lock."""


class JournalFailed(OSError):
    """A Result could not be stored: the run cannot be completed."""


def connect(path: Path) -> sqlite3.Connection:
    # Owner-only (0600), like the failed file: it keeps the failed items as given, secrets and
    # all. SQLite gives its -wal and -shm files the database file's mode.
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(descriptor, 0o600)  # (a journal an earlier version made 0644 too)
    finally:
        os.close(descriptor)
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    # WAL + NORMAL: a committed transaction survives the process being killed.
    connection.execute("PRAGMA synchronous=NORMAL")
    _upgrade(connection)
    return connection


def _upgrade(db: sqlite3.Connection) -> None:
    """Create what is missing of this layout; a journal of the version before gains its new
    column and tables."""
    db.executescript(SCHEMA)
    columns = {str(row[1]) for row in db.execute("PRAGMA table_info(results)")}
    if "pass" not in columns:
        db.execute("ALTER TABLE results ADD COLUMN pass INTEGER NOT NULL DEFAULT 1")
    if db.execute("SELECT 1 FROM meta WHERE key = 'schema'").fetchone() is not None:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA_VERSION,))


def _storable(text: str) -> str:
    """``text`` as SQLite can store it: a file name that is not UTF-8 (its bytes kept by
    Python as lone surrogates) keeps them as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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


def remove(path: Path) -> bool:
    """Delete a journal and its WAL files; True when there was one. A file there that is not
    a batchsync journal of any version is never deleted: JournalMismatch."""
    problem = _foreign(path)
    if problem is not None:
        raise JournalMismatch(f"{path} {problem}: {_NOT_REPLACED}")
    existed = path.exists()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return existed


_NOT_REPLACED = "only a batchsync journal is replaced: move it away, or give another path"


def _foreign(path: Path) -> str | None:
    """Why the file at ``path`` is no batchsync journal of any version (None: it is one,
    an empty file, or nothing)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        with contextlib.closing(_read_only(path)) as db:
            query = "SELECT 1 FROM sqlite_master WHERE name = 'meta'"
            ours = db.execute(query).fetchone() is not None
    except sqlite3.Error as exc:
        return f"cannot be read as a batchsync journal ({exc})"
    return None if ours else "is not a batchsync journal"


def mismatch(stored: Mapping[str, str], current: Mapping[str, str]) -> str | None:
    """Why a journal recorded for ``stored`` cannot be resumed for ``current``, or None."""
    for key in IDENTITY_KEYS:
        if key == "template" and stored.get(key) != current.get(key):
            return (
                "its template options were different: the URL template, method, body template "
                "(or --row-as-body), id field and table format must be the ones it was made with"
            )
        if key == "paging" and stored.get(key) != current.get(key):
            return (
                "its pagination options were different: --paginate (paginate), --items "
                "(page_items) and --cursor-param must be the ones it was made with"
            )
        if stored.get(key) != current.get(key):
            return f"its {key} was {stored.get(key)}, the input's is {current.get(key)}"
    return None


class Journal:
    """Stores each final Result from any thread; see the module docstring.

    ``encode(result, item)`` runs on the writer thread. ``meta`` (the input's identity) is
    recorded before anything else, with the schema version, and ``passing``, the pass the
    Results belong to (recorded when given: a run that sends nothing records no pass).
    ``progress`` says what this process has done so far: recorded as its row of ``runs``
    with every group of Results (so a process killed at any moment still counts), and once
    more by ``close``.
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
    ) -> None:
        self.path = path
        self._encode = encode
        # The writer's clock (to measure the pace of results) and its linger (the clock's
        # own sleep unless given): tests pass their own, so that what they check does not
        # depend on the machine's speed.
        measured = clock_of(clock)
        self._clock = measured.now
        self._sleep = measured.sleep if sleep is None else sleep
        self._db = connect(path)
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [(key, _storable(value)) for key, value in meta.items()]
                + [("schema", SCHEMA_VERSION)],
            )
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
        try:
            self._write_until_closed()
        except BaseException as exc:  # whatever it is, the run must hear of it
            self._error = exc

    def _write_until_closed(self) -> None:
        linger = 0.0
        window_start, window_results = self._clock(), 0
        while True:
            first = self._queue.get()
            if first is not None and linger:
                self._sleep(linger)
            pending = [first]
            while len(pending) < _BATCH_ROWS:
                try:
                    pending.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            taken = [entry for entry in pending if entry is not None]
            if taken:
                self._room.release(len(taken))
            rows = [self._row(*entry) for entry in taken]
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
                self._record_progress()
            if None in pending:
                return
            window_results += len(rows)
            elapsed = self._clock() - window_start
            if elapsed >= 1.0:
                linger = linger_for(window_results, elapsed)
                window_start, window_results = self._clock(), 0

    def _row(self, result: Result, item: object) -> Row:
        record, request = self._encode(result, item)
        backoff = sum(attempt.wait or 0.0 for attempt in result.attempt_log)
        resume = None if result.continuation is None else json.dumps(result.continuation)
        # When it finished (unix seconds), for the report; a Result made outside a run's
        # workers has no such time: when the writer stores it, then.
        finished = time.time() if result.finished is None else result.finished
        return (
            result.index,
            int(result.ok),
            result.error_kind,
            result.status_code,
            result.attempts,
            result.elapsed,
            backoff,
            record,
            request,
            resume,
            finished,
            self._pass_number,
        )

    def _record_progress(self, stint: Stint | None = None) -> None:
        """This process's row of ``runs`` brought up to date (within a transaction), to
        ``stint`` when given."""
        if self._progress is None or self._run_row is None:
            return
        stint = self._progress() if stint is None else stint
        self._db.execute(
            "UPDATE runs SET elapsed = ?, items = ?, requests = ?, waits = ?, circuits = ? "
            "WHERE rowid = ?",
            (
                stint.elapsed,
                stint.items,
                stint.requests,
                json.dumps(dict(stint.waits)),
                stint.circuits_opened,
                self._run_row,
            ),
        )

    def close(
        self,
        timeline: Mapping[tuple[str, int], float] | None = None,
        stint: Stint | None = None,
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


def _read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to ``path``: a file that is not ours stays as it was."""
    uri = f"file:{quote(os.fsencode(path))}?mode=ro"  # a name may hold ? # or %
    return sqlite3.connect(uri, uri=True)


def _open_for_reading(path: Path) -> sqlite3.Connection:
    """A connection to read a journal of this layout; JournalMismatch for anything else
    (not SQLite, another program's database, an older layout, an unreadable file).

    The check runs on a read-only connection, so a file that is not ours stays exactly as it
    was. Ours is then read on a plain connection: closing the last connection to a journal
    folds its WAL back in and removes the -wal and -shm files, which a read-only one cannot.
    """
    try:
        with contextlib.closing(_read_only(path)) as check:
            problem = _layout_problem(check)
    except sqlite3.Error as exc:  # not SQLite at all, or unreadable
        problem = f"cannot be read as a batchsync journal ({exc})"
    if problem is not None:
        raise JournalMismatch(f"{path} {problem}")
    return sqlite3.connect(path, check_same_thread=False)


def _layout_problem(db: sqlite3.Connection) -> str | None:
    """Why ``db`` is not a journal of this layout, or None."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() is None:
        return "is not a batchsync journal"
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if row is None:
        return "was made by an older batchsync (or is not a batchsync journal)"
    if row[0] not in (SCHEMA_VERSION, _UPGRADABLE):
        return f"was made by another batchsync ({row[0]}, not {SCHEMA_VERSION})"
    return None


@contextlib.contextmanager
def resumed(
    path: Path, identity: Mapping[str, str], what: str, hint: str
) -> Iterator[JournalReader]:
    """A reader of the journal to resume, checked to be one of this layout made for these
    ``what`` (their identity); JournalMismatch naming the problem, then ``hint``, otherwise."""
    try:
        reader = JournalReader(path)
    except JournalMismatch as exc:
        raise JournalMismatch(f"{exc}: {_NOT_REPLACED if _foreign(path) else hint}") from None
    try:
        problem = mismatch(reader.meta(), identity)
        if problem is not None:
            raise JournalMismatch(f"{path} was made for other {what} ({problem}); {hint}")
        problem = reader.tampered(int(identity["entries"]))
        if problem is not None:
            raise JournalMismatch(f"{path} was altered: {problem}; {hint}")
        reader.upgrade()
        yield reader
    finally:
        reader.close()


_TRACES = (
    "SELECT idx, ok, error_kind, status_code, attempts, elapsed, finished, "
    "json_extract(record, '$.attempt_log') FROM results"
)
_LISTINGS = (
    "SELECT idx, json_extract(record, '$.url'), json_extract(record, '$.id'), status_code, "
    "error_kind, json_extract(record, '$.error'), attempts, elapsed "
    "FROM results WHERE idx IN ({marks})"
)


def _lenient_text(raw: bytes) -> str:
    # SQLite's JSON functions turn a lone surrogate escape ("\ud800", kept as such in the
    # record) into bytes that are not UTF-8: such a text is shown with a replacement mark.
    return raw.decode("utf-8", "replace")


class JournalReader:
    """Reads a journal: its identity, finished indexes, rows in input order, counts.

    Opens the file read-only and checks that it is a journal of this batchsync's layout
    (JournalMismatch otherwise), so that a foreign or older file is left exactly as it was.
    A journal of the version before can be described (``meta``, ``holding``); the rest needs
    ``upgrade`` first (``resumed`` does it).
    """

    def __init__(self, path: Path) -> None:
        self._db = _open_for_reading(path)

    def close(self) -> None:
        self._db.close()

    def upgrade(self) -> None:
        """Bring a journal of the version before up to this layout (to go on with it; a
        journal only looked at stays as it was)."""
        if self.meta().get("schema") != SCHEMA_VERSION:
            _upgrade(self._db)
            self._db.commit()

    def meta(self) -> dict[str, str]:
        return {str(key): str(value) for key, value in self._db.execute("SELECT * FROM meta")}

    def tampered(self, size: int) -> str | None:
        """What makes a row untrustworthy for an input of ``size`` items (None: nothing): an
        index outside it (its Result would land on another item, or out of order), a stored
        text of more than one line (the output files hold one a line). A journal is a file
        anyone with the owner's rights can edit."""
        row = self._db.execute(_TAMPERED, (size,)).fetchone()  # (one scan of the results)
        if row is None:
            return None
        index, problem = row
        return _TAMPERINGS[problem].format(index=index, size=size)

    def latest_pass(self) -> Pass:
        """The last pass recorded (the first when none was: nothing was sent yet)."""
        row = self._db.execute("SELECT number, retry FROM passes ORDER BY number DESC").fetchone()
        if row is None:
            return Pass()
        return Pass(int(row[0]), None if row[1] is None else frozenset(json.loads(row[1])))

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

    def records(self) -> Iterator[tuple[int, str]]:
        for index, record in self._db.execute("SELECT idx, record FROM results ORDER BY idx"):
            yield int(index), str(record)

    def finish_times(self) -> dict[int, float]:
        """When each stored Result finished (unix seconds), by index."""
        query = "SELECT idx, finished FROM results WHERE finished IS NOT NULL"
        return {int(index): float(when) for index, when in self._db.execute(query)}

    def rows(self) -> Iterator[tuple[str, str | None]]:
        cursor = self._db.execute("SELECT record, request FROM results ORDER BY idx")
        for record, request in cursor:
            yield str(record), None if request is None else str(request)

    def finals(self) -> Iterator[tuple[int, str, str | None, float | None]]:
        """Each stored Result in input order as the outputs read it: its index, record,
        failed-file line and finish time (``resultset.StoredResults``)."""
        query = "SELECT idx, record, request, finished FROM results ORDER BY idx"
        for index, record, request, finished in self._db.execute(query):
            yield int(index), str(record), None if request is None else str(request), finished

    def span(self) -> tuple[float, float] | None:
        """When the first stored Result's item was claimed and the last one finished (unix
        seconds); None for a journal with no Result."""
        first, last = self._db.execute(
            "SELECT MIN(finished - elapsed), MAX(finished) FROM results"
        ).fetchone()
        return None if first is None else (float(first), float(last))

    def traces(self) -> Iterator[Trace]:
        """What the report reads of each stored Result, streamed: its attempt log read out
        of the record by SQLite, not the whole record by Python."""
        self._db.text_factory = _lenient_text
        for index, ok, kind, status, attempts, elapsed, finished, log in self._db.execute(_TRACES):
            tried = tuple(
                (entry["status_code"], entry["error_kind"], entry["elapsed"], entry["wait"])
                for entry in json.loads(log or "[]")
            )
            yield Trace(index, bool(ok), kind, status, attempts, elapsed, finished, tried)

    def listings(self, indexes: Sequence[int]) -> dict[int, Listing]:
        """What a table of items shows of the stored Results at ``indexes``, by index (an
        index with no Result left out)."""
        self._db.text_factory = _lenient_text
        found: dict[int, Listing] = {}
        for chunk in range(0, len(indexes), 500):
            wanted = indexes[chunk : chunk + 500]
            query = _LISTINGS.format(marks=",".join("?" * len(wanted)))
            for row in self._db.execute(query, wanted):
                found[int(row[0])] = Listing(*row)
        return found

    def stints(self) -> list[Stint]:
        """What each process that worked on the run did, in the order they ran."""
        query = (
            "SELECT pass, retry, started, elapsed, items, requests, waits, circuits FROM runs "
            "LEFT JOIN passes ON passes.number = runs.pass ORDER BY started"
        )
        stints = []
        for number, retry, started, elapsed, items, requests, waits, circuits in self._db.execute(
            query
        ):
            kinds = None if retry is None else frozenset(json.loads(retry))
            stint = Stint(
                Pass(int(number), kinds),
                started,
                elapsed,
                items,
                requests,
                json.loads(waits),
                circuits,
            )
            stints.append(stint)
        return stints

    def timeline(self) -> dict[tuple[str, int], float]:
        """Seconds waited at each gate by (gate, unix second), over every process."""
        query = "SELECT gate, second, seconds FROM waits"
        rows = self._db.execute(query)
        return {(str(gate), int(second)): seconds for gate, second, seconds in rows}

    def holding(self) -> str:
        """What the journal holds, in a few words: its input, items done of all, failed."""
        meta = self.meta()
        done, failed = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(1 - ok), 0) FROM results "
            f"WHERE resume IS NULL OR error_kind IS NULL OR error_kind NOT IN ({_NOT_FINAL})"
        ).fetchone()
        entries = meta.get("entries", "?")
        source = meta.get("input")
        what = f"a run of {source}" if source else "a run"
        return f"{what}: {done} of {entries} items done, {failed} failed"

    def summary(self) -> Summary:
        """Counts and statistics over every stored Result and every process that ran (see
        ``Summary``), read as streams (flat memory)."""
        db = self._db
        ran = totals(self.stints())
        facts = db.execute(
            "SELECT ok, error_kind, status_code, attempts, backoff FROM results"
        )  # (summarize reads these to the end before it asks for the times)
        times = (
            seconds
            for (seconds,) in db.execute(
                "SELECT elapsed FROM results WHERE attempts > 0 ORDER BY elapsed"
            )
        )
        return summarize(
            facts, times, elapsed=ran.elapsed, waits=ran.waits, circuits_opened=ran.circuits_opened
        )
