"""A journal is a file anyone with the owner's rights can edit: each row is checked before a
run trusts it (issue 26). A next page keeps the item's origin, an index lies within the
input, a record is one line; otherwise the run is refused (exit 2, nothing sent) or, for a
next page, the item starts over from its first page."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import batchsync.store.journal.schema as journal_module
from batchsync import Batch
from batchsync.store.journal import JournalUnusable

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args], check=False, cwd=cwd, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def tamper(journal: Path, statement: str, *args: object) -> None:
    with contextlib.closing(sqlite3.connect(journal)) as db, db:
        assert db.execute(statement, args).rowcount == 1


@contextlib.contextmanager
def listener() -> Iterator[socket.socket]:
    """A port on 127.0.0.1 that takes connections and answers none."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_a_next_page_moved_to_another_origin_is_not_taken_up(
    server: MockServerProcess, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{server.url}/pages/page?total=10&size=3&fail=3&fail_times=1&tag={tag}"
    (tmp_path / "in.txt").write_text(url + "\n")
    options = ["in.txt", "--paginate", "page:page", "--items", "items", "-o", "out", "-q",
               "-H", "X-Secret: cnry-header", "--timeout", "2"]  # fmt: skip
    first = run_cli(*options, "--attempts", "1", cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    journal = tmp_path / "out-journal.sqlite3"
    with listener() as elsewhere:
        port = elsewhere.getsockname()[1]
        moved = f"http://127.0.0.1:{port}/pages/page?total=10&size=3&page=3&tag={tag}"
        tamper(journal, "UPDATE results SET resume = json_set(resume, '$.url', ?)", moved)
        again = run_cli(*options, "--resume", cwd=tmp_path)
        assert not connected(elsewhere)  # (the item's -H header never went there)
    assert again.returncode == 0, again.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "out-results.jsonl").open()]
    assert [item["n"] for item in record["data"]] == list(range(10))  # (from its first page)


@pytest.fixture
def finished(server: MockServerProcess, tmp_path: Path) -> Path:
    """A finished run of three items; its journal."""
    urls = [f"{server.url}/ok/{uuid.uuid4().hex[:8]}" for _ in range(3)]
    (tmp_path / "in.txt").write_text("\n".join(urls) + "\n")
    done = run_cli("in.txt", "-o", "out", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "out-journal.sqlite3"


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ("UPDATE results SET idx = -1 WHERE idx = 2", "item -1 is not in the input"),
        ("UPDATE results SET idx = 7 WHERE idx = 2", "item 7 is not in the input"),
        (
            "UPDATE results SET record = replace(record, ',', ',' || char(10)) WHERE idx = 1",
            "the record of item 1 is not one line",
        ),
        (  # (rows swapped: each record says which item it is)
            "UPDATE results SET record = json_set(record, '$.index', 0) WHERE idx = 1",
            "the record of item 1 is not that item's",
        ),
    ],
)
def test_a_tampered_row_is_refused_before_anything_is_sent(
    finished: Path, statement: str, problem: str
) -> None:
    tamper(finished, statement)
    before = {p.name: p.read_bytes() for p in finished.parent.iterdir()}
    done = run_cli("in.txt", "-o", "out", "--resume", cwd=finished.parent)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: ") and len(done.stderr.splitlines()) == 1
    assert problem in done.stderr
    assert {p.name: p.read_bytes() for p in finished.parent.iterdir()} == before


def test_a_batch_refuses_a_row_out_of_range(server: MockServerProcess, tmp_path: Path) -> None:
    urls = [f"{server.url}/ok/{uuid.uuid4().hex[:8]}" for _ in range(2)]
    journal = tmp_path / "j.sqlite3"
    Batch(urls, journal=journal, progress=False).run()
    tamper(journal, "UPDATE results SET idx = -1 WHERE idx = 1")
    with pytest.raises(JournalUnusable, match="item -1 is not in the input"):
        Batch(urls, journal=journal, progress=False)


