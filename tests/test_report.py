"""The run's report: its aggregation (pure, unit-tested here), its HTML with and without
plotly, the journal's finish times, and ``ResultSet.report``. The CLI's report and the one
opened in a real browser are tested in ``test_report_browser``."""

from __future__ import annotations

import re
import sqlite3
import time
import uuid
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from batchsync.core.result import AttemptRecord, Result, Trace, Tried
from batchsync.limits.gates import WaitStats
from batchsync.output import report, report_data
from batchsync.output.report_data import (
    Aggregate,
    bucket_width,
    charted_as,
    histogram_percentile,
    placed,
)
from batchsync.output.resultset import ResultSet, StoredResults
from batchsync.store.journal import Journal, JournalReader
from batchsync.store.submissions import Part

from .mockserver import MockServerProcess
from .test_cli import batchsync


def test_attempts_are_placed_back_from_the_finish_with_their_waits() -> None:
    log = [
        Tried(503, "status", 0.5, 1.0, None),
        Tried(503, "status", 0.25, 2.0, None),
        Tried(200, None, 0.25, None, None),
    ]
    assert placed(100.0, log) == [(96.0, 96.5), (97.5, 97.75), (99.75, 100.0)]
    assert placed(5.0, []) == []


def test_each_attempt_counts_under_one_outcome() -> None:
    assert charted_as(Tried(200, None, 0.1, None, None), last=True) == "ok"
    assert charted_as(Tried(429, "status", 0.1, 1.0, None), last=False) == "429"
    assert charted_as(Tried(429, "status", 0.1, None, None), last=True) == "429"
    assert charted_as(Tried(503, "status", 0.1, 1.0, None), last=False) == "retried"
    assert charted_as(Tried(503, "status", 0.1, None, None), last=True) == "failed"
    assert charted_as(Tried(None, "timeout", 10.0, None, None), last=True) == "failed"


def test_bucket_widths_are_round_and_bounded() -> None:
    assert bucket_width(10.0) == 0.1
    assert bucket_width(3600.0) == 50.0
    assert bucket_width(86_400.0) == 1000.0
    assert bucket_width(0.0) == 0.001
    for span in (0.5, 7.0, 123.0, 99_999.0):
        assert span / bucket_width(span) <= report_data.MAX_BUCKETS


