from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batchsync.batch import Item, identity_of
from batchsync.history import Pass
from batchsync.journal import (
    SCHEMA_VERSION,
    Journal,
    JournalReader,
    linger_for,
    mismatch,
    remove,
)
from batchsync.result import AttemptRecord, Result
from batchsync.spec import RequestSpec

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
    rows = list(reader.rows())
    assert [json.loads(record)["index"] for record, _ in rows] == list(range(1000))
    assert all((request is None) == (i % 3 != 0) for i, (_, request) in enumerate(rows))
    summary = reader.summary()
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
    assert list(reader.rows()) == []
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
        "its sha256 was abc, the input's is def"
    )
    assert mismatch(IDENTITY, dict(IDENTITY, entries="4")) == "its entries was 3, the input's is 4"


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
    assert reader.summary().latency == {"p50": 0.3, "p95": 0.5, "p99": 0.5}
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
    from batchsync.journal import connect

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