def test_a_batch_does_not_take_up_a_moved_next_page(
    server: MockServerProcess, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{server.url}/pages/page?total=10&size=3&fail=3&fail_times=1&tag={tag}"
    journal = tmp_path / "j.sqlite3"

    def batch(attempts: int) -> Batch:
        return Batch(
            [url], journal=journal, attempts=attempts, headers={"X-Secret": "cnry"},
            paginate="page:page", page_items="items", timeout=2, progress=False,
        )  # fmt: skip

    assert not batch(1).run()[0].ok
    with listener() as elsewhere:
        moved = f"http://127.0.0.1:{elsewhere.getsockname()[1]}/pages/page?page=3&tag={tag}"
        tamper(journal, "UPDATE results SET resume = json_set(resume, '$.url', ?)", moved)
        again = batch(3).run()
        assert not connected(elsewhere)
    assert [item["n"] for item in again[0].data] == list(range(10))


# --- every table, every column: a generated matrix of tamperings (issue 34) ---------------
# A real journal (a run against the mock server, then a retry of its failures: two passes,
# their runs, the seconds waited at the rate's gate, a failed paginated item that holds its
# next page) is copied for each case, one value or one table of it altered, and the resume
# refused before anything is sent or written: exit 2 (a ValueError for a Batch), one line
# that names the table, no traceback, the journal and every output byte for byte as they were.


def schema_tables() -> dict[str, list[str]]:
    """Every table of the journal's schema and its columns, read back from sqlite_master and
    PRAGMA table_info of a database made from it: what the matrix alters."""
    with contextlib.closing(sqlite3.connect(":memory:")) as db:
        db.executescript(journal_module.SCHEMA)
        query = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        names = [str(name) for (name,) in db.execute(query)]
        return {
            name: [str(c[1]) for c in db.execute(f"PRAGMA table_info({name})")] for name in names
        }


TABLES = schema_tables()
# The tables a live run fills (``submissions`` holds nothing in a live run's journal:
# tests/test_batch_api.py alters it in the journal of a run through a batch endpoint; nor
# ``spend`` and ``charges`` in one without a spend cap: tests/test_spend_cap.py and
# tests/test_batch_spend.py alter them).
LIVE_TABLES = sorted(set(TABLES) - {"submissions", "spend", "charges"})
# What each column is set to, whatever its type: NULL, text of another type, a negative
# number, NaN as SQLite keeps it (a text: a float NaN is stored as NULL), an infinity, JSON
# that does not parse, JSON of another shape, an integer past any count.
VALUES: dict[str, object] = {
    "null": None, "text": "zz", "negative": -3, "nan": "NaN", "infinite": math.inf,
    "broken_json": "{", "json_shape": "[1]", "huge": 2**63 - 1,
}  # fmt: skip
# What is done to a whole table: dropped, a row copied (a new key where the key is a rowid),
# a row deleted.
WHOLE = ("drop", "duplicate", "delete")
# Tamperings a journal may hold and be trusted with: (table, column or None for the whole
# table, tampering, the key of the row in meta or None for any row) and why. The run goes on,
# and its outputs agree with those of the journal as it was.
HARMLESS: dict[tuple[str, str | None, str, str | None], str] = {
    **{
        ("meta", "value", tampering, "input"): "where INPUT was: only the words of a refusal "
        "show it, and a file moved is still the same input (its SHA-256 and count say so)"
        for tampering in VALUES
    },
    ("results", "finished", "null", None): "when an item finished, for the report's charts: "
    "a Result stored without one (made outside a run's workers) is left off them",
    ("results", "resume", "null", None): "where a failed paginated item goes on: without it, "
    "a retry sends it again from its first page, as when its next page is on another origin",
    ("results", None, "delete", None): "a journal without an item's Result is what a run "
    "killed before it finished leaves: the item is sent again",
    ("waits", None, "delete", None): "the seconds waited by second, for the report's chart "
    "(the summary's waits are the runs'): a run killed before its end records none",
}
# How a refusal of an altered ``meta`` may read instead of naming the table: its schema row
# or a value of the input's identity altered is a journal of another batchsync, or of
# another input, and refused as that.
OTHER_JOURNAL = ("was made by an older batchsync", "was made by another batchsync",
                 "was made for other", "is not a batchsync journal")  # fmt: skip


@dataclass(frozen=True)
class Case:
    table: str
    column: str | None  # None: the whole table
    tampering: str
    rowid: int | None = None

    def __str__(self) -> str:
        return f"{self.table}.{self.column or '*'} {self.tampering} row {self.rowid}"


def cases(journal: Path, table: str) -> list[Case]:
    """Every tampering of ``table`` in ``journal``: each value of each row, then the table."""
    with contextlib.closing(sqlite3.connect(journal)) as db:
        rowids = [int(r) for (r,) in db.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
    assert rowids, f"the journal's table {table} is empty: the matrix would not alter it"
    found = [
        Case(table, column, tampering, rowid)
        for column in TABLES[table]
        for rowid in rowids
        for tampering in VALUES
    ]
    found.append(Case(table, None, "drop"))
    found += [Case(table, None, what, rowid) for what in WHOLE[1:] for rowid in rowids]
    return found


def apply(journal: Path, case: Case) -> bool | None:
    """Alter ``journal`` as ``case`` says: True; False when SQLite itself refuses the edit (a
    NOT NULL, a key, a rowid that must be an integer: no journal can hold it); None when it
    changes nothing (the value is there already)."""
    table, column, rowid = case.table, case.column, case.rowid
    with contextlib.closing(sqlite3.connect(journal)) as db:
        try:
            with db:
                if case.tampering == "drop":
                    db.execute(f"DROP TABLE {table}")
                elif case.tampering == "delete":
                    db.execute(f"DELETE FROM {table} WHERE rowid = ?", (rowid,))
                elif case.tampering == "duplicate":
                    info = list(db.execute(f"PRAGMA table_info({table})"))
                    rowid_key = [c[1] for c in info if c[5] == 1 and c[2].upper() == "INTEGER"]
                    kept = ", ".join(c[1] for c in info if c[1] not in rowid_key)
                    db.execute(
                        f"INSERT INTO {table} ({kept}) SELECT {kept} FROM {table} WHERE rowid = ?",
                        (rowid,),
                    )
                else:
                    value = VALUES[case.tampering]
                    changed = db.execute(
                        f"UPDATE {table} SET {column} = ? WHERE rowid = ? AND {column} IS NOT ?",
                        (value, rowid, value),
                    ).rowcount
                    if not changed:
                        return None
        except (sqlite3.IntegrityError, sqlite3.DatabaseError) as exc:
            assert "constraint" in str(exc) or "mismatch" in str(exc), exc
            return False
    return True


def harmless(case: Case, journal: Path) -> str | None:
    """Why ``case`` is allowed (``HARMLESS``), or None."""
    key = None
    if case.table == "meta" and case.rowid is not None:
        with contextlib.closing(sqlite3.connect(journal)) as db:
            (key,) = db.execute("SELECT key FROM meta WHERE rowid = ?", (case.rowid,)).fetchone()
    for row_key in (key, None):
        reason = HARMLESS.get((case.table, case.column, case.tampering, row_key))
        if reason is not None:
            return reason
    return None


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Each file's bytes and mtime (the lock file aside: it is the run's own)."""
    return {
        path.name: (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.iterdir())
        if not path.name.endswith(".lock")
    }


def refusal_problem(case: Case, code: int, message: str) -> str | None:
    """What is wrong with how a run refused the journal of ``case`` (None: nothing)."""
    lines = message.splitlines()
    said = message.partition(" was altered: ")[2]  # (after the journal's path)
    named = [name for name in TABLES if re.search(rf"\b{name}\b", said)]
    if case.table == "meta" and not named:
        named = [phrase for phrase in OTHER_JOURNAL if phrase in message]
    if code != 2 or len(lines) != 1 or "Traceback" in message or not named:
        return f"exit {code}: {message!r}"
    if case.tampering == "text" and "zz" in message:
        return f"the value is shown: {message!r}"
    return None


def copy_of(source: Path, folder: Path) -> Path:
    shutil.copytree(source, folder)
    return folder


# The CLI's options for the source run and its resumes: pages of items, one attempt each.
PAGED = ["--paginate", "page:page", "--items", "items", "--attempts", "1", "--no-progress"]


def source_lines(base: str) -> list[str]:
    """The input: items answered whole, one failing at its second page once (it succeeds
    when retried, going on from there), one failing there always (its next page stays in the
    journal), one failing at its first page, one that is no URL."""
    tag = uuid.uuid4().hex[:8]
    page = f"{base}/pages/page?size=3"
    return [
        f"{page}&total=4&tag=a{tag}", f"{page}&total=7&fail=2&fail_times=1&tag=b{tag}",
        f"{page}&total=7&fail=2&tag=c{tag}", f"{page}&total=4&fail=1&tag=d{tag}",
        "not a url", f"{page}&total=2&tag=e{tag}",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def cli_source(server: MockServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with INPUT, and the journal and outputs of a run of it, then of a retry of its
    failures (``--rate``: its gate waits, so that every table holds rows)."""
    folder = tmp_path_factory.mktemp("cli-source")
    (folder / "in.txt").write_text("\n".join(source_lines(server.url)) + "\n")
    for extra in ([], ["--retry-failed"]):
        done = run_cli("in.txt", "-o", "out", *PAGED, "--rate", "5", *extra, cwd=folder)
        assert done.returncode == 1, done.stderr
    for stale in folder.glob("*.lock"):
        stale.unlink()
    return folder


def in_process(folder: Path, *extra: str) -> tuple[int, str]:
    """The command line run in this process on ``folder`` (a process each would take the
    matrix minutes): its exit status and standard error (a traceback's text if it raised)."""
    from batchsync.cli import main

    logger = logging.getLogger("batchsync")
    handlers, level = list(logger.handlers), logger.level
    err = io.StringIO()
    args = [str(folder / "in.txt"), "-o", str(folder / "out"), *PAGED, "--resume", *extra]
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    except BaseException:
        return -1, "Traceback (in process)\n" + traceback.format_exc()
    finally:
        logger.handlers[:], logger.level = handlers, level
    return code, err.getvalue()


def outputs(folder: Path) -> tuple[list[tuple[int, bool, str | None]], bytes, tuple[int, ...]]:
    """What a run's outputs say: each Result's index, ok and kind, the failed file, and the
    summary's counts (items, ok, failed) as the results file gives them."""
    results = [json.loads(line) for line in (folder / "out-results.jsonl").open()]
    said = [(r["index"], r["ok"], r["error_kind"]) for r in results]
    ok = sum(r["ok"] for r in results)
    return said, (folder / "out-failed.jsonl").read_bytes(), (len(results), ok, len(results) - ok)


def summary_counts(stderr: str) -> tuple[int, ...]:
    found = re.search(r"^(\d+) items?: (\d+) ok, (\d+) failed", stderr, re.MULTILINE)
    assert found, stderr
    return tuple(int(n) for n in found.groups())


@pytest.fixture(scope="module")
def cli_baseline(cli_source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Any]:
    folder = copy_of(cli_source, tmp_path_factory.mktemp("cli-baseline") / "run")
    code, err = in_process(folder)
    assert code == 1, err
    assert summary_counts(err) == outputs(folder)[2]
    return code, outputs(folder)


def test_the_source_journal_has_every_table_of_the_schema(cli_source: Path) -> None:
    with contextlib.closing(sqlite3.connect(cli_source / "out-journal.sqlite3")) as db:
        query = "SELECT name FROM sqlite_master WHERE type = 'table'"
        assert sorted(str(name) for (name,) in db.execute(query)) == sorted(TABLES)
        assert db.execute("SELECT COUNT(*) FROM passes").fetchone() == (2,)
        assert db.execute("SELECT COUNT(*) FROM results WHERE resume IS NOT NULL").fetchone()[0]


@pytest.mark.parametrize("table", LIVE_TABLES)
def test_every_tampering_of_a_table_is_refused_by_the_command_line(
    cli_source: Path, cli_baseline: tuple[int, Any], tmp_path: Path, table: str
) -> None:
    failures, refused, impossible = [], 0, 0
    for number, case in enumerate(cases(cli_source / "out-journal.sqlite3", table)):
        folder = copy_of(cli_source, tmp_path / str(number))
        journal = folder / "out-journal.sqlite3"
        reason = harmless(case, journal)
        applied = apply(journal, case)
        if not applied:
            impossible += applied is False
            continue
        before = snapshot(folder)
        code, err = in_process(folder)
        if reason is None:
            problem = refusal_problem(case, code, err)
            if problem is None and snapshot(folder) != before:
                problem = "the journal or an output changed"
            refused += problem is None
        else:
            agreed = code == cli_baseline[0] and outputs(folder) == cli_baseline[1]
            problem = None if agreed and summary_counts(err) == outputs(folder)[2] else err
        if problem is not None:
            failures.append(f"{case}: {problem}")
        shutil.rmtree(folder)
    assert not failures, "\n".join(failures)
    assert refused, "nothing was refused"


@pytest.fixture(scope="module")
def batch_source(
    server: MockServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any], list[tuple[bool, str | None]]]:
    """A folder with a library Batch's journal of the same kind of items (run, then its
    failures retried), the Batch's arguments, and each Result's ok and kind."""
    folder = tmp_path_factory.mktemp("batch-source")
    arguments: dict[str, Any] = {
        "items": source_lines(server.url), "paginate": "page:page", "page_items": "items",
        "attempts": 1, "progress": False,
    }  # fmt: skip
    batch = Batch(**arguments, journal=folder / "j.sqlite3", rate=5)
    batch.run()
    results = batch.run(retry_failed=True)
    for stale in folder.glob("*.lock"):
        stale.unlink()
    return folder, arguments, [(r.ok, r.error_kind) for r in results]


