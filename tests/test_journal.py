from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from batchsync.batch import Item, identity_of
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
    done = reader.done(1200)
    assert sum(done) == 1000 and done[999] == 1 and done[1000] == 0
    reader.close()


def test_what_is_added_is_readable_before_close(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, encode, IDENTITY)
    journal.add(make(0), "u0")
    for _ in range(200):  # the group commit lands within milliseconds
        reader = JournalReader(path)
        found = sum(reader.done(1))
        reader.close()
        if found:
            break
        threading.Event().wait(0.01)
    assert found == 1
    journal.close()


@pytest.mark.parametrize(
    ("results", "seconds", "linger"),
    [(0, 1.0, 0.0), (999, 1.0, 0.0), (1000, 1.0, 0.02), (2500, 2.0, 0.02), (1500, 2.0, 0.0)],
)
def test_the_writer_lingers_only_in_a_busy_run(results: int, seconds: float, linger: float) -> None:
    assert linger_for(results, seconds) == linger


class CountingConnection:
    """Wraps the writer's connection to note when each transaction begins."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.begun: list[float] = []

    def __enter__(self) -> Any:
        return self.inner.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self.inner.__exit__(*exc)

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "BEGIN":
            self.begun.append(time.monotonic())
        return self.inner.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_busy_run_commits_in_groups_a_slow_one_at_once(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3", encode, IDENTITY)
    counting = journal._db = CountingConnection(journal._db)  # type: ignore[assignment]
    started = time.monotonic()
    for index in range(4800):  # 3000 results a second for 1.6 s, however coarse the sleeps
        journal.add(make(index), f"u{index}")
        time.sleep(max(0.0, started + index / 3000 - time.monotonic()))
    busy_end = time.monotonic()
    journal.close()
    late = [t for t in counting.begun if t > busy_end - 0.5]
    assert busy_end - started < 2.4  # the pace held above 2000 results a second
    assert len(late) <= 0.5 / 0.02 + 10  # one commit per 20 ms once the rate was seen

    slow = Journal(tmp_path / "slow.sqlite3", encode, IDENTITY)
    counting = slow._db = CountingConnection(slow._db)  # type: ignore[assignment]
    for index in range(20):
        slow.add(make(index), f"u{index}")
        time.sleep(0.02)
    slow.close()
    assert len(counting.begun) >= 18  # each result committed as soon as it came


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
    assert sum(reader.done(1)) == 1
    reader.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no WAL files left


def test_the_journal_and_the_failed_file_are_the_owners_only(tmp_path: Path) -> None:
    from batchsync.journal import connect
    from batchsync.output import write_outputs

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
