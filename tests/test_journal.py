from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from batchsync.core.history import Pass
from batchsync.core.records import dumps
from batchsync.core.result import AttemptRecord, Result
from batchsync.http.spec import RequestSpec
from batchsync.output.resultset import StoredResults
from batchsync.run.batch import Item, identity_of
from batchsync.store.journal import (
    Journal,
    JournalMismatch,
    JournalReader,
    Requests,
    remove,
    resumed,
)
from batchsync.store.journal.checks import (
    meta_problem,
    meta_shape_problem,
    mismatch,
    pass_problem,
    record_problem,
    result_problem,
    run_problem,
    wait_problem,
)
from batchsync.store.journal.schema import LAYOUT, SCHEMA_VERSION, layout_problem
from batchsync.store.journal.writer import linger_for

from .fakeclock import FakeClock

IDENTITY = {"input": "urls.txt", "size": "10", "sha256": "abc", "entries": "3"}


def encode(result: Result, item: object) -> tuple[str, str | None]:
    return json.dumps(result.to_dict()), None if result.ok else json.dumps({"url": item})


def make(index: int, ok: bool = True) -> Result:
    return Result(
        index, f"http://h.test/{index}", ok, status_code=200 if ok else 503, attempts=1,
        error_kind=None if ok else "status", attempt_log=(AttemptRecord(1, 200, None, 0.1),),
    )  # fmt: skip