def test_latency_percentiles_from_the_histogram_are_within_ten_percent() -> None:
    values = [0.001 * (1.03**n) for n in range(300)]
    counts: dict[int, int] = {}
    for value in values:
        counts[report_data.latency_bin(value)] = counts.get(report_data.latency_bin(value), 0) + 1
    ordered = sorted(values)
    for share in (0.5, 0.95, 0.99):
        exact = ordered[max(0, -(-int(share * 300 * 1000) // 1000) - 1)]
        found = histogram_percentile(counts, share)
        assert exact <= found <= exact * 1.1 + 1e-12, share


def test_the_tally_counts_attempts_waits_and_items_per_bucket() -> None:
    tally = Aggregate(0.0, 10.0)
    assert tally.width == 0.1 and tally.buckets == 100
    tally.add(Trace(0, True, None, 200, 1, 0.5, 1.0, (Tried(200, None, 0.5, None, None),)))
    retried = (
        Tried(503, "status", 0.5, 2.0, None),
        Tried(429, "status", 0.5, 1.0, None),
        Tried(503, "status", 1.0, None, None),
    )
    tally.add(Trace(1, False, "status", 503, 3, 5.0, 9.0, retried))
    tally.add(Trace(2, False, "invalid_request", None, 0, 0.0, 9.5, ()))
    untimed = (Tried(200, None, 0.2, None, None),)
    tally.add(Trace(3, True, None, 200, 1, 0.2, None, untimed))  # (no finish time)
    assert tally.items == 4 and tally.untimed == 1
    assert dict(tally.attempts_per_item) == {1: 2, 3: 1, 0: 1}
    per_bucket = {name: sum(counts) for name, counts in tally.attempts.items()}
    assert per_bucket == {"ok": 1, "retried": 1, "failed": 1, "429": 1}
    # The 503 began at 9.0 - 1.0 - 1.0 - 0.5 - 2.0 - 0.5 = 4.0 s: bucket 40.
    assert tally.attempts["retried"][40] == 1
    assert tally.attempts["429"][65] == 1 and tally.attempts["failed"][80] == 1
    assert tally.per_second()["ok"][5] == pytest.approx(10.0)  # 1 attempt in 0.1 s
    # Backoff 2 s from 4.5 s and 1 s from 7.0 s: 30 buckets fully waiting.
    waiting = tally.waiting()["backoff"]
    assert sum(waiting) * tally.width == pytest.approx(3.0)
    assert waiting[50] == pytest.approx(1.0) and waiting[75] == pytest.approx(1.0)
    assert waiting[68] == pytest.approx(0.0)
    p50 = tally.percentiles()["p50"]
    assert p50[10] == pytest.approx(0.5, rel=0.1)
    assert p50[11] is None
    assert tally.slowest_indexes()[:2] == [1, 0]
    assert tally.failed == [1, 2] and tally.failed_total == 2
    assert tally.spending() == {}  # (no attempt had a cost: no spend cap)
    capped = (
        Tried(429, "status", 0.5, 0.5, 0.0, 1.0, "gpt-mock"),
        Tried(200, None, 0.5, None, 0.25, 1.0, "gpt-mock"),
    )
    tally.add(Trace(4, True, None, 200, 2, 1.0, 3.0, capped))
    tally.add(Trace(5, True, None, 200, 1, 0.5, 3.0, (Tried(200, None, 0.5, None, 0.5, 0.5, "b"),)))
    spent = tally.spending()
    ended = tally.bucket(3.0)  # (the 429's cost, 0, where it ended; the answers' at 3.0 s)
    assert spent["spent"][ended] == 0.75 and sum(spent["spent"]) == 0.75
    assert spent["reserved"][ended] == 1.5 and sum(spent["reserved"]) == 2.5
    assert spent["in all"][ended - 1] == 0 and spent["in all"][-1] == 0.75
    assert tally.spending_by_model() == [("b", 1, 0.5, 0.5), ("gpt-mock", 2, 2.0, 0.25)]


def test_gate_waits_are_counted_by_second_and_drawn_per_bucket() -> None:
    stats = WaitStats()
    now = time.time()
    stats.add("cooldown", 2.5)
    stats.add("token", 0.0)  # (nothing waited: nothing kept)
    assert set(stats.timeline) <= {("cooldown", s) for s in range(int(now) - 3, int(now) + 2)}
    assert sum(stats.timeline.values()) == pytest.approx(2.5)
    assert stats.seconds == {"cooldown": pytest.approx(2.5)}
    tally = Aggregate(100.0, 110.0)
    tally.add_gate_waits({("cooldown", 102): 3.0, ("quota", 109): 0.5})
    waiting = tally.waiting()
    assert list(waiting) == ["backoff", "cooldown", "quota"]
    assert waiting["cooldown"][20:30] == [pytest.approx(3.0)] * 10  # 3 items for that second
    assert sum(waiting["cooldown"]) * tally.width == pytest.approx(3.0)
    assert sum(waiting["quota"]) * tally.width == pytest.approx(0.5)


def test_the_tables_keep_only_the_slowest_and_the_first_failures() -> None:
    tally = Aggregate(0.0, 1.0)
    for index in range(report_data.FAILED_SHOWN + 50):
        tally.add(Trace(index, False, "status", 404, 1, index / 1000, 0.5))
    assert len(tally.slowest) == report_data.SLOWEST
    assert tally.slowest_indexes()[0] == report_data.FAILED_SHOWN + 49
    assert tally.failed == list(range(report_data.FAILED_SHOWN))
    assert tally.failed_total == report_data.FAILED_SHOWN + 50


def results() -> ResultSet:
    secret = "http://api.test/503?api_key=***"
    return ResultSet(
        [
            Result(
                0,
                "http://api.test/ok",
                True,
                status_code=200,
                attempts=1,
                elapsed=0.1,
                attempt_log=(AttemptRecord(1, 200, None, 0.1),),
                finished=1000.0,
            ),
            Result(
                1,
                secret,
                False,
                status_code=503,
                attempts=2,
                error_kind="status",
                error="HTTP 503 after 2 attempts <b>",
                elapsed=1.3,
                finished=1001.2,
                attempt_log=(
                    AttemptRecord(1, 503, "status", 0.1, 1.0),
                    AttemptRecord(2, 503, "status", 0.2),
                ),
            ),
            Result(
                2,
                None,
                False,
                error_kind="invalid_request",
                error="line 3: not JSON",
                finished=1000.5,
            ),
        ]
    )


def counts_in(page: str) -> dict[str, int]:
    found = re.findall(r"data-count=['\"]([^'\"]+)['\"]>(\d+)<", page)
    return {key: int(n) for key, n in found}


def test_the_latency_axis_ticks_are_round_durations_with_their_unit() -> None:
    # two decades: 1, 2 and 5 of each; four: 1 and 3; more: the decades (a tenth either side)
    assert report._latency_ticks([[0.004, None], [0.2]])["ticktext"] == [
        "500 µs", "1 ms", "2 ms", "5 ms", "10 ms", "20 ms", "50 ms", "100 ms", "200 ms",
        "500 ms", "1 s", "2 s",
    ]  # fmt: skip
    assert report._latency_ticks([[0.002, 3.0]])["ticktext"] == [
        "300 µs", "1 ms", "3 ms", "10 ms", "30 ms", "100 ms", "300 ms", "1 s", "3 s", "10 s",
        "30 s",
    ]  # fmt: skip
    wide = report._latency_ticks([[0.0005, 120.0]])
    assert wide["ticktext"] == ["100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s", "100 s",
                                "1000 s"]  # fmt: skip
    assert report._latency_ticks([[0.002, 3.0]])["tickvals"][:3] == [0.0003, 0.001, 0.003]
    assert report._latency_ticks([[None]]) == {}


def test_a_result_set_writes_one_self_contained_page_with_charts(tmp_path: Path) -> None:
    pytest.importorskip("plotly")
    path = results().report(tmp_path / "r.html")
    page = path.read_text()
    assert counts_in(page) == {
        "items": 3, "ok": 1, "failed": 2, "kind-invalid_request": 1, "kind-status": 1,
        "status-200": 1, "status-503": 1, "requests": 3,
    }  # fmt: skip
    assert page.count("Plotly.newPlot") == 5  # five charts ...
    assert page.count("plotly.js v") == 1  # ... and one copy of plotly.js
    assert not re.search(r"<script[^>]+src=", page)  # nothing fetched from anywhere
    assert "api_key=***" in page and "&lt;b&gt;" in page and "<b>" not in page
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left


def test_without_plotly_the_report_says_how_to_get_charts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "_plotly", lambda: None)
    page = results().report(tmp_path / "r.html").read_text()
    assert "pip install &#x27;batchsync[report]&#x27;" in page
    assert "Plotly" not in page
    assert counts_in(page)["failed"] == 2
    assert "id='attempts-per-item'" in page and "id='failed'" in page


def test_a_part_the_journal_holds_no_history_of_shows_no_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "_plotly", lambda: None)
    planned = Part(1, 1, "openai", ((0, 2),))  # (a journal may hold a part with no history)
    moved = Part(2, 1, "openai", ((3, 3),), history=((1000.0, "planned"), (1002.5, "uploaded")))
    rs = ResultSet(list(results()), submissions=[planned, moved])
    page = rs.report(tmp_path / "r.html").read_text()
    history = page.split("<table id='submission-history'>", 1)[1].split("</table>", 1)[0]
    assert history.count("<tr>") == 3  # a head row, the second part's two states
    assert "<td class='n'>2.5</td>" in history and "<td class='n'></td>" in history


def test_the_journal_stores_when_each_result_finished(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, lambda r, item: ("{}", None), {"entries": "2"})
    journal.add(Result(0, "u", True, finished=1234.5), None)
    journal.add(Result(1, "u", True), None)  # made outside a run: stored with the time now
    journal.close()
    reader = JournalReader(path)
    try:
        times = {index: finished for index, _, _, finished in reader.finals()}
    finally:
        reader.close()
    later = times[1]
    assert times[0] == 1234.5 and later is not None and later > 1_700_000_000


def test_the_report_of_a_journal_streams_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    rs = results()
    journal = Journal(
        path, lambda r, item: (__import__("json").dumps(r.to_dict()), None if r.ok else "{}"), {}
    )
    for result in rs:
        journal.add(result, None)
    journal.close()
    reader = JournalReader(path)
    try:
        stored = StoredResults(reader, path)
        tally, details = report_data.collected(stored.entries(), stored.span)
        listed = details([1, 0])
        summary = stored.summary
    finally:
        reader.close()
    memory, _ = report_data.collected(*report_data.entries_of(list(rs)))
    assert tally.attempts == memory.attempts and tally.backoff == memory.backoff
    assert [item.url for item in listed] == [rs[1].url, rs[0].url]
    assert summary.total == 3


def test_results_made_by_a_run_carry_their_finish_time() -> None:
    from batchsync import run_all

    rs = run_all(lambda n: n, [1, 2], progress=False)
    assert all(r.finished is not None and r.finished > 1_700_000_000 for r in rs)
    assert "finished" not in rs[0].to_dict()  # (not written to the results file)


def test_a_journal_without_the_column_is_not_this_schema(tmp_path: Path) -> None:
    """The column is part of the results table since schema 3 (a fresh journal has it)."""
    path = tmp_path / "j.sqlite3"
    Journal(path, lambda r, item: ("{}", None), {}).close()
    with sqlite3.connect(path) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(results)")]
    assert columns[-2:] == ["finished", "pass"]


# -- the command line's report ---------------------------------------------------------------

FAULTY = ("/ok/{k}-1", "/ok/{k}-2?delay=0.2", "/404/{k}", "/503/{k}", "/429-once/{k}?retry_after=1")


def faulty_run(server: MockServerProcess, folder: Path, *args: str) -> CompletedProcess[str]:
    """A small run of ok, 404, 503 and 429-then-ok URLs against the bundled mock server."""
    k = uuid.uuid4().hex[:8]
    (folder / "urls.txt").write_text("".join(server.url + p.format(k=k) + "\n" for p in FAULTY))
    return batchsync("urls.txt", "--attempts", "3", "--no-progress", *args, cwd=folder)


def summary_of(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if " items: " in line)


def stated(stderr: str) -> dict[str, int]:
    """The counts of the summary line on stderr (``5 items: 3 ok, 2 failed (status 2)``)."""
    found = re.search(r"(\d+) items?: (\d+) ok, (\d+) failed(?: \(([^)]*)\))?", stderr)
    assert found is not None, stderr
    counts = {"items": int(found[1]), "ok": int(found[2]), "failed": int(found[3])}
    for part in (found[4] or "").split(", "):
        if part:
            kind, n = part.rsplit(" ", 1)
            counts[f"kind-{kind}"] = int(n)
    return counts


@pytest.mark.integration
def test_the_cli_writes_the_report_from_the_journal_and_again_when_resumed(
    server: MockServerProcess, tmp_path: Path
) -> None:
    done = faulty_run(server, tmp_path)
    assert done.returncode == 1, done.stderr
    path = tmp_path / "urls-report.html"
    assert f"report: {path.name}" in done.stderr
    page = path.read_text()
    counts = counts_in(page)
    assert {k: counts[k] for k in stated(done.stderr)} == stated(done.stderr)
    assert counts == {
        "items": 5, "ok": 3, "failed": 2, "kind-status": 2, "status-200": 3, "status-404": 1,
        "status-503": 1, "requests": 8,
    }  # fmt: skip
    assert page.count("<tr><td class='n'>") >= 2 + 5  # the failed and the slowest items
    # The 429's Retry-After held the host's other items: the cooldown is drawn over time.
    assert '"name":"cooldown"' in page and '"name":"backoff"' in page
    # A resumed run with nothing left to fetch reports every item the journal holds.
    path.unlink()
    again = batchsync("urls.txt", "--resume", "--no-progress", cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    page = path.read_text()
    assert counts_in(page) == counts
    # ... and the whole run's numbers: the first process's cooldown is still there.
    assert '"name":"cooldown"' in page
    assert summary_of(again.stderr) == summary_of(done.stderr)


@pytest.mark.integration
def test_no_report_writes_none_and_a_report_that_fails_keeps_the_exit_status(
    server: MockServerProcess, tmp_path: Path
) -> None:
    done = faulty_run(server, tmp_path, "--no-report")
    assert done.returncode == 1, done.stderr
    assert not (tmp_path / "urls-report.html").exists()
    assert "report:" not in done.stderr
    (tmp_path / "urls-report.html").mkdir()  # cannot be replaced by a file
    failing = faulty_run(server, tmp_path, "--fresh")
    assert failing.returncode == 1, failing.stderr
    assert "the report urls-report.html could not be written" in failing.stderr
    assert len((tmp_path / "urls-results.jsonl").read_text().splitlines()) == 5
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.integration
def test_fetch_all_and_a_batch_write_the_report_of_their_results(
    server: MockServerProcess, tmp_path: Path
) -> None:
    pytest.importorskip("plotly")
    from batchsync import Batch

    k = uuid.uuid4().hex[:8]
    urls = [server.url + p.format(k=k) for p in FAULTY]
    batch = Batch(urls, attempts=2, progress=False)
    rs = batch.run()
    assert all(r.finished is not None for r in rs)
    page = batch.report(tmp_path / "batch.html").read_text()
    summary = rs.summary()
    counts = counts_in(page)
    assert (counts["items"], counts["ok"], counts["failed"]) == (5, summary.ok, summary.failed)
    assert counts["requests"] == summary.requests_sent == 7
    assert '"name":"backoff"' in page and page.count("Plotly.newPlot") == 5
