"""The journal's file: its tables, how one is made, opened and upgraded, and whether a file
is a journal of this layout at all.

The ``meta`` table records what the journal was made for (the input's identity) and its
``schema``, so that a run does not resume a journal made for other input, by an older
batchsync, or by something else altogether. A file that is not a batchsync journal is never
written to, replaced nor deleted.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

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
CREATE TABLE IF NOT EXISTS spend (
    attempt INTEGER PRIMARY KEY,
    reserved INTEGER NOT NULL,
    spent INTEGER
);
CREATE TABLE IF NOT EXISTS charges (
    part INTEGER PRIMARY KEY,
    attempt INTEGER NOT NULL,
    reserved INTEGER NOT NULL
);
"""
# ``passes``: each pass over the items (the first; then each retry of the failures, ``retry``
# the JSON list of the error kinds it retried, empty for all); ``results.pass``: the pass that
# made each Result. ``runs``: what each process (or batch ``run()``) did, and ``waits`` the
# seconds its attempts waited at each gate by unix second, summed: a resumed run's report and
# summary cover every process that worked on it. ``submissions``: each part of a run sent
# through a provider's batch endpoint (``submissions.py``); ``spend``: each attempt's
# reservation under a spend cap, and what it spent once settled (``spend.py``); ``charges``:
# the ``spend`` row holding each part's reservation until the part is settled. A journal made
# before these has none until a run goes on with it.

# The ``meta`` row that marks a journal of this layout; journals without it are refused.
SCHEMA_VERSION = "batchsync-journal 4"
# Journals of this layout are brought up to SCHEMA_VERSION when opened: version 3 lacked the
# passes, the runs and the waits (its runs count from their next process on).
_UPGRADABLE = "batchsync-journal 3"


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


def create(path: Path, meta: Mapping[str, str]) -> None:
    """A new journal, made whole beside ``path`` and then moved there: a run interrupted or
    killed while it makes one leaves no journal (the next run starts over) or one that knows
    its input, never a file that no run can go on with nor ``--fresh`` replace."""
    making = path.with_name(f".{path.name}.{os.getpid()}.new")
    try:
        with contextlib.closing(connect(making)) as db, db:
            db.execute("BEGIN")
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta_rows(meta))
        making.replace(path)  # (the lock beside it keeps any other run out meanwhile)
    finally:
        for leftover in (making, *(Path(f"{making}{end}") for end in ("-wal", "-shm"))):
            leftover.unlink(missing_ok=True)


def meta_rows(meta: Mapping[str, str]) -> list[tuple[str, str]]:
    """The ``meta`` rows of a journal made for ``meta`` (the input's identity)."""
    return [(key, storable(value)) for key, value in meta.items()] + [("schema", SCHEMA_VERSION)]


def _upgrade(db: sqlite3.Connection) -> None:
    """Create what is missing of this layout; a journal of the version before gains its new
    column and tables."""
    db.executescript(SCHEMA)
    columns = {str(row[1]) for row in db.execute("PRAGMA table_info(results)")}
    if "pass" not in columns:
        db.execute("ALTER TABLE results ADD COLUMN pass INTEGER NOT NULL DEFAULT 1")
    if db.execute("SELECT 1 FROM meta WHERE key = 'schema'").fetchone() is not None:
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (SCHEMA_VERSION,))


def storable(text: str) -> str:
    """``text`` as SQLite can store it: a file name that is not UTF-8 (its bytes kept by
    Python as lone surrogates) keeps them as backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def upgrade(db: sqlite3.Connection) -> None:
    """Bring a journal of the version before up to this layout (to go on with it; a journal
    only looked at stays as it was)."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if row is None or row[0] != SCHEMA_VERSION:
        _upgrade(db)
        db.commit()


def remove(path: Path) -> bool:
    """Delete a journal and its WAL files; True when there was one. A file there that is not
    a batchsync journal of any version is never deleted: JournalMismatch."""
    problem = foreign(path)
    if problem is not None:
        raise JournalMismatch(f"{path} {problem}: {NOT_REPLACED}")
    existed = path.exists()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return existed