def test_results_added_from_many_threads_come_back_in_input_order(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, encode, IDENTITY)

    def add_every_fourth(start: int) -> None:
        for i in range(start, 1000, 4):
            journal.add(make(i, i % 3 != 0), f"u{i}")

    threads = [threading.Thread(target=add_every_fourth, args=(start,)) for start in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    journal.close()
    reader = JournalReader(path)
    rows = [(record, request) for _, record, request, _ in reader.finals()]
    assert [json.loads(record)["index"] for record, _ in rows] == list(range(1000))
    assert all((request is None) == (i % 3 != 0) for i, (_, request) in enumerate(rows))
    summary = StoredResults(reader, path).summary
    assert (summary.total, summary.failed) == (1000, 334)
    assert summary.error_kinds == {"status": 334}
    assert reader.meta() == dict(IDENTITY, schema=SCHEMA_VERSION)
    done = reader.outstanding(1200, Pass())
    assert sum(done) == 1000 and done[999] == 1 and done[1000] == 0
    reader.close()


def test_what_is_added_is_readable_before_close(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, encode, IDENTITY)
    journal.add(make(0), "u0")

    def found() -> int:
        reader = JournalReader(path)
        try:
            return sum(reader.outstanding(1, Pass()))
        finally:
            reader.close()

    wait_until(lambda: found() == 1)  # the group commit lands within milliseconds, unloaded
    journal.close()


@pytest.mark.parametrize(
    ("results", "seconds", "linger"),
    [(0, 1.0, 0.0), (999, 1.0, 0.0), (1000, 1.0, 0.02), (2500, 2.0, 0.02), (1500, 2.0, 0.0)],
)
def test_the_writer_lingers_only_in_a_busy_run(results: int, seconds: float, linger: float) -> None:
    assert linger_for(results, seconds) == linger


class CountingConnection:
    """Wraps the writer's connection to note how many results each transaction stored."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.groups: list[int] = []

    def __enter__(self) -> Any:
        return self.inner.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.inner.__exit__(*exc)

    def executemany(self, sql: str, rows: list[Any]) -> Any:
        cursor = self.inner.executemany(sql, rows)
        if "INTO results" in sql and rows:  # (the last one, at close, may store none)
            self.groups.append(len(rows))
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Clock:
    """The writer's clock, moved by the test alone; counts how often it was read."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


class Linger:
    """The writer's sleep: notes each linger and holds it until the test lets it go."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.entered = threading.Event()
        self.go = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        self.entered.set()
        self.go.wait(60)


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.005)


def stored(counting: CountingConnection, results: int) -> Callable[[], bool]:
    return lambda: sum(counting.groups) == results


def test_a_busy_run_commits_in_groups(tmp_path: Path) -> None:
    clock, linger = Clock(), Linger()
    journal = Journal(tmp_path / "j.sqlite3", encode, IDENTITY, clock=clock, sleep=linger)
    counting = journal._db = CountingConnection(journal._db)  # type: ignore[assignment]
    try:
        for index in range(1500):  # 1500 results in the writer's first second: a busy run
            journal.add(make(index), f"u{index}")
        wait_until(stored(counting, 1500))
        # The writer reads its clock once when it starts and once after each commit: wait
        # until it has measured its last group (else it could see the clock moved below).
        wait_until(lambda: clock.reads == 1 + len(counting.groups))
        assert linger.asked == []  # no second seen yet: nothing to go by
        clock.now = 1.0
        journal.add(make(1500), "u1500")  # its commit closes the busy second
        wait_until(stored(counting, 1501))
        assert linger.asked == []
        commits = len(counting.groups)
        journal.add(make(1501), "u1501")  # the writer now lets results gather ...
        assert linger.entered.wait(30), "the writer did not linger in a busy run"
        for index in range(1502, 1700):  # ... while these come in
            journal.add(make(index), f"u{index}")
    finally:
        linger.go.set()
    journal.close()
    assert linger.asked == [0.02]
    assert counting.groups[commits] == 199  # all that came during the linger, in one commit


def test_the_writers_linger_is_a_wait_on_the_runs_clock(tmp_path: Path) -> None:
    clock = FakeClock(start=0.0)
    journal = Journal(tmp_path / "j.sqlite3", encode, IDENTITY, clock=clock)
    counting = journal._db = CountingConnection(journal._db)  # type: ignore[assignment]
    for index in range(1500):  # a busy first second
        journal.add(make(index), f"u{index}")
    wait_until(stored(counting, 1500))
    clock.time = 1.0
    journal.add(make(1500), "u1500")  # its commit closes the busy second
    wait_until(stored(counting, 1501))
    journal.add(make(1501), "u1501")  # the writer lingers, on the clock: no sleep
    journal.close()
    # (once, or twice if the writer measured the busy second before u1500 came)
    assert clock.waited and set(clock.waited) == {0.02}


def test_a_slow_run_commits_each_result_at_once(tmp_path: Path) -> None:
    clock, linger = Clock(), Linger()
    journal = Journal(tmp_path / "j.sqlite3", encode, IDENTITY, clock=clock, sleep=linger)
    counting = journal._db = CountingConnection(journal._db)  # type: ignore[assignment]
    try:
        for index in range(150):  # 50 results a second for three seconds
            clock.now = index / 50
            journal.add(make(index), f"u{index}")
            # A writer that lingered would hold this commit until the end of the test.
            wait_until(stored(counting, index + 1))
    finally:
        linger.go.set()
    journal.close()
    assert linger.asked == []
    assert counting.groups == [1] * 150


def test_adds_after_close_are_ignored(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3", encode, IDENTITY)
    journal.close()
    journal.add(make(0), "late")
    journal.close()
    reader = JournalReader(tmp_path / "j.sqlite3")
    assert list(reader.finals()) == []
    reader.close()


def test_a_writer_failure_surfaces_on_the_next_add(tmp_path: Path) -> None:
    def broken(result: Result, item: object) -> tuple[str, str | None]:
        return "x", None

    journal = Journal(tmp_path / "j.sqlite3", broken, IDENTITY)
    journal._db.execute("DROP TABLE results")
    journal.add(make(0), "u")
    journal._writer.join(timeout=5)
    with pytest.raises(OSError, match="cannot be written"):
        journal.add(make(1), "u")
    with pytest.raises(OSError, match="cannot be written"):
        journal.close()


def test_remove_deletes_the_journal_and_its_wal(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    Journal(path, encode, IDENTITY).close()
    Path(f"{path}-wal").write_bytes(b"")
    assert remove(path) is True
    assert list(tmp_path.iterdir()) == []
    assert remove(path) is False


def test_mismatch_names_what_differs() -> None:
    assert mismatch(IDENTITY, dict(IDENTITY, input="elsewhere/urls.txt")) is None
    assert mismatch(IDENTITY, dict(IDENTITY, sha256="def")) == (
        "its input's SHA-256 was abc, this one's is def"
    )
    assert mismatch(IDENTITY, dict(IDENTITY, entries="4")) == (
        "its input had 3 entries, this one has 4 entries"
    )


def test_result_round_trips_through_its_dict() -> None:
    result = make(5, ok=False)
    assert Result.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_fingerprint_depends_on_every_item_and_their_order() -> None:
    items: list[Item] = ["http://h.test/a", {"url": "http://h.test/b", "id": 1}]
    same: list[Item] = ["http://h.test/a", {"id": 1, "url": "http://h.test/b"}]
    assert identity_of(items) == identity_of(same)
    assert identity_of(items)["entries"] == "2"
    assert identity_of(items) != identity_of(list(reversed(items)))
    specs = [RequestSpec(url="http://h.test/a", method="POST", idempotency_key="k")]
    assert identity_of(specs) == identity_of(list(specs))
    assert identity_of(specs) != identity_of([RequestSpec(url="http://h.test/a")])


def test_the_summary_has_every_percentile_even_for_few_items(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, encode, IDENTITY)
    for index, elapsed in enumerate([0.5, 0.1, 0.3]):
        journal.add(Result(index, f"u{index}", True, attempts=1, elapsed=elapsed), None)
    journal.close()
    reader = JournalReader(path)
    assert StoredResults(reader, path).summary.latency == {"p50": 0.3, "p95": 0.5, "p99": 0.5}
    reader.close()


def test_a_journal_whose_name_holds_uri_characters_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "run?mode=rw#1 %41.sqlite3"
    journal = Journal(path, encode, IDENTITY)
    journal.add(make(0), "u0")
    journal.close()
    reader = JournalReader(path)
    assert sum(reader.outstanding(1, Pass())) == 1
    reader.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no WAL files left


def test_the_journal_and_the_failed_file_are_the_owners_only(tmp_path: Path) -> None:
    from batchsync.cli.output import write_outputs
    from batchsync.store.journal import connect

    old = tmp_path / "old-journal.sqlite3"
    old.touch(mode=0o644)
    old.chmod(0o644)  # as an earlier version left it
    connect(old).close()
    connect(tmp_path / "new-journal.sqlite3").close()
    results, failed = write_outputs(str(tmp_path / "run"), [("{}", '{"url":"http://h.test/"}')])
    assert old.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "new-journal.sqlite3").stat().st_mode & 0o777 == 0o600
    assert failed.stat().st_mode & 0o777 == 0o600
    umask = os.umask(0)
    os.umask(umask)
    assert results.stat().st_mode & 0o777 == 0o666 & ~umask


# --- what a row must hold to be trusted (issue 34) ----------------------------------------


def stored_row(result: Result, request: str | None = None, made_in: int = 1) -> list[Any]:
    """A ``results`` row as the journal stores ``result`` (columns in the schema's order)."""
    backoff = sum(attempt.wait or 0.0 for attempt in result.attempt_log)
    record = dumps(result.to_dict())
    return [result.index, int(result.ok), result.error_kind, result.status_code,
            result.attempts, result.elapsed, backoff, record, request, None, 1.8e9,
            made_in]  # fmt: skip


FAILED = Result(
    2, "http://h.test/2", False, status_code=503, attempts=2, error_kind="status",
    elapsed=0.25, attempt_log=(AttemptRecord(1, 503, "status", 0.1, 0.05),
                               AttemptRecord(2, 503, "status", 0.1)),
)  # fmt: skip


def problem_of(changes: dict[int, Any], *, requested: bool = True) -> str | None:
    row = stored_row(FAILED, '{"url":"http://h.test/2"}', made_in=2)
    for position, value in changes.items():
        row[position] = value
    return result_problem(row, size=3, latest=2, paged=False, requested=requested)


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({0: 3}, "item 3 is not in the input of 3 items"),
        ({1: 2}, "ok is not 0 or 1"),
        ({1: "zz"}, "ok is not 0 or 1"),
        ({1: 1}, "error_kind does not agree with ok"),
        ({2: "bogus"}, "error_kind is not an error kind"),
        ({3: 99}, "status_code is not an HTTP status"),
        ({3: None}, "status_code is not an HTTP status"),
        ({4: -3}, "attempts is not a count"),
        ({4: 1.5}, "attempts is not a count"),
        ({4: 3}, "attempts is not the record's"),
        ({5: "NaN"}, "elapsed is not a number of seconds"),
        ({5: math.inf}, "elapsed is not a number of seconds"),
        ({5: 0.5}, "elapsed is not the record's"),
        ({6: -1.0}, "backoff is not a number of seconds"),
        ({6: 0.0}, "backoff is not the waits of the record's attempt log"),
        ({10: "x"}, "finished is not a time"),
        ({11: 3}, "pass is not a pass the journal recorded"),
        ({7: "{"}, "record is not a Result as batchsync writes it"),
        ({7: "[1]"}, "record is not a Result as batchsync writes it"),
        ({7: dumps(FAILED.to_dict()).replace(":", ": ")}, "record is not a Result as"),
        ({7: dumps(FAILED.to_dict()) + "\n"}, "the record of item 2 is not one line"),
        ({8: None}, "request is missing: the failed file needs it"),
        ({9: '{"url":"http://h.test/2?page=2","page":2,"position":3}'}, "resume is there for"),
    ],
)
def test_a_results_row_names_its_column_that_cannot_be_trusted(
    changes: dict[int, Any], problem: str
) -> None:
    assert problem_of({}) is None
    found = problem_of(changes)
    assert found is not None and found.startswith(problem), found


