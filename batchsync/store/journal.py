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

A journal is a file anyone with the owner's rights can edit, so a run that goes on with one
(``resumed``) trusts nothing in it unchecked: its layout, then every row of every table, on a
read-only connection before anything opens it for writing (``check``). A refused journal is
left byte for byte as it was.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import quote

from ..core.clock import SYSTEM, Clock, clock_of
from ..core.history import Pass, Stint, totals
from ..core.kinds import KINDS, NOT_FINAL
from ..core.records import dumps
from ..core.result import AttemptRecord, Listing, Result, Summary, Trace, kept, summarize
from .submissions import COLUMNS, Part, overlap_problem, part_of, submission_problem

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
CREATE TABLE IF NOT EXISTS submissions (
    part INTEGER PRIMARY KEY,
    pass INTEGER NOT NULL,
    provider TEXT NOT NULL,
    rows TEXT NOT NULL,
    state TEXT NOT NULL,
    input_file TEXT,
    batch TEXT,
    output_file TEXT,
    error_file TEXT,
    submitted REAL,
    updated REAL NOT NULL,
    history TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    tag TEXT NOT NULL
);
"""
# ``passes``: each pass over the items (the first; then each retry of the failures, ``retry``
# the JSON list of the error kinds it retried, empty for all); ``results.pass``: the pass that
# made each Result. ``runs``: what each process (or batch ``run()``) did, and ``waits`` the
# seconds its attempts waited at each gate by unix second, summed: a resumed run's report and
# summary cover every process that worked on it. ``submissions``: each part of a run sent
# through a provider's batch endpoint (``submissions.py``); a journal made before it has none
# until a run goes on with it.

# The keys of the input identity that must match for a journal to be resumed.
# ``template``: the options that turn a table's rows into requests (absent: none).
# ``paging``: how items were paginated (absent: they were not).
IDENTITY_KEYS = ("entries", "sha256", "template", "paging")
# The ``meta`` row that marks a journal of this layout; journals without it are refused.
SCHEMA_VERSION = "batchsync-journal 4"
# Journals of this layout are brought up to SCHEMA_VERSION when opened: version 3 lacked the
# passes, the runs and the waits (its runs count from their next process on).
_UPGRADABLE = "batchsync-journal 3"

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


def _create(path: Path, meta: Mapping[str, str]) -> None:
    """A new journal, made whole beside ``path`` and then moved there: a run interrupted or
    killed while it makes one leaves no journal (the next run starts over) or one that knows
    its input, never a file that no run can go on with nor ``--fresh`` replace."""
    making = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        with contextlib.closing(connect(making)) as db, db:
            db.execute("BEGIN")
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", _meta_rows(meta))
        making.replace(path)  # (the lock beside it keeps any other run out meanwhile)
    finally:
        for leftover in (making, *(Path(f"{making}{end}") for end in ("-wal", "-shm"))):
            leftover.unlink(missing_ok=True)


def _meta_rows(meta: Mapping[str, str]) -> list[tuple[str, str]]:
    """The ``meta`` rows of a journal made for ``meta`` (the input's identity)."""
    return [(key, _storable(value)) for key, value in meta.items()] + [("schema", SCHEMA_VERSION)]


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
        if not path.exists():
            _create(path, meta)
        self._db = connect(path)
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", _meta_rows(meta))
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
        # (the columns keep the record's seconds: a summary of them is one of the records)
        backoff = sum(kept(attempt.wait or 0.0) for attempt in result.attempt_log)
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
            kept(result.elapsed),
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
    """A read-only connection to ``path``: a file that is not ours stays as it was.

    Without a WAL or rollback journal beside it, everything is in the file itself: it is read
    as immutable, so that SQLite makes no -wal and -shm files either (only a connection that
    writes removes them again, and a refused journal is never opened for writing)."""
    uri = f"file:{quote(os.fsencode(path))}?mode=ro"  # a name may hold ? # or %
    if not any(_nonempty(Path(f"{path}{suffix}")) for suffix in ("-wal", "-journal")):
        uri += "&immutable=1"
    return sqlite3.connect(uri, uri=True)


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


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


# A schema row as batchsync writes one (any other value is not shown: it could be anything).
_VERSION = re.compile(r"batchsync-journal [0-9]{1,4}")
# Each column as ``PRAGMA table_info`` gives it: name, declared type, NOT NULL, key position.
Column = tuple[str, str, int, int]
# Where ``_tables_of`` lists the tables that have triggers (no table can be named so).
_TRIGGERS = " triggers"


def _layout_problem(db: sqlite3.Connection) -> str | None:
    """Why ``db`` is not a journal of this layout (or of the version before), or None: its
    schema row, then its tables, each column's name, declared type, NOT NULL and key."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone() is None:
        return "is not a batchsync journal"
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if row is None:
        return "was made by an older batchsync (or is not a batchsync journal)"
    if row[0] not in (SCHEMA_VERSION, _UPGRADABLE):
        shown = isinstance(row[0], str) and _VERSION.fullmatch(row[0])
        made_by = f"{row[0]}, not" if shown else "not"
        return f"was made by another batchsync ({made_by} {SCHEMA_VERSION})"
    upgradable = row[0] == _UPGRADABLE
    problem = layout_problem(_tables_of(db), upgradable=upgradable) or declared_problem(
        db.execute("SELECT type, tbl_name, sql FROM sqlite_master"), upgradable=upgradable
    )
    return None if problem is None else f"was altered: {problem}"


def _tables_of(db: sqlite3.Connection) -> dict[str, list[Column]]:
    """The tables of ``db`` with their columns as ``PRAGMA table_info`` gives them, and a
    ``_TRIGGERS`` entry naming the tables that have triggers."""
    tables: dict[str, list[Column]] = {}
    for kind, name, table in db.execute("SELECT type, name, tbl_name FROM sqlite_master"):
        if kind == "table":
            info = db.execute('SELECT name, type, "notnull", pk FROM pragma_table_info(?)', (name,))
            tables[str(name)] = [
                (str(n), str(t).upper(), int(nn), int(pk)) for n, t, nn, pk in info
            ]
        elif kind == "trigger":
            tables.setdefault(_TRIGGERS, []).append((str(table), "", 0, 0))
    return tables


def _read_back(schema: str) -> tuple[dict[str, list[Column]], dict[str, str]]:
    """The tables ``schema`` makes, read back as a journal's are (the one source of both):
    their columns (``_tables_of``) and their CREATE statements (``_squeezed``)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.executescript(schema)
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
        return _tables_of(db), {str(name): _squeezed(sql) for name, sql in db.execute(query)}


def _squeezed(sql: object) -> str:
    """A CREATE statement without its whitespace: SQLite keeps the text as it was written,
    and ALTER TABLE ADD COLUMN appends to it."""
    return "".join(str(sql).split())


LAYOUT, DECLARED = _read_back(SCHEMA)
# The column the version before lacked, as its upgrade's ALTER TABLE appends it.
_PASS_COLUMN = ",passINTEGERNOTNULLDEFAULT1)"


def declared_problem(
    entries: Iterable[tuple[object, object, object]], *, upgradable: bool
) -> str | None:
    """What the columns do not show, in the ``sqlite_master`` rows (type, table, sql): each
    of the journal's tables declared as batchsync declares it (not a key in another order,
    a CHECK, a collation, a generated column, WITHOUT ROWID), and none with an index of
    another's making (a unique one would make storing one Result delete another)."""
    for kind, table, sql in entries:
        expected = DECLARED.get(str(table))
        if expected is None:
            continue
        if kind == "table":
            allowed = {expected}
            if upgradable and table == "results":
                allowed.add(expected.replace(_PASS_COLUMN, ")"))
            if _squeezed(sql) not in allowed:
                return f"its table {table} is not declared as batchsync declares it"
        elif sql is not None:  # (the indexes of its keys have none)
            return f"its table {table} has an index batchsync does not make"
    return None


# The tables that a journal of the version before holds (its results lack ``pass``); when a
# run was killed while upgrading one, some of the others may be there too.
_V3_TABLES = ("meta", "results")
# Tables added within this version: a journal made before them lacks them (and gets them when
# a run opens it for writing).
_LATER_TABLES = ("submissions",)


def layout_problem(tables: Mapping[str, Sequence[Column]], *, upgradable: bool) -> str | None:
    """What in ``tables`` (``_tables_of``) is not the journal's layout, or None: a table
    missing, a column missing, added or declared otherwise, a trigger (it would rewrite what
    a run stores after the checks). Other tables are left alone: nothing reads them."""
    if _TRIGGERS in tables:
        ours = [name for name, *_ in tables[_TRIGGERS] if name in LAYOUT]
        return f"its table {ours[0]} has a trigger" if ours else "it has a trigger"
    for name, columns in LAYOUT.items():
        found = tables.get(name)
        if found is None:
            if (upgradable and name not in _V3_TABLES) or name in _LATER_TABLES:
                continue
            return f"it has no table {name}"
        expected = list(columns)
        if upgradable and name == "results" and "pass" not in {column[0] for column in found}:
            expected = [column for column in columns if column[0] != "pass"]
        for column in expected:
            if column not in found:
                return f"its table {name} has no column {column[0]} as batchsync makes it"
        for column in found:
            if column not in expected:
                return f"its table {name} has a column {column[0]} batchsync does not make"
    return None


@dataclass(frozen=True)
class Requests:
    """What the input gives as each item's stored request, the failed file's line: ``text``
    of each of ``items`` in input order (``resumed`` reads them only up to the last failure)."""

    items: Iterable[Any]
    text: Callable[[Any], str]


@contextlib.contextmanager
def resumed(
    path: Path,
    identity: Mapping[str, str],
    what: str,
    hint: str,
    requests: Requests | None = None,
) -> Iterator[JournalReader]:
    """A reader of the journal to resume, checked to be one of this layout made for these
    ``what`` (their identity), every row of it trusted (``check``): JournalMismatch naming
    the problem, then ``hint``, otherwise. Checked on a read-only connection before anything
    else opens the file, so a journal refused stays as it was, byte for byte. ``requests``:
    what each failed row's request must be (None: a library's journal, which holds none)."""
    with contextlib.closing(_read_only(path)) as db:
        db.text_factory = _decoded
        try:
            problem = _layout_problem(db)
        except sqlite3.Error as exc:  # not SQLite at all, or unreadable
            problem = f"cannot be read as a batchsync journal ({exc})"
        if problem is not None:
            chosen = _NOT_REPLACED if _foreign(path) else hint
            raise JournalMismatch(f"{path} {problem}: {chosen}")
        try:
            problem = meta_shape_problem(db.execute("SELECT rowid, key, value FROM meta"))
            other = mismatch(_stored_meta(db), identity) if problem is None else None
            if other is not None:
                raise JournalMismatch(f"{path} was made for other {what} ({other}); {hint}")
            problem = problem or check(db, identity, requests)
        except sqlite3.Error as exc:  # damaged past what SQLite can read
            problem = f"it cannot be read ({exc})"
    if problem is not None:
        raise JournalMismatch(f"{path} was altered: {problem}; {hint}")
    reader = JournalReader(path)
    try:
        reader.upgrade()
        yield reader
    finally:
        reader.close()


def _stored_meta(db: sqlite3.Connection) -> dict[str, str]:
    return {str(key): str(value) for key, value in db.execute("SELECT key, value FROM meta")}


# --- what every row must hold before a run trusts it -------------------------------------
# A journal is a file anyone with the owner's rights can edit: each value a run reads is
# checked for its type and range, each JSON text for its shape, the columns beside a record
# against the record (the summary reads the columns, the results file the records), each
# failed item's request against the input, the passes, the runs and the waits against each
# other. A problem is named by its table, row and column, never by the value (a secret, say).

# The largest count (attempts, items, requests, a pass) and the most seconds a journal holds:
# far beyond any run, small enough that no sum of them overflows or loses its units.
_MOST = 2**53
_MOST_SECONDS = 1e9
# The unix seconds a journal's times lie within (1970 to 2514).
_LAST_MOMENT = 2.0**34
# How far a gate's waits may lie outside the runs' time (the wall clock may be set meanwhile).
_CLOCK_SLACK = 3600.0
_RECORD_KEYS = frozenset(Result(0, None, False).to_dict())
_ATTEMPT_KEYS = frozenset(AttemptRecord(1, None, None, 0.0).to_dict())
_KINDS = frozenset(KINDS)
_CONTINUATION_KEYS = frozenset({"url", "page", "position"})


class _NotText:
    """A stored text that is not UTF-8: no reader can take it back."""


_NOT_TEXT = _NotText()


def _decoded(raw: bytes) -> str | _NotText:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return _NOT_TEXT


def _count(value: object, least: int = 0) -> bool:
    return type(value) is int and least <= value <= _MOST


def _number(value: object) -> TypeGuard[float]:
    return type(value) is float or type(value) is int  # (not a bool)


def _seconds(value: object) -> TypeGuard[float]:
    if type(value) is float or type(value) is int:  # (not a bool)
        return 0 <= value <= _MOST_SECONDS  # (NaN is neither)
    return False


def _moment(value: object) -> bool:
    return _number(value) and 0 <= value < _LAST_MOMENT


def _line(value: object) -> bool:
    return isinstance(value, str) and "\n" not in value and "\r" not in value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _json(text: object) -> Any:
    """The value of a stored JSON text; ``_NOT_TEXT`` for anything strict JSON is not."""
    if not isinstance(text, str):
        return _NOT_TEXT
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        return _NOT_TEXT


def _agrees(column: object, stored: object) -> bool:
    """A column's value is the record's (1 is not True, nor 1.0)."""
    return type(column) is type(stored) and column == stored


def _near(column: object, stored: object, terms: int = 1) -> bool:
    """Seconds in a column and in the record: the same, but for the rounding to the
    microsecond (``terms`` times over, for a sum) of columns an earlier batchsync wrote
    unrounded."""
    if not (_seconds(column) and _seconds(stored)):
        return False
    return abs(column - stored) <= 1e-6 * terms + 1e-9 * abs(column)


def attempt_problem(entry: Any) -> bool:
    """Whether one entry of a record's attempt log is not one as batchsync writes it."""
    if not isinstance(entry, dict) or not _ATTEMPT_KEYS <= entry.keys() <= _ATTEMPT_KEYS | {
        "resent"
    }:
        return True
    return not (
        _count(entry["attempt"], 1)
        and _status(entry["status_code"])
        and (entry["error_kind"] is None or entry["error_kind"] in _KINDS)
        and _seconds(entry["elapsed"])
        and (entry["wait"] is None or _seconds(entry["wait"]))
        and (entry["fallback"] is None or _count(entry["fallback"]))
        and isinstance(entry["hedged"], bool)
        and _count(entry.get("resent", 0))
    )


def _status(value: object) -> bool:
    return value is None or (type(value) is int and 100 <= value <= 999)


def record_problem(record: Any, row: Sequence[Any]) -> str | None:
    """What in a parsed record disagrees with the columns of its ``results`` row (``idx``,
    ``ok``, ``error_kind``, ``status_code``, ``attempts``, ``elapsed``, ``backoff``) or is not
    a Result's as batchsync writes it (None: nothing); the column named first."""
    index, ok, kind, status, attempts, elapsed, backoff = row[:7]
    if not isinstance(record, dict) or not _RECORD_KEYS <= record.keys() <= _RECORD_KEYS | {
        "pages"
    }:
        return "record is not a Result as batchsync writes it"
    if not _agrees(index, record["index"]):
        return f"the record of item {index} is not that item's"
    for column, value, stored in (
        ("ok", bool(ok), record["ok"]),
        ("error_kind", kind, record["error_kind"]),
        ("status_code", status, record["status_code"]),
        ("attempts", attempts, record["attempts"]),
    ):
        if not _agrees(value, stored):
            return f"{column} is not the record's"
    if not _near(elapsed, record["elapsed"]):
        return "elapsed is not the record's"
    log = record["attempt_log"]
    if not isinstance(log, list) or any(attempt_problem(entry) for entry in log):
        return "record has an attempt log batchsync does not write"
    if attempts < sum(1 + entry["hedged"] + entry.get("resent", 0) for entry in log):
        return "attempts is fewer than the record's attempt log sent"
    waited = sum(entry["wait"] or 0.0 for entry in log)
    if not _near(backoff, waited, len(log) + 1):
        return "backoff is not the waits of the record's attempt log"
    if not (
        all(record[key] is None or isinstance(record[key], str) for key in _TEXTS)
        and _count(record["redirects"])
        and (record["fallback_used"] is None or _count(record["fallback_used"]))
        and (record.get("pages") is None or _count(record["pages"]))
    ):
        return "record is not a Result as batchsync writes it"
    return None


_TEXTS = ("url", "final_url", "error")


def result_problem(
    row: Sequence[Any], *, size: int, latest: int, paged: bool, requested: bool
) -> str | None:
    """What makes one ``results`` row (its columns in the schema's order) untrustworthy for
    an input of ``size`` items whose last pass is ``latest``, ``paged`` or not, whose failed
    items keep their request (``requested``: the command line's) or not (a library's); None:
    nothing. The column is named first, never its value."""
    index, ok, kind, status, attempts, elapsed, backoff, record, request, resume = row[:10]
    finished, made_in = row[10:12]
    problem = None
    if not 0 <= index < size:
        problem = f"item {index} is not in the input of {size} items"
    elif type(ok) is not int or ok not in (0, 1):
        problem = "ok is not 0 or 1"
    elif kind is not None and kind not in _KINDS:
        problem = "error_kind is not an error kind"
    elif (kind is None) != bool(ok):
        problem = "error_kind does not agree with ok (a failure has one, a success none)"
    elif not _status(status) or (kind == "status" and status is None):
        problem = "status_code is not an HTTP status"
    elif not _count(attempts):
        problem = "attempts is not a count"
    elif not _seconds(elapsed):
        problem = "elapsed is not a number of seconds"
    elif not _seconds(backoff):
        problem = "backoff is not a number of seconds"
    elif finished is not None and not _moment(finished):
        problem = "finished is not a time"
    elif not _count(made_in, 1) or made_in > latest:
        problem = "pass is not a pass the journal recorded"
    else:
        problem = _texts_problem(
            index, ok, record, request, resume, paged=paged, requested=requested
        )
    if problem is not None:
        return problem
    parsed = _json(record)
    try:
        if parsed is _NOT_TEXT or dumps(parsed) != record:
            return "record is not a Result as batchsync writes it"
    except RecursionError:
        return "record nests deeper than this process can read"
    return record_problem(parsed, row)


def _texts_problem(
    index: int,
    ok: int,
    record: object,
    request: object,
    resume: object,
    *,
    paged: bool,
    requested: bool,
) -> str | None:
    """``result_problem`` of a row's texts: its record is one line, its request is there for
    a failure (when the journal keeps them) and only then, where it goes on is a next page."""
    if not isinstance(record, str):
        return "record is not text"
    if not _line(record):
        return f"the record of item {index} is not one line"
    if request is not None and not _line(request):
        return "request is not one line of text"
    if request is not None and not requested:
        return "request is there, but the journal of a library's batch keeps none"
    if request is not None and ok:
        return "request is there for an item that did not fail"
    if request is None and requested and not ok:
        return "request is missing: the failed file needs it to send the item again"
    if resume is None:
        return None
    if not paged:
        return "resume is there for an item that was not paginated"
    if ok:
        return "resume is there for an item that did not fail"
    going_on = _json(resume)
    if not (
        isinstance(going_on, dict)
        and going_on.keys() == _CONTINUATION_KEYS
        and isinstance(going_on["url"], str)
        and _count(going_on["page"], 1)
        and _count(going_on["position"])
    ):
        return "resume is not where a paginated item goes on"
    return None


def pass_problem(number: int, retry: object) -> str | None:
    """What makes a ``passes`` row untrustworthy: the first pass retries nothing, each later
    one the error kinds it names (a sorted JSON list of them; empty: every failure)."""
    if not _count(number, 1):
        return "number is not a pass"
    if number == 1:
        return None if retry is None else "retry is there for the first pass"
    kinds = _json(retry)
    if not (
        isinstance(kinds, list)
        and all(isinstance(kind, str) and kind in _KINDS for kind in kinds)
        and kinds == sorted(set(kinds))
    ):
        return "retry is not a list of error kinds"
    return None


def run_problem(row: Sequence[Any], passes: Iterable[int]) -> str | None:
    """What makes a ``runs`` row (its columns in the schema's order) untrustworthy, given the
    numbers of the passes recorded; None: nothing."""
    number, started, elapsed, items, requests, waits, circuits = row
    if type(number) is not int or number not in passes:
        return "pass is not a pass the journal recorded"
    if not _moment(started):
        return "started is not a time"
    if not _seconds(elapsed):
        return "elapsed is not a number of seconds"
    for column, value in (("items", items), ("requests", requests), ("circuits", circuits)):
        if not _count(value):
            return f"{column} is not a count"
    gates = _json(waits)
    if not isinstance(gates, dict) or not all(
        _gate_name(gate) and _seconds(seconds) for gate, seconds in gates.items()
    ):
        return "waits is not the seconds waited at each gate"
    return None


def _gate_name(name: str) -> bool:
    """A name the summary line can show: a gate's, one short printable line."""
    return 0 < len(name) <= 64 and name.isprintable()


def wait_problem(
    row: Sequence[Any], span: tuple[float, float] | None, gates: Iterable[str]
) -> str | None:
    """What makes a ``waits`` row untrustworthy, given when the runs went (``span``: the
    first start and the last end, None: no run recorded) and the ``gates`` they waited at
    (the same waits, summed by gate); None: nothing."""
    gate, second, seconds = row
    if gate not in gates:
        return "gate is not a gate the runs waited at"
    if type(second) is not int or not _moment(second):
        return "second is not a time"
    if span is None or not span[0] - _CLOCK_SLACK <= second <= span[1] + _CLOCK_SLACK:
        return "second is not within the runs the journal recorded"
    if not _seconds(seconds):
        return "seconds is not a number of seconds"
    return None


# What the values of ``meta`` that have a shape look like (a value of another shape was
# edited, whatever the input): a count, a SHA-256; the others are texts.
_META_SHAPES = {
    "entries": re.compile(r"0|[1-9][0-9]{0,15}"),
    "size": re.compile(r"0|[1-9][0-9]{0,18}"),
    "sha256": re.compile(r"[0-9a-f]{64}"),
}
_META_KEYS = ("schema", "input", "size", "sha256", "entries", "template", "paging")


def meta_shape_problem(rows: Iterable[tuple[int, Any, Any]]) -> str | None:
    """What in the ``meta`` rows (rowid, key, value) no batchsync writes, whatever the input:
    a key of its own, a text, a count or a SHA-256 where one belongs. (A value
    of the right shape but not the input's: made for other input, ``mismatch`` says.)"""
    for rowid, key, value in rows:
        if key not in _META_KEYS:
            return f"meta row {rowid}: key is not one batchsync writes"
        shape = _META_SHAPES.get(key)
        if not isinstance(value, str) or (shape is not None and not shape.fullmatch(value)):
            return f"meta row {rowid}: value of {key} is not one batchsync writes"
    return None


def meta_problem(rows: Iterable[tuple[int, Any, Any]], identity: Mapping[str, str]) -> str | None:
    """What in the ``meta`` rows (rowid, key, value) is not what a journal made for
    ``identity`` holds: each of its keys and the schema's, no other, each value the input's
    (``input``, where it was, aside: a file moved is still the same input)."""
    expected = {key: _storable(value) for key, value in identity.items()}
    seen = set()
    for rowid, key, value in rows:
        if key == "schema":
            seen.add(key)
            continue
        if not isinstance(key, str) or key not in expected:
            return f"meta row {rowid}: key is not one a journal of this input has"
        if not isinstance(value, str) or (key != "input" and value != expected[key]):
            return f"meta row {rowid}: value of {key} is not the input's"
        seen.add(key)
    missing = sorted(expected.keys() - seen)
    return f"meta has no row {missing[0]}" if missing else None


def check(
    db: sqlite3.Connection, identity: Mapping[str, str], requests: Requests | None
) -> str | None:
    """The first thing in the journal ``db`` (of this layout, made for ``identity``) that a
    run cannot trust, named by its table, row and column, or None; ``requests``: what each
    failed item's request must be (None: the journal keeps none). Each table is read once,
    the input up to its last failed item."""
    tables = {str(name) for (name,) in db.execute("SELECT name FROM sqlite_master")}
    problem = meta_problem(db.execute("SELECT rowid, key, value FROM meta"), identity)
    if problem is not None:
        return problem
    numbers: set[int] = set()
    if "passes" in tables:
        for number, retry in db.execute("SELECT number, retry FROM passes"):
            problem = pass_problem(number, retry)
            if problem is not None:
                return f"passes row {number}: {problem}"
            numbers.add(number)
    ran = _runs_problem(db, numbers) if "runs" in tables else _Ran()
    if ran.problem is not None:
        return ran.problem
    if "waits" in tables:
        for rowid, *row in db.execute("SELECT rowid, * FROM waits"):
            problem = wait_problem(row, ran.span, ran.gates)
            if problem is not None:
                return f"waits row {rowid}: {problem}"
    if "submissions" in tables:
        parts = []
        for row in db.execute("SELECT * FROM submissions"):
            problem = submission_problem(row, int(identity["entries"]), numbers or {1})
            if problem is not None:
                return f"submissions row {row[0]}: {problem}"
            parts.append(part_of(row))
        problem = overlap_problem(parts)
        if problem is not None:
            return problem
    columns = [column[0] for column in _tables_of(db)["results"]]
    query = "SELECT * FROM results" if "pass" in columns else "SELECT *, 1 FROM results"
    size, paged, latest = int(identity["entries"]), "paging" in identity, max(numbers, default=1)
    made: Counter[int] = Counter()
    for row in db.execute(query):
        problem = result_problem(
            row, size=size, latest=latest, paged=paged, requested=requests is not None
        )
        if problem is not None:
            return f"results row {row[0]}: {problem}"
        made[row[11]] += 1
    for number, count in sorted(made.items()):
        if number > 1 and count > ran.finished[number]:
            return f"runs of pass {number}: items are fewer than the results of that pass"
    return None if requests is None else _requests_problem(db, requests)


@dataclass
class _Ran:
    """What the ``runs`` rows say: the items the runs of each pass finished, when the first
    started and the last ended (None: no run), the gates they waited at, and the first
    problem with them."""

    finished: Counter[int] = field(default_factory=Counter)
    span: tuple[float, float] | None = None
    gates: set[str] = field(default_factory=set)
    problem: str | None = None


def _runs_problem(db: sqlite3.Connection, numbers: set[int]) -> _Ran:
    """``check`` of the ``runs`` rows: each one trusted (``run_problem``), none repeated,
    a run recorded for each pass."""
    ran = _Ran()
    seen: dict[tuple[Any, Any], int] = {}
    for rowid, *row in db.execute("SELECT rowid, * FROM runs"):
        ran.problem = run_problem(row, numbers)
        if ran.problem is None and (row[0], row[1]) in seen:
            ran.problem = f"it repeats row {seen[row[0], row[1]]}"
        if ran.problem is not None:
            ran.problem = f"runs row {rowid}: {ran.problem}"
            return ran
        seen[row[0], row[1]] = rowid
        ran.finished[row[0]] += row[3]
        ran.gates.update(json.loads(row[5]))
        start, end = row[1], row[1] + row[2]
        ran.span = (
            (start, end) if ran.span is None else (min(ran.span[0], start), max(ran.span[1], end))
        )
    unrun = sorted(numbers - {number for number, _ in seen})
    if unrun:
        ran.problem = f"passes row {unrun[0]}: no run of it is recorded in runs"
    return ran


def _requests_problem(db: sqlite3.Connection, requests: Requests) -> str | None:
    """The first failed item whose stored request is not what the input gives (the failed
    file would send it elsewhere), or None."""
    items = enumerate(requests.items)
    query = "SELECT idx, request FROM results WHERE request IS NOT NULL ORDER BY idx"
    for index, stored in db.execute(query):
        item = next((item for position, item in items if position == index), _NOT_TEXT)
        if item is _NOT_TEXT:
            return f"results row {index}: request is for an item the input does not have"
        if requests.text(item) != stored:
            return f"results row {index}: request is not the input's item {index}"
    return None


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
    ``upgrade`` first (``resumed`` does it). Its rows are read as they are: ``resumed`` checks
    them before a run trusts them.
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

    def parts(self) -> list[Part]:
        """The submissions to a batch endpoint (none for a journal made before them)."""
        try:
            rows = self._db.execute(f"SELECT {COLUMNS} FROM submissions ORDER BY part").fetchall()
        except sqlite3.OperationalError:  # (no such table)
            return []
        return [part_of(row) for row in rows]

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
