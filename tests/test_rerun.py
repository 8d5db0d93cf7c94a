"""Runs are safe to repeat: no run replaces another's work unless told to (--fresh), failures
are retried in place (--retry-failed, Batch.run(retry_failed=True), ResultSet.retry_failed),
and the numbers of a resumed or retried run cover all of it. CLI runs against the real mock
server; the rules themselves without a network."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import batchsync
from batchsync import Result, ResultSet, fetch_all, run_all
from batchsync.core.history import Pass, Stint, difference, merged_timeline, totals
from batchsync.core.result import AttemptRecord, added_to, error_kinds
from batchsync.output.resultset import StoredResults
from batchsync.run.batch import encode_result, identity_of
from batchsync.store.journal import Journal, JournalReader

from .mockserver import MockServerProcess


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def start_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def results_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def digest(*paths: Path) -> list[str]:
    return [hashlib.sha256(path.read_bytes()).hexdigest() for path in paths]


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.02)


def summary_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if " items: " in line)


def mixed_urls(server: MockServerProcess, folder: Path, ok: int = 6) -> dict[str, str]:
    """INPUT with ``ok`` fine items, one 404 (fails for good), one that fails twice with 503
    and then works; returns the targets by role."""
    key = uuid.uuid4().hex[:8]
    targets = {f"ok{n}": f"/ok/{key}-{n}" for n in range(ok)}
    targets["missing"] = f"/404/{key}"
    targets["flaky"] = f"/503-then-ok/{key}/x?after=2"
    lines = [server.url + target for target in targets.values()]
    (folder / "urls.txt").write_text("\n".join(lines) + "\n")
    return targets


# -- the rules, without a network ------------------------------------------------------------


def test_a_retry_pass_redoes_only_earlier_failures_of_its_kinds() -> None:
    first = Pass()
    assert not first.redoes(False, "status", 1)  # the first pass redoes nothing
    every = first.retrying(())
    assert every == Pass(2, frozenset())
    assert every.redoes(False, "status", 1) and every.redoes(False, "timeout", 1)
    assert not every.redoes(True, None, 1)  # successes are kept
    assert not every.redoes(False, "status", 2)  # already redone in this pass
    some = every.retrying(["timeout"])
    assert some.redoes(False, "timeout", 2) and not some.redoes(False, "status", 1)
    assert (first.describe(), every.describe(), some.describe()) == (
        "run", "retry of every failure", "retry of timeout",
    )  # fmt: skip


def test_a_later_result_counts_the_attempts_and_time_of_the_earlier() -> None:
    earlier = Result(
        3, "u", False, attempts=2, error_kind="status", elapsed=1.5, status_code=503,
        attempt_log=(
            AttemptRecord(1, 503, "status", 0.5, 1.0), AttemptRecord(2, 503, "status", 0.5)
        ),
    )  # fmt: skip
    later = Result(3, "u", True, attempts=1, elapsed=0.25, status_code=200, data={"a": 1},
                   attempt_log=(AttemptRecord(1, 200, None, 0.25),))  # fmt: skip
    both = added_to(earlier, later)
    assert (both.ok, both.data, both.status_code, both.error_kind) == (True, {"a": 1}, 200, None)
    assert both.attempts == 3 and both.elapsed == 1.75
    assert [r.attempt for r in both.attempt_log] == [1, 2, 3]
    assert both.attempt_log[2].status_code == 200


def test_totals_and_differences_of_what_each_process_did() -> None:
    assert totals([]).elapsed is None
    stints = [
        Stint(Pass(), 100.0, 2.0, 5, 7, {"cooldown": 1.5}, 1),
        Stint(Pass(2, frozenset()), 200.0, 1.0, 2, 3, {"cooldown": 0.5, "token": 2.0}),
    ]
    ran = totals(stints)
    assert (ran.elapsed, ran.waits, ran.circuits_opened) == (
        3.0, {"cooldown": 2.0, "token": 2.0}, 1,
    )  # fmt: skip
    assert difference({"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 1.0}) == {"a": 2.0}
    assert merged_timeline({("a", 1): 1.0}, {("a", 1): 0.5, ("b", 2): 1.0}) == {
        ("a", 1): 1.5, ("b", 2): 1.0,
    }  # fmt: skip


def test_error_kinds_are_checked() -> None:
    assert error_kinds(["status", "timeout"]) == {"status", "timeout"}
    with pytest.raises(ValueError, match="'bogus' is not an error kind"):
        error_kinds(["status", "bogus"])


def test_a_result_set_no_batch_made_cannot_be_retried() -> None:
    with pytest.raises(ValueError, match="does not know its items"):
        ResultSet([Result(0, "u", False, error_kind="status")]).retry_failed()


def test_a_journal_of_the_version_before_is_upgraded_and_resumed(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE results (idx INTEGER PRIMARY KEY, ok INTEGER NOT NULL, error_kind TEXT,"
        " status_code INTEGER, attempts INTEGER NOT NULL, elapsed REAL NOT NULL,"
        " backoff REAL NOT NULL, record TEXT NOT NULL, request TEXT, resume TEXT,"
        " finished REAL);"
    )
    identity = identity_of(["a", "b"], strict=True)
    meta = [*identity.items(), ("schema", "batchsync-journal 3")]
    db.executemany("INSERT INTO meta VALUES (?, ?)", meta)
    record = Result(0, None, True, attempts=1, data="A").to_dict()
    db.execute(
        "INSERT INTO results VALUES (0, 1, NULL, NULL, 1, 0.0, 0, ?, NULL, NULL, 1.0)",
        (json.dumps(record, separators=(",", ":")),),
    )
    db.commit()
    db.close()
    calls: list[str] = []

    def upper(item: str) -> str:
        calls.append(item)
        return item.upper()

    rs = run_all(upper, ["a", "b"], journal=path, progress=False)
    assert calls == ["b"] and [r.data for r in rs] == ["A", "B"]
    reader = JournalReader(path)
    assert reader.meta()["schema"] == "batchsync-journal 4"
    assert [s.items for s in reader.stints()] == [1]
    reader.close()


# -- the library -----------------------------------------------------------------------------


class Flaky:
    """Fails each item's first ``fails`` calls with a timeout (retryable), and the items in
    ``broken`` with an HTTP-like 404 (terminal) until ``mend()``."""

    def __init__(self, fails: int = 0, broken: tuple[int, ...] = ()) -> None:
        self.fails, self.broken = fails, set(broken)
        self.calls: dict[int, int] = {}

    def mend(self) -> None:
        self.broken.clear()

    def __call__(self, item: int) -> int:
        self.calls[item] = self.calls.get(item, 0) + 1
        if item in self.broken:
            raise HttpLikeError(404)
        if self.calls[item] <= self.fails:
            raise TimeoutError("slow")
        return item * 10


class HttpLikeError(Exception):
    def __init__(self, status_code: int) -> None:
        super().__init__(f"HTTP {status_code}")
        self.status_code = status_code


def no_wait() -> batchsync.Backoff:
    return batchsync.Backoff(base=0.001, max=0.001, jitter=0)


def test_retry_failed_sends_only_the_failures_again_and_merges_them_in_order() -> None:
    fn = Flaky(broken=(2, 5))
    rs = run_all(fn, list(range(8)), attempts=2, backoff=no_wait(), progress=False)
    assert [r.index for r in rs.failed] == [2, 5] and fn.calls[2] == 1  # 404: not retried
    fn.mend()
    again = rs.retry_failed()
    assert [r.index for r in again] == list(range(8))
    assert all(r.ok for r in again) and [r.data for r in again] == [n * 10 for n in range(8)]
    assert fn.calls == {n: 2 if n in (2, 5) else 1 for n in range(8)}  # only the failures
    assert [again[2].attempts, again[0].attempts] == [2, 1]  # both passes counted
    assert [entry.attempt for entry in again[2].attempt_log] == [1, 2]
    assert rs[2].ok is False  # the set it came from is as it was
    assert [s.passing.describe() for s in again.stints] == ["run", "retry of every failure"]
    assert again.summary().requests_sent == 10


def test_retry_failed_narrowed_to_kinds_and_with_other_options() -> None:
    fn = Flaky(fails=5, broken=(1,))
    rs = run_all(fn, [0, 1, 2], attempts=1, backoff=no_wait(), progress=False)
    assert [r.error_kind for r in rs] == ["timeout", "status", "timeout"]
    again = rs.retry_failed(kinds=["timeout"], attempts=10)  # with more attempts
    assert again[0].ok and again[2].ok and not again[1].ok
    assert fn.calls[1] == 1  # its kind was not asked for
    assert again[0].attempts == fn.calls[0] == 6
    with pytest.raises(ValueError, match="not an error kind"):
        rs.retry_failed(kinds=["nope"])


def test_batch_retry_with_a_journal_is_resumable_and_keeps_the_run_numbers(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "j.sqlite3"
    fn = Flaky(broken=(1, 3))
    first = batchsync.CallBatch(fn, [0, 1, 2, 3], journal=journal, progress=False)
    first.run()
    elapsed = first.results.summary().elapsed
    assert elapsed is not None and elapsed > 0
    # A new session over the same journal has the whole run's numbers, not its own 0 s.
    loaded = batchsync.CallBatch(fn, [0, 1, 2, 3], journal=journal, progress=False)
    assert str(loaded.results.summary()) == str(first.results.summary())
    fn.mend()
    merged = loaded.run(retry_failed=["status"])
    assert all(r.ok for r in merged) and fn.calls == {0: 1, 1: 2, 2: 1, 3: 2}
    reader = JournalReader(journal)
    assert [s.passing for s in reader.stints()] == [Pass(), Pass(2, frozenset({"status"}))]
    assert str(StoredResults(reader, journal).summary) == str(merged.summary())
    reader.close()
    with pytest.raises(ValueError, match="retry_failed: name at least one error kind"):
        loaded.run(retry_failed=[])


def test_a_batch_read_back_from_its_journal_shows_the_summary_its_run_showed(
    tmp_path: Path,
) -> None:
    """Seconds a hair from where the summary line rounds them (an item's 0.0124996 s shows as
    0.012, its record's 0.0125 as 0.013; a wait of 0.04999996 s as 0.0, its record's 0.05 as
    0.1) are counted as the journal keeps them: a new session over the journal, which reads
    the records back, shows the summary the session that ran the batch showed, byte for byte,
    circuits included, and sends nothing."""
    path, url = tmp_path / "j.sqlite3", "http://h.test/a"
    made = Result(
        0, url, False, status_code=503, attempts=2, error_kind="status", error="HTTP 503",
        elapsed=0.0124996,
        attempt_log=(
            AttemptRecord(1, 503, "status", 0.005, 0.04999996),
            AttemptRecord(2, 503, "status", 0.0075),
        ),
    )  # fmt: skip
    stint = Stint(Pass(), time.time(), 3.0, 1, 2, {"breaker": 1.5}, 2)
    journal = Journal(
        path, encode_result, identity_of([url]), passing=Pass(), progress=lambda: stint
    )
    journal.add(made, url)
    journal.close()
    ran = totals([stint])  # (what the session that made the Result shows: Batch.results)
    shown = ResultSet([made], ran.elapsed, ran.waits, ran.circuits_opened).summary()
    loaded = batchsync.Batch([url], journal=path, progress=False)
    again = [loaded.results.summary(), loaded.run().summary()]
    assert [str(summary) for summary in again] == [str(shown)] * 2
    assert str(shown) == (
        "1 item: 0 ok, 1 failed (status 1); 2 requests (2.00 per item) in 3.00 s, 1/s; "
        "latency p50 0.013 s, p95 0.013 s, p99 0.013 s; waited: backoff 0.1 s, breaker 1.5 s; "
        "2 circuits opened"
    )


def test_an_interrupted_retry_pass_is_finished_by_the_next_run(tmp_path: Path) -> None:
    journal = tmp_path / "j.sqlite3"
    calls: dict[int, int] = {}
    stop_at: list[int] = []

    def fn(item: int) -> int:
        calls[item] = calls.get(item, 0) + 1
        if calls[item] == 1:
            raise HttpLikeError(404)
        if stop_at and item == stop_at[0]:
            raise KeyboardInterrupt
        return item

    items = list(range(6))
    batchsync.CallBatch(fn, items, journal=journal, progress=False, concurrency=1).run()
    stop_at.append(3)
    batch = batchsync.CallBatch(fn, items, journal=journal, progress=False, concurrency=1)
    with pytest.raises(KeyboardInterrupt):
        batch.run(retry_failed=True)
    stop_at.clear()
    # A new session goes on with the interrupted pass: the items it had not redone.
    rest = batchsync.CallBatch(fn, items, journal=journal, progress=False, concurrency=1)
    assert rest.pending > 0
    rs = rest.run()
    assert all(r.ok for r in rs)
    assert all(count <= 3 for count in calls.values()) and calls[0] == 2


def test_batch_refuses_a_journal_made_for_other_items_unless_fresh(tmp_path: Path) -> None:
    journal = tmp_path / "j.sqlite3"
    run_all(str.upper, ["a", "b"], journal=journal, progress=False)
    with pytest.raises(ValueError, match=r"j\.sqlite3 was made for other items.*fresh=True"):
        batchsync.CallBatch(str.upper, ["c"], journal=journal)
    rs = run_all(str.upper, ["c"], journal=journal, fresh=True, progress=False)
    assert [r.data for r in rs] == ["C"]
    assert batchsync.CallBatch(str.upper, ["c"], journal=journal).pending == 0


# -- the command line ------------------------------------------------------------------------


@pytest.mark.integration
def test_rerunning_the_failed_file_never_touches_the_run_it_came_from(
    server: MockServerProcess, tmp_path: Path
) -> None:
    mixed_urls(server, tmp_path)
    first = run_cli("urls.txt", "--attempts", "1", "--no-progress", cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    outputs = [tmp_path / f"urls-{name}" for name in ("results.jsonl", "failed.jsonl")]
    kept = digest(*outputs, tmp_path / "urls.txt")
    assert len(results_of(outputs[0])) == 8
    second = run_cli("urls-failed.jsonl", "--attempts", "3", "--no-progress", cwd=tmp_path)
    assert second.returncode == 1, second.stderr
    assert digest(*outputs, tmp_path / "urls.txt") == kept
    assert len(results_of(tmp_path / "urls-failed-results.jsonl")) == 2
    assert (tmp_path / "urls-failed-journal.sqlite3").exists()


@pytest.mark.integration
def test_an_output_that_would_be_the_input_is_refused_before_sending(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    given = tmp_path / "x-results.jsonl"
    given.write_text(f"{server.url}/ok/{key}\n")
    run = run_cli("x-results.jsonl", "-o", "x", "--no-progress", cwd=tmp_path)
    assert run.returncode == 2
    assert "would be the input" in run.stderr and "Traceback" not in run.stderr
    assert server.count(f"/ok/{key}") == 0 and given.read_text() == f"{server.url}/ok/{key}\n"


@pytest.mark.integration
def test_a_prefix_holding_a_journal_is_refused_without_resume_retry_or_fresh(
    server: MockServerProcess, tmp_path: Path
) -> None:
    targets = mixed_urls(server, tmp_path)
    first = run_cli("urls.txt", "--attempts", "1", "--no-progress", cwd=tmp_path)
    assert first.returncode == 1
    files = sorted(p for p in tmp_path.iterdir() if p.name.startswith("urls-"))
    before = digest(*files)
    again = run_cli("urls.txt", "--no-progress", cwd=tmp_path)
    assert again.returncode == 2
    message = again.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert str(tmp_path / "urls.txt") in message and "8 of 8 items done, 2 failed" in message
    assert "--resume" in message and "--retry-failed" in message and "--fresh" in message
    assert digest(*files) == before
    assert server.count(targets["ok0"]) == 1
    fresh = run_cli("urls.txt", "--fresh", "--attempts", "1", "--no-progress", cwd=tmp_path)
    assert fresh.returncode == 1
    assert "--fresh: replaced the journal of a run of" in fresh.stderr
    assert server.count(targets["ok0"]) == 2
    both = run_cli("urls.txt", "--fresh", "--resume", cwd=tmp_path)
    assert both.returncode == 2 and "give one" in both.stderr


@pytest.mark.integration
def test_outputs_whose_journal_is_gone_are_not_replaced(
    server: MockServerProcess, tmp_path: Path
) -> None:
    mixed_urls(server, tmp_path)
    assert run_cli("urls.txt", "--attempts", "1", "--no-progress", cwd=tmp_path).returncode == 1
    (tmp_path / "urls-journal.sqlite3").unlink()
    kept = digest(tmp_path / "urls-results.jsonl")
    again = run_cli("urls.txt", "--no-progress", cwd=tmp_path)
    assert again.returncode == 2 and "urls-results.jsonl exists" in again.stderr
    assert digest(tmp_path / "urls-results.jsonl") == kept


@pytest.mark.integration
def test_retry_failed_sends_the_failures_again_and_writes_the_whole_input(
    server: MockServerProcess, tmp_path: Path
) -> None:
    targets = mixed_urls(server, tmp_path)
    first = run_cli("urls.txt", "--attempts", "1", "--no-progress", cwd=tmp_path)
    assert first.returncode == 1
    # Narrowed to a kind nothing failed with: nothing is sent, nothing changes.
    files = [tmp_path / "urls-results.jsonl", tmp_path / "urls-report.html"]
    before = digest(*files)
    none = run_cli("urls.txt", "--retry-failed=timeout", "--no-progress", cwd=tmp_path)
    assert none.returncode == 1 and digest(*files) == before
    assert summary_line(none.stderr) == summary_line(first.stderr)
    # Bare, before INPUT: every failure, each with a fresh budget of attempts.
    retried = run_cli(
        "--retry-failed", "urls.txt", "--attempts", "2", "--no-progress", cwd=tmp_path
    )
    assert retried.returncode == 1, retried.stderr
    results = results_of(tmp_path / "urls-results.jsonl")
    assert [r["index"] for r in results] == list(range(8))
    flaky, missing = results[7], results[6]
    assert flaky["ok"] and flaky["attempts"] == 3 and len(flaky["attempt_log"]) == 3
    assert not missing["ok"] and missing["attempts"] == 2
    assert all(server.count(targets[f"ok{n}"]) == 1 for n in range(6))
    assert server.count(targets["missing"]) == 2
    failed = results_of(tmp_path / "urls-failed.jsonl")
    assert failed == [{"url": server.url + targets["missing"]}]
    assert "11 requests" in summary_line(retried.stderr)
    report = (tmp_path / "urls-report.html").read_text()
    assert "retry of every failure" in report and "<table id='passes'>" in report
    bad = run_cli("urls.txt", "--retry-failed=status,nope", cwd=tmp_path)
    assert bad.returncode == 2 and "'nope' is not an error kind" in bad.stderr


@pytest.mark.integration
def test_retry_failed_needs_a_journal_and_resume_for_items_never_done(
    server: MockServerProcess, tmp_path: Path
) -> None:
    mixed_urls(server, tmp_path)
    nothing = run_cli("urls.txt", "--retry-failed", cwd=tmp_path)
    assert nothing.returncode == 2 and "no failures to retry" in nothing.stderr
    slow = [f"{server.url}/ok/{uuid.uuid4().hex}?delay=0.3" for _ in range(40)]
    (tmp_path / "slow.txt").write_text("\n".join(slow) + "\n")
    process = start_cli("slow.txt", "-c", "2", "--no-progress", cwd=tmp_path)
    wait_until((tmp_path / "slow-journal.sqlite3").exists)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    alone = run_cli("slow.txt", "--retry-failed", cwd=tmp_path)
    assert alone.returncode == 2 and "add --resume" in alone.stderr
    refused = run_cli("slow.txt", cwd=tmp_path)
    assert refused.returncode == 2 and "of 40 items done" in refused.stderr
    both = run_cli(
        "slow.txt", "-c", "8", "--resume", "--retry-failed", "--no-progress", cwd=tmp_path
    )
    assert both.returncode == 0, both.stderr
    assert [r["index"] for r in results_of(tmp_path / "slow-results.jsonl")] == list(range(40))


@pytest.mark.integration
def test_a_resumed_run_counts_every_process_and_a_resume_that_sends_nothing_changes_nothing(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    # The first item holds every host for 1 s (a 429 with Retry-After: 1, the cooldown
    # global: a host's own hold would end as it answers the others): a cooldown wait.
    lines = [f"{server.url}/429-once/{key}?retry_after=1"]
    lines += [f"{server.url}/ok/{key}-{n}?delay=0.2" for n in range(40)]
    (tmp_path / "urls.txt").write_text("\n".join(lines) + "\n")
    process = start_cli(
        "urls.txt", "-c", "2", "--cooldown", "global", "--no-progress", cwd=tmp_path
    )
    wait_until(lambda: server.count(f"/ok/{key}-4?delay=0.2") > 0)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    first = summary_line(stderr)
    assert "cooldown" in first
    resumed = run_cli("urls.txt", "-c", "4", "--resume", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    reader = JournalReader(tmp_path / "urls-journal.sqlite3")
    stints = reader.stints()
    summary = StoredResults(reader, tmp_path / "urls-journal.sqlite3").summary
    reader.close()
    assert len(stints) == 2
    assert summary.requests_sent == 42 == sum(s.requests for s in stints)
    assert summary.elapsed == pytest.approx(sum(s.elapsed for s in stints))
    assert summary.waits["cooldown"] >= stints[0].waits["cooldown"] > 0
    line = summary_line(resumed.stderr)
    assert "42 requests" in line and "cooldown" in line
    assert f"in {summary.elapsed:.2f} s" in line
    # Converting a finished run sends nothing: the report and the summary stay as they were.
    report = digest(tmp_path / "urls-report.html")
    converted = run_cli("urls.txt", "--resume", "--format", "csv", "--no-progress", cwd=tmp_path)
    assert converted.returncode == 0, converted.stderr
    assert summary_line(converted.stderr) == line
    assert digest(tmp_path / "urls-report.html") == report
    assert (tmp_path / "urls-results.csv").exists()


@pytest.mark.integration
def test_an_interrupted_retry_is_finished_by_resume(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    targets = [f"/503-then-ok/{key}-{n}/x?after=1&delay=0.2" for n in range(30)]
    (tmp_path / "urls.txt").write_text("".join(server.url + t + "\n" for t in targets))
    first = run_cli("urls.txt", "--attempts", "1", "-c", "8", "--no-progress", cwd=tmp_path)
    assert first.returncode == 1 and "30 failed" in first.stderr
    process = start_cli("urls.txt", "--retry-failed", "-c", "1", "--no-progress", cwd=tmp_path)
    wait_until(lambda: sum(server.count(t) for t in targets) >= 34)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    command = stderr.split("resume with: ", 1)[1].splitlines()[0]
    assert command.endswith("urls.txt -c 1 --no-progress --resume")
    resumed = run_cli("urls.txt", "-c", "4", "--resume", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert [server.count(t) for t in targets] == [2] * 30  # each failure sent again once
    results = results_of(tmp_path / "urls-results.jsonl")
    assert all(r["ok"] and r["attempts"] == 2 for r in results)


@pytest.mark.integration
def test_output_folders_are_made_and_stdin_keeps_batch(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    (tmp_path / "urls.txt").write_text(f"{server.url}/ok/{key}\n")
    deep = run_cli("urls.txt", "-o", "out/sub/x", "--no-progress", cwd=tmp_path)
    assert deep.returncode == 0, deep.stderr
    assert len(results_of(tmp_path / "out/sub/x-results.jsonl")) == 1
    piped = subprocess.run(
        [sys.executable, "-m", "batchsync", "-", "--no-progress"], cwd=tmp_path,
        input=f"{server.url}/ok/{key}\n", capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert (tmp_path / "batch-results.jsonl").exists()


def test_version_and_a_bare_command(tmp_path: Path) -> None:
    version = run_cli("--version", cwd=tmp_path)
    assert (
        version.returncode == 0 and version.stdout.strip() == f"batchsync {batchsync.__version__}"
    )
    bare = run_cli(cwd=tmp_path)
    assert bare.returncode == 2
    assert "--help" in bare.stderr and "Traceback" not in bare.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_library_form_of_the_default_prefix(tmp_path: Path) -> None:
    from batchsync.cli.command import default_prefix

    assert default_prefix("urls.txt") == "urls"
    assert default_prefix("data/urls-failed.jsonl") == "urls-failed"
    assert default_prefix("-") == "batch"
    # A pipe's name (/dev/stdin, /dev/fd/63) says nothing of the run: named as stdin is;
    # a named FIFO keeps its name.
    assert default_prefix("/dev/stdin") == "batch"
    fifo = tmp_path / "feed.txt"
    os.mkfifo(fifo)
    assert default_prefix(str(fifo)) == "feed"


def test_fetch_all_results_retry_in_place(server: MockServerProcess) -> None:
    key = uuid.uuid4().hex[:8]
    urls = [f"{server.url}/ok/{key}", f"{server.url}/503-then-ok/{key}/y?after=2"]
    rs = fetch_all(urls, attempts=1, progress=False)
    assert [r.ok for r in rs] == [True, False] and rs[1].error_kind == "status"
    again = rs.retry_failed(attempts=2, backoff=no_wait())
    assert [r.ok for r in again] == [True, True] and again[1].attempts == 3
    assert [r.url for r in again] == urls
    assert server.count(f"/ok/{key}") == 1


# -- what an adversarial review found --------------------------------------------------------


@pytest.mark.integration
def test_a_paginated_item_that_failed_partway_is_a_finished_failure_retried_from_its_page(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    pages = f"/pages/link/{key}?total=10&size=2&fail=3&fail_times=2&tag={key}"
    lines = [server.url + pages, f"{server.url}/ok/{key}", f"{server.url}/404/{key}"]
    (tmp_path / "p.txt").write_text("\n".join(lines) + "\n")
    args = ("--paginate", "link", "--no-progress")
    first = run_cli("p.txt", *args, "--attempts", "2", cwd=tmp_path)
    assert first.returncode == 1 and "3 items: 1 ok, 2 failed" in first.stderr
    refused = run_cli("p.txt", *args, cwd=tmp_path)
    assert refused.returncode == 2 and "3 of 3 items done, 2 failed" in refused.stderr
    retried = run_cli("p.txt", *args, "--retry-failed=status", cwd=tmp_path)
    assert retried.returncode == 1, retried.stderr
    paged = results_of(tmp_path / "p-results.jsonl")[0]
    assert paged["ok"] and paged["pages"] == 5 and len(paged["data"]) == 5
    assert paged["attempts"] == 2 + 2 + 1 + 2  # pages 1-2, page 3 twice, then 3-5
    first_page = [
        e for e in server.log(key) if "pages" in e["target"] and "page=" not in e["target"]
    ]
    assert len(first_page) == 1  # it went on from page 3, not from page 1


def test_a_refused_run_leaves_a_journal_of_the_version_before_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/a\n")
    path = tmp_path / "urls-journal.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
        "CREATE TABLE results (idx INTEGER PRIMARY KEY, ok INTEGER NOT NULL, error_kind TEXT,"
        " status_code INTEGER, attempts INTEGER NOT NULL, elapsed REAL NOT NULL,"
        " backoff REAL NOT NULL, record TEXT NOT NULL, request TEXT, resume TEXT,"
        " finished REAL);"
    )
    db.executemany(
        "INSERT INTO meta VALUES (?, ?)",
        [("schema", "batchsync-journal 3"), ("entries", "1"), ("input", "elsewhere")],
    )
    db.commit()
    db.close()
    before = digest(path)
    refused = run_cli("urls.txt", cwd=tmp_path)
    assert refused.returncode == 2 and "a run of elsewhere: 0 of 1 item done" in refused.stderr
    other = run_cli("urls.txt", "--resume", cwd=tmp_path)  # made for other input
    assert other.returncode == 2 and "was made for other input" in other.stderr
    assert digest(path) == before


def test_retry_failed_keeps_the_batch_journal_and_kinds_are_checked_alike(
    tmp_path: Path,
) -> None:
    fn = Flaky(broken=(1,))
    rs = run_all(fn, [0, 1], journal=tmp_path / "j.sqlite3", progress=False)
    for change in ({"journal": tmp_path / "other.sqlite3"}, {"fresh": True}):
        with pytest.raises(ValueError, match="keeps the batch's journal"):
            rs.retry_failed(**change)
    with pytest.raises(ValueError, match="name at least one error kind"):
        rs.retry_failed(kinds=[])
    fn.mend()
    again = rs.retry_failed(kinds="status")  # one kind, as a word
    assert [r.ok for r in again] == [True, True] and fn.calls == {0: 1, 1: 2}


@pytest.mark.integration
def test_a_batch_retry_goes_on_with_a_paginated_item_from_its_page(
    server: MockServerProcess,
) -> None:
    key = uuid.uuid4().hex[:8]
    url = f"{server.url}/pages/link/{key}?total=10&size=2&fail=3&fail_times=2&tag={key}"
    rs = fetch_all([url], paginate="link", attempts=2, backoff=no_wait(), progress=False)
    assert not rs[0].ok and rs[0].pages == 2
    again = rs.retry_failed()
    assert again[0].ok and again[0].pages == 5 and len(again[0].data) == 5
    first_page = [e for e in server.log(key) if "page=" not in e["target"]]
    assert len(first_page) == 1


@pytest.mark.integration
def test_a_killed_process_still_counts_in_the_run(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    targets = [f"/ok/{key}-{n}?delay=0.25" for n in range(40)]
    (tmp_path / "urls.txt").write_text("".join(server.url + t + "\n" for t in targets))
    process = start_cli("urls.txt", "-c", "4", "--no-progress", cwd=tmp_path)
    wait_until(lambda: sum(server.count(t) for t in targets) >= 16)
    time.sleep(0.3)
    process.kill()
    process.wait(timeout=10)
    resumed = run_cli("urls.txt", "-c", "4", "--resume", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    reader = JournalReader(tmp_path / "urls-journal.sqlite3")
    stints = reader.stints()
    reader.close()
    assert len(stints) == 2
    killed = stints[0]
    assert killed.items >= 8 and killed.requests >= killed.items and killed.elapsed >= 0.5
    assert sum(s.items for s in stints) >= 40


@pytest.mark.integration
def test_fresh_says_what_it_replaced_and_odd_prefixes_hold(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    (tmp_path / "urls.txt").write_text(f"{server.url}/ok/{key}\n")
    (tmp_path / "urls-results.jsonl").write_text("left by hand\n")
    fresh = run_cli("urls.txt", "--fresh", "--no-progress", cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert "--fresh: replaced urls-results.jsonl, left by a run whose journal is gone" in (
        fresh.stderr
    )
    folder = run_cli("urls.txt", "-o", "out2/", "--no-progress", cwd=tmp_path)
    assert folder.returncode == 0, folder.stderr
    # (a folder: the default name in it, not out2/-results.jsonl)
    assert sorted(path.name for path in (tmp_path / "out2").glob("*.jsonl")) == [
        "urls-failed.jsonl",
        "urls-results.jsonl",
    ]
    (tmp_path / "loop-results.jsonl").symlink_to("loop-results.jsonl")
    looped = run_cli("urls.txt", "-o", "loop", "--no-progress", cwd=tmp_path)
    assert "Traceback" not in looped.stderr
    assert looped.returncode in (0, 2), looped.stderr