def test_a_libraries_journal_keeps_no_request_and_a_success_none() -> None:
    assert problem_of({8: None}, requested=False) is None
    assert problem_of({}, requested=False) == (
        "request is there, but the journal of a library's batch keeps none"
    )
    ok = stored_row(make(0), '{"url":"u0"}')
    assert result_problem(ok, size=1, latest=1, paged=False, requested=True) == (
        "request is there for an item that did not fail"
    )


def test_where_a_paginated_failure_goes_on_is_a_next_page() -> None:
    row = stored_row(FAILED, '{"url":"http://h.test/2"}')
    for resume, trusted in [
        ('{"url": "http://h.test/2?page=2", "page": 2, "position": 3}', True),
        ("{", False), ("[1]", False), ('{"url": 1, "page": 2, "position": 3}', False),
        ('{"url": "http://h.test/", "page": 0, "position": 3}', False),
    ]:  # fmt: skip
        row[9] = resume
        found = result_problem(row, size=3, latest=1, paged=True, requested=True)
        assert (found is None) == trusted, resume


def test_a_record_agrees_with_the_columns_beside_it() -> None:
    row = stored_row(FAILED)
    record = json.loads(row[7])
    assert record_problem(record, row) is None
    for key, value, problem in [
        ("ok", True, "ok is not the record's"),
        ("status_code", 500, "status_code is not the record's"),
        ("index", 1, "the record of item 2 is not that item's"),
        ("attempts", 1, "attempts is not the record's"),
        ("attempt_log", [{"attempt": 0}], "record has an attempt log batchsync does not write"),
        ("redirects", -1, "record is not a Result as batchsync writes it"),
    ]:
        assert record_problem(record | {key: value}, row) == problem, key
    assert record_problem({k: v for k, v in record.items() if k != "url"}, row) is not None