@pytest.mark.parametrize("table", LIVE_TABLES)
def test_every_tampering_of_a_table_is_refused_by_a_batch(
    batch_source: tuple[Path, dict[str, Any], list[tuple[bool, str | None]]],
    tmp_path: Path,
    table: str,
) -> None:
    source, arguments, expected = batch_source
    failures, refused = [], 0
    for number, case in enumerate(cases(source / "j.sqlite3", table)):
        folder = copy_of(source, tmp_path / str(number))
        journal = folder / "j.sqlite3"
        reason = harmless(case, journal)
        if not apply(journal, case):
            continue
        before = snapshot(folder)
        try:
            batch = Batch(**arguments, journal=journal)
        except ValueError as exc:
            problem = refusal_problem(case, 2, str(exc)) if reason is None else f"refused: {exc}"
            if problem is None and snapshot(folder) != before:
                problem = "the journal changed"
            refused += problem is None
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
        else:
            problem = "trusted" if reason is None else None
            if reason is not None and [(r.ok, r.error_kind) for r in batch.run()] != expected:
                problem = "its Results differ"
        if problem is not None:
            failures.append(f"{case}: {problem}")
        shutil.rmtree(folder)
    assert not failures, "\n".join(failures)
    assert refused, "nothing was refused"


# The tamperings the third hostile pass found (issue 34, rows 2 and 3), one table or more
# each, through the command line as a user runs it (a process of its own): --resume and
# --retry-failed alike refuse them before anything is sent or written.
FOUND = [
    ("runs", "UPDATE runs SET elapsed = 'NaN'"),
    ("runs", "UPDATE runs SET waits = 'zz'"),
    ("runs", "UPDATE runs SET waits = '[1]'"),
    ("passes", """UPDATE passes SET retry = '{"a":' WHERE number = 2"""),
    ("results", "UPDATE results SET resume = '{' WHERE resume IS NOT NULL"),
    ("results", "DROP TABLE results"),
    ("passes", "DROP TABLE passes"),
    ("results", "UPDATE results SET elapsed = 'x' WHERE idx = 1"),
    ("results", "UPDATE results SET request = NULL WHERE ok = 0"),
    ("results", "UPDATE results SET ok = 1 - ok"),
    ("results", "UPDATE results SET attempts = -3"),
    (  # (the failed file would send it elsewhere)
        "results",
        "UPDATE results SET request = json_set(request, '$.url', 'http://127.0.0.1:9/x') "
        "WHERE ok = 0",
    ),
    ("waits", "UPDATE waits SET seconds = -1"),
    ("meta", "UPDATE meta SET value = 'zz' WHERE key = 'sha256'"),
]