NOT_REPLACED = "only a batchsync journal is replaced: move it away, or give another path"


def foreign(path: Path) -> str | None:
    """Why the file at ``path`` is no batchsync journal of any version (None: it is one,
    an empty file, or nothing)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        with contextlib.closing(read_only(path)) as db:
            query = "SELECT 1 FROM sqlite_master WHERE name = 'meta'"
            ours = db.execute(query).fetchone() is not None
    except sqlite3.Error as exc:
        return f"cannot be read as a batchsync journal ({exc})"
    return None if ours else "is not a batchsync journal"


def read_only(path: Path) -> sqlite3.Connection:
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


def open_for_reading(path: Path) -> sqlite3.Connection:
    """A connection to read a journal of this layout; JournalMismatch for anything else
    (not SQLite, another program's database, an older layout, an unreadable file).

    The check runs on a read-only connection, so a file that is not ours stays exactly as it
    was. Ours is then read on a plain connection: closing the last connection to a journal
    folds its WAL back in and removes the -wal and -shm files, which a read-only one cannot.
    """
    try:
        with contextlib.closing(read_only(path)) as check:
            problem = file_problem(check)
    except sqlite3.Error as exc:  # not SQLite at all, or unreadable
        problem = f"cannot be read as a batchsync journal ({exc})"
    if problem is not None:
        raise JournalMismatch(f"{path} {problem}")
    return sqlite3.connect(path, check_same_thread=False)


# A schema row as batchsync writes one (any other value is not shown: it could be anything).
_VERSION = re.compile(r"batchsync-journal [0-9]{1,4}")
# Each column as ``PRAGMA table_info`` gives it: name, declared type, NOT NULL, key position.
Column = tuple[str, str, int, int]
# Where ``tables_of`` lists the tables that have triggers (no table can be named so).
_TRIGGERS = " triggers"


def file_problem(db: sqlite3.Connection) -> str | None:
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
    problem = layout_problem(tables_of(db), upgradable=upgradable) or declared_problem(
        db.execute("SELECT type, tbl_name, sql FROM sqlite_master"), upgradable=upgradable
    )
    return None if problem is None else f"was altered: {problem}"


def tables_of(db: sqlite3.Connection) -> dict[str, list[Column]]:
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
    their columns (``tables_of``) and their CREATE statements (``_squeezed``)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.executescript(schema)
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
        return tables_of(db), {str(name): _squeezed(sql) for name, sql in db.execute(query)}


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
_LATER_TABLES = ("submissions", "spend", "charges")


def layout_problem(tables: Mapping[str, Sequence[Column]], *, upgradable: bool) -> str | None:
    """What in ``tables`` (``tables_of``) is not the journal's layout, or None: a trigger (it
    would rewrite what a run stores after the checks), a table missing, a column missing,
    added or declared otherwise. Other tables are left alone: nothing reads them."""
    if _TRIGGERS in tables:
        ours = [name for name, *_ in tables[_TRIGGERS] if name in LAYOUT]
        return f"its table {ours[0]} has a trigger" if ours else "it has a trigger"
    for name, made in LAYOUT.items():
        found = tables.get(name)
        if found is None:
            if not ((upgradable and name not in _V3_TABLES) or name in _LATER_TABLES):
                return f"it has no table {name}"
            continue
        problem = _columns_problem(name, made, found, upgradable=upgradable)
        if problem is not None:
            return problem
    return None


def _columns_problem(
    name: str, made: Sequence[Column], found: Sequence[Column], *, upgradable: bool
) -> str | None:
    """A column of table ``name`` missing, added or declared otherwise, or None."""
    # (a results table of the version before may lack its pass)
    older = upgradable and name == "results" and all(column[0] != "pass" for column in found)
    columns = [column for column in made if not (older and column[0] == "pass")]
    missing = [column[0] for column in columns if column not in found]
    if missing:
        return f"its table {name} has no column {missing[0]} as batchsync makes it"
    added = [column[0] for column in found if column not in columns]
    return f"its table {name} has a column {added[0]} batchsync does not make" if added else None