def test_passes_runs_and_waits_rows_name_what_cannot_be_trusted() -> None:
    assert pass_problem(1, None) is None and pass_problem(2, "[]") is None
    assert pass_problem(2, '["status","timeout"]') is None
    assert pass_problem(1, "[]") == "retry is there for the first pass"
    for retry in (None, "zz", '{"a":', "[1]", '["bogus"]', '["timeout","status"]'):
        assert pass_problem(2, retry) == "retry is not a list of error kinds", retry
    assert pass_problem(-3, None) == "number is not a pass"
    run = [1, 1.8e9, 2.5, 6, 10, '{"token": 1.5}', 0]
    assert run_problem(run, {1}) is None
    for position, value, problem in [
        (0, 2, "pass is not a pass the journal recorded"),
        (1, "NaN", "started is not a time"),
        (2, math.inf, "elapsed is not a number of seconds"),
        (3, -3, "items is not a count"),
        (4, 2**63 - 1, "requests is not a count"),
        (5, "[1]", "waits is not the seconds waited at each gate"),
        (5, '{"token": NaN}', "waits is not the seconds waited at each gate"),
        (6, "zz", "circuits is not a count"),
    ]:
        assert run_problem([*run[:position], value, *run[position + 1 :]], {1}) == problem
    span, gates = (1.8e9, 1.8e9 + 3), {"token"}
    assert wait_problem(["token", 1_800_000_001, 0.5], span, gates) is None
    assert wait_problem(["zz", 1_800_000_001, 0.5], span, gates) == (
        "gate is not a gate the runs waited at"
    )
    assert wait_problem(["token", 2**40, 0.5], span, gates) == "second is not a time"
    assert wait_problem(["token", 1_700_000_000, 0.5], span, gates) == (
        "second is not within the runs the journal recorded"
    )
    assert wait_problem(["token", 1_800_000_001, -3], span, gates) == (
        "seconds is not a number of seconds"
    )