@pytest.mark.parametrize("continuing", ["--resume", "--retry-failed"])
@pytest.mark.parametrize("found", FOUND, ids=[statement for _, statement in FOUND])
def test_a_tampering_found_is_refused_by_the_command_line(
    server: MockServerProcess,
    cli_source: Path,
    tmp_path: Path,
    found: tuple[str, str],
    continuing: str,
) -> None:
    table, statement = found
    folder = copy_of(cli_source, tmp_path / "run")
    with contextlib.closing(sqlite3.connect(folder / "out-journal.sqlite3")) as db, db:
        db.execute(statement)
    before, sent = snapshot(folder), server.stats()["requests"]
    done = run_cli("in.txt", "-o", "out", *PAGED, continuing, cwd=folder)
    assert refusal_problem(Case(table, None, "found"), done.returncode, done.stderr) is None
    assert done.stderr.startswith("Error: ") and table in done.stderr
    assert snapshot(folder) == before
    assert server.stats()["requests"] == sent


# What the columns do not show: a journal rebuilt with each table declared otherwise, or
# given an index of its own, has the same PRAGMA table_info and is refused all the same.
def rebuilt(journal: Path, schema: str) -> None:
    """``journal`` made anew from ``schema``, every row copied."""
    fresh = journal.with_name("rebuilt.sqlite3")
    with contextlib.closing(sqlite3.connect(fresh)) as db:
        db.executescript(schema)
        db.execute("ATTACH ? AS old", (str(journal),))
        with db:
            for table in TABLES:
                db.execute(f"INSERT INTO main.{table} SELECT * FROM old.{table}")
        db.execute("DETACH old")
    fresh.replace(journal)