def test_meta_holds_the_inputs_identity_and_nothing_else() -> None:
    identity = {"input": "urls.txt", "size": "10", "sha256": "a" * 64, "entries": "3"}
    rows = [(n, key, value) for n, (key, value) in enumerate(identity.items(), 1)]
    rows.append((9, "schema", SCHEMA_VERSION))
    assert meta_shape_problem(rows) is None and meta_problem(rows, identity) is None
    assert meta_problem(rows, dict(identity, input="moved/urls.txt")) is None
    assert meta_problem(rows, dict(identity, size="11")) == (
        "meta row 2: value of size is not the input's"
    )
    assert meta_problem(rows[1:], identity) == "meta has no row input"
    for row in [(3, "sha256", "zz"), (4, "entries", "-3"), (4, "entries", "NaN"), (5, None, "x")]:
        assert meta_shape_problem([*rows, row]) is not None, row


def test_the_layout_names_the_table_and_column_that_differ() -> None:
    tables = {name: list(columns) for name, columns in LAYOUT.items()}
    assert layout_problem(tables, upgradable=False) is None
    assert layout_problem({k: v for k, v in tables.items() if k != "passes"}, upgradable=False) == (
        "it has no table passes"
    )
    retyped = [("elapsed", "TEXT", 1, 0) if c[0] == "elapsed" else c for c in tables["runs"]]
    assert layout_problem(tables | {"runs": retyped}, upgradable=False) == (
        "its table runs has no column elapsed as batchsync makes it"
    )
    added = [*tables["waits"], ("note", "TEXT", 0, 0)]
    assert layout_problem(tables | {"waits": added}, upgradable=False) == (
        "its table waits has a column note batchsync does not make"
    )
    older = {"meta": tables["meta"], "results": [c for c in tables["results"] if c[0] != "pass"]}
    assert layout_problem(older, upgradable=True) is None
    assert layout_problem(older, upgradable=False) == (
        "its table results has no column pass as batchsync makes it"
    )