def evil(a: str, b: str) -> int:
    return 0


REDECLARED = {
    # idx no longer the rowid: it could hold NULL, text or 4.5
    "key_descending": ("idx INTEGER PRIMARY KEY,", "idx INTEGER PRIMARY KEY DESC,"),
    # storing the next pass's Results fails after its requests went out
    "check": ("DEFAULT 1\n", "DEFAULT 1 CHECK (pass < 3)\n"),
}
ADDED = {
    # storing one failure deletes the other's Result, on every resume
    "unique_index": "CREATE UNIQUE INDEX u ON results(ok) WHERE ok = 0 AND pass = 3",
    "collated_index": "CREATE INDEX c ON results(error_kind COLLATE evil)",
    "generated_column": "ALTER TABLE results ADD COLUMN g TEXT AS (json('{')) VIRTUAL",
}


@pytest.mark.parametrize("case", ["as_written", *REDECLARED, *ADDED])
def test_a_table_declared_otherwise_is_refused(
    cli_source: Path, cli_baseline: tuple[int, Any], tmp_path: Path, case: str
) -> None:
    folder = copy_of(cli_source, tmp_path / "run")
    journal = folder / "out-journal.sqlite3"
    old, new = REDECLARED.get(case, ("", ""))
    assert old in journal_module.SCHEMA
    rebuilt(journal, journal_module.SCHEMA.replace(old, new))
    if case in ADDED:
        with contextlib.closing(sqlite3.connect(journal)) as db:
            db.create_collation("evil", evil)
            db.execute(ADDED[case])
    before = snapshot(folder)
    code, err = in_process(folder, "--retry-failed")
    if case == "as_written":  # the rebuilding itself changes nothing a run trusts
        assert code == cli_baseline[0], err
        return
    assert code == 2 and len(err.splitlines()) == 1, err
    assert re.search(r"was altered: its table \w+ (is not declared|has an index)", err), err
    assert snapshot(folder) == before


def test_a_gate_name_the_summary_cannot_show_is_refused(cli_source: Path, tmp_path: Path) -> None:
    folder = copy_of(cli_source, tmp_path / "run")
    journal = folder / "out-journal.sqlite3"
    forged = json.dumps({"rate\n2 items: 2 ok, 0 failed": 0.5})
    tamper(journal, "UPDATE runs SET waits = ? WHERE rowid = 1", forged)
    before = snapshot(folder)
    code, err = in_process(folder)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "runs row 1: waits is not the seconds waited at each gate" in err
    assert snapshot(folder) == before