def as_the_cli_stores(result: Result, item: object) -> tuple[str, str | None]:
    """The texts the command line stores: the record, and a failure's request."""
    return dumps(result.to_dict()), None if result.ok else json.dumps({"url": item})


def test_a_failed_items_request_must_be_the_inputs(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    items = ["http://h.test/0", "http://h.test/1", "http://h.test/2"]
    identity = identity_of(items)
    journal = Journal(path, as_the_cli_stores, identity)
    journal.add(make(0), items[0])
    journal.add(replace(FAILED, index=1), items[1])
    journal.close()
    requests = Requests(items, lambda item: json.dumps({"url": item}))
    with resumed(path, identity, "items", "hint", requests) as reader:
        assert reader.record(1) is not None
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("""UPDATE results SET request = '{"url": "http://elsewhere.test/"}'
                      WHERE idx = 1""")
    before = path.read_bytes()
    with (
        pytest.raises(JournalMismatch) as refused,
        resumed(path, identity, "items", "hint", requests),
    ):
        pass
    assert str(refused.value) == (
        f"{path} was altered: results row 1: request is not the input's item 1; hint"
    )
    assert "elsewhere" not in str(refused.value) and path.read_bytes() == before


def test_a_journal_left_with_its_wal_is_checked_there_and_left_as_it_was(tmp_path: Path) -> None:
    """A run killed leaves its last commits in the -wal file: they are checked too, and a
    refusal leaves the journal and its -wal byte for byte."""
    path = tmp_path / "j.sqlite3"
    items = ["http://h.test/0"]
    journal = Journal(path, as_the_cli_stores, identity_of(items))
    journal.add(make(0), items[0])
    journal.close()
    altered_then_killed = (
        "import os, sqlite3, sys; db = sqlite3.connect(sys.argv[1]); "
        "db.execute(\"UPDATE results SET elapsed = 'x'\"); db.commit(); os._exit(0)"
    )
    subprocess.run([sys.executable, "-c", altered_then_killed, str(path)], check=True)
    wal = Path(f"{path}-wal")
    before = (path.read_bytes(), wal.read_bytes())
    assert before[1]
    requests = Requests(items, lambda item: json.dumps({"url": item}))
    refused = pytest.raises(JournalMismatch, match="results row 0: elapsed is not a number")
    with refused, resumed(path, identity_of(items), "items", "hint", requests):
        pass
    assert (path.read_bytes(), wal.read_bytes()) == before


def test_a_trigger_is_refused_as_it_would_rewrite_what_a_run_stores(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    items = ["http://h.test/0"]
    Journal(path, as_the_cli_stores, identity_of(items)).close()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "CREATE TRIGGER moved AFTER INSERT ON results BEGIN "
            "UPDATE results SET request = '{}' WHERE idx = new.idx; END"
        )
    refused = pytest.raises(JournalMismatch, match="was altered: its table results has a trigger")
    with refused, resumed(path, identity_of(items), "items", "hint"):
        pass


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_a_run_interrupted_while_its_journal_is_made_leaves_none_to_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    """Ctrl-C a few ms into a run, as its journal's tables were made: before, the file held
    tables and no input identity, and neither a resume nor --fresh would take it."""
    import batchsync.store.journal.schema as journal_module
    from batchsync import CallBatch

    path = tmp_path / "j.sqlite3"
    made = journal_module._upgrade

    def made_then_interrupted(db: sqlite3.Connection) -> None:
        made(db)
        raise interrupt

    with monkeypatch.context() as patched:
        patched.setattr(journal_module, "_upgrade", made_then_interrupted)
        with pytest.raises(interrupt):
            CallBatch(str, range(3), journal=path, progress=False).run()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == []
    results = CallBatch(str, range(3), journal=path, progress=False).run()
    assert [r.data for r in results] == ["0", "1", "2"]
