"""Rows a batch did not run in time, or answered with a status the retry policy retries, go
into a new part of the same run (``--batch-retries``), journaled as any part: they come back
in the run, each counting every try; no row runs twice (counted by the mock), and a run killed
while it makes such a part, then resumed, makes no part twice."""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from .mockserver import MockServerProcess
from .test_batch_api import (
    check_in_order,
    command,
    cookbook,
    counts_so_far,
    endpoint,
    no_canary_in,
    results,
    run,
    start,
    stats,
    wait_for,
)
from .test_batch_api import parts as batches_of

pytestmark = pytest.mark.integration

ROWS = 40
# Row 5 always expires, row 6 is always answered 500, row 7 always 400; a share of the others
# expires, drawn by their custom_id (a row sent again in a new part is drawn again).
MARKS = {5: "[[expire]]", 6: "[[500]]", 7: "[[error]]"}


def part_rows(journal: Path) -> list[tuple[int, str, str]]:
    """Each part's number, state and rows (as the journal writes them)."""
    uri = f"file:{journal}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=2)) as db:
        return list(db.execute("SELECT part, state, rows FROM submissions ORDER BY part"))


def times_in_parts(journal: Path) -> dict[int, int]:
    """How many parts with a batch each row was in."""
    times: dict[int, int] = {}
    made = [batch is not None for _, batch in batches_of(journal)]
    for (_, _, rows), batch in zip(part_rows(journal), made, strict=True):
        if batch:
            for first, last in json.loads(rows):
                for index in range(first, last + 1):
                    times[index] = times.get(index, 0) + 1
    return times


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_expired_and_retryable_rows_come_back_in_the_same_run(
    server: MockServerProcess, tmp_path: Path, provider: str
) -> None:
    source = cookbook(tmp_path / "in.jsonl", ROWS, MARKS)
    url, key = endpoint(server, provider, "pace=0.1,expire=0.3")
    args = command(source, url, provider, "--batch-api", "--poll", "0.05", "--batch-rows", "20")
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr  # (rows 5, 6 and 7 fail)
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, ROWS)
    times = times_in_parts(tmp_path / "in-journal.sqlite3")
    failed = {row["index"]: row for row in written if not row["ok"]}
    # Row 5: three tries (sent again twice: the default), never run; row 6: three tries, each
    # answered 500; row 7: answered 400 once, which the policy does not retry.
    assert failed.pop(5)["attempts"] == 0 and times[5] == 3
    row = failed.pop(6)
    assert row["status_code"] == 500 and row["attempts"] == 3 and times[6] == 3
    assert [entry["status_code"] for entry in row["attempt_log"]] == [500, 500, 500]
    row = failed.pop(7)
    assert row["status_code"] == 400 and row["attempts"] == 1 and times[7] == 1
    # The others: answered, some after one or two tries more; or expired on every try.
    assert all(row["error_kind"] == "batch_expired" and times[n] == 3 for n, row in failed.items())
    came_back = [row for row in written if row["ok"] and times[row["index"]] > 1]
    assert came_back, "no expired row came back answered"
    assert all(row["attempts"] == 1 for row in came_back), "an expired try is no attempt"
    counts = stats(server, key)
    assert counts["twice"] == [], "a row answered in two batches"
    parts = part_rows(tmp_path / "in-journal.sqlite3")
    assert len(parts) == counts["batches_created"] > 2, "the rows went into new parts"
    assert all(state == "cleaned" for _, state, _ in parts)
    if provider == "openai":
        assert counts["files_alive"] == []
    no_canary_in(tmp_path)


def test_no_retries_leaves_them_failed_for_retry_failed(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 10, {2: "[[500]]"})
    url, key = endpoint(server, "openai", "pace=0.1")
    args = command(
        source, url, "openai", "--batch-api", "--poll", "0.05", "--batch-retries", "0"
    )  # fmt: skip
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr
    failed = [row for row in results(tmp_path / "in-results.jsonl") if not row["ok"]]
    assert [(row["index"], row["attempts"]) for row in failed] == [(2, 1)]
    assert stats(server, key)["batches_created"] == 1


# What the journal shows at each moment of a replan, and the mock's knob that holds the run
# there: a part of rows sent again just made (its create answered late), and polled.
REPLANS: dict[str, tuple[str, Any]] = {
    "create": ("pace=0.1,stall_create=0.6", lambda parts: parts[-1][1] == "submitting"),
    "polling": ("pace=0.4", lambda parts: parts[-1][1] in ("in_progress", "validating")),
}


@pytest.mark.parametrize("moment", list(REPLANS))
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_killed_while_rows_are_sent_again_the_resumed_run_runs_no_row_twice(
    server: MockServerProcess, tmp_path: Path, provider: str, moment: str
) -> None:
    knob, at_moment = REPLANS[moment]
    rows = 20
    # Rows 3 and 14 expire the first time only (their custom_id draws again in a new part);
    # which rows the share picks is fixed by the key, so the marker is used instead.
    source = cookbook(tmp_path / "in.jsonl", rows, {3: "[[500]]", 14: "[[500]]"})
    url, key = endpoint(server, provider, knob)
    args = command(source, url, provider, "--batch-api", "--poll", "0.05")
    journal = tmp_path / "in-journal.sqlite3"

    first = start(args, tmp_path)

    def replanning() -> bool:
        try:
            parts = part_rows(journal)
        except sqlite3.Error:
            return False
        return len(parts) >= 2 and at_moment(parts)

    wait_for(replanning, first, f"a part of rows sent again, at its {moment}")
    first.send_signal(signal.SIGKILL)
    first.wait()
    made_before = counts_so_far(server, key).get("batches_created", 0)

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 1, resumed.stderr  # (rows 3 and 14 stay 500)
    assert "Traceback" not in resumed.stderr
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, rows)
    assert {row["index"] for row in written if not row["ok"]} == {3, 14}
    counts = stats(server, key)
    assert counts["twice"] == [], "a row answered in two batches"
    parts = part_rows(journal)
    # One batch per part made: the one made before the kill was found again, none made twice
    # (a part whose create never reached the provider was dropped, its rows in the next).
    made = [batch for _, batch in batches_of(journal) if batch is not None]
    assert counts["batches_created"] == len(made) >= made_before
    assert counts["batches_created"] == 3, f"the first part, then rows 3 and 14 twice more: {parts}"
    assert all(state in ("cleaned", "dropped") for _, state, _ in parts)


def test_killed_before_the_first_parts_answers_were_journaled_they_are_read_not_sent_again(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """The kill came after the part of rows sent again was made, but before the journal held
    the answers of the part they came from (its writer commits in groups): the resumed run
    reads those answers from the ended batch again; only the rows sent again are the new
    part's."""
    rows = 20
    source = cookbook(tmp_path / "in.jsonl", rows, {3: "[[500]]", 14: "[[500]]"})
    url, key = endpoint(server, "openai", "pace=0.4")
    args = command(source, url, "openai", "--batch-api", "--poll", "0.05")
    journal = tmp_path / "in-journal.sqlite3"
    first = start(args, tmp_path)

    def second_part_running() -> bool:
        try:
            found = part_rows(journal)
        except sqlite3.Error:
            return False
        return len(found) >= 2 and found[-1][1] in ("validating", "in_progress")

    wait_for(second_part_running, first, "the part of rows sent again running")
    first.send_signal(signal.SIGKILL)
    first.wait()
    with closing(sqlite3.connect(journal)) as db, db:
        assert db.execute("DELETE FROM results").rowcount == rows - 2
    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 1, resumed.stderr
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, rows)
    assert {row["index"] for row in written if not row["ok"]} == {3, 14}
    counts = stats(server, key)
    assert counts["twice"] == [], "an answered row was sent again"
    assert counts["batches_created"] == 3


def test_no_new_part_once_the_budget_is_spent_or_the_deadline_cannot_hold_one(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A row's budget counts from its first part's submission, over every part it goes in;
    and a part is made only while the deadline leaves the time the last one took."""
    source = cookbook(tmp_path / "in.jsonl", 6, {5: "[[expire]]"})
    # Each batch ends about 0.75 s after its submission (three steps of 0.25 s).
    url, key = endpoint(server, "openai", "pace=0.25")
    args = command(source, url, "openai", "--batch-api", "--poll", "0.05", "--budget", "1.2")
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr
    row = results(tmp_path / "in-results.jsonl")[5]
    assert row["error_kind"] == "batch_expired"
    # (once on a machine at its pace; none when a slow spell spent the budget on the first)
    sent = times_in_parts(tmp_path / "in-journal.sqlite3")[5]
    assert sent <= 2, "never a third part: the budget was spent by then"
    assert stats(server, key)["batches_created"] == sent

    url, key = endpoint(server, "openai", "pace=0.25")
    args = command(
        source, url, "openai", "--batch-api", "--poll", "0.05", "--deadline", "2.0",
        "-o", "timed",
    )  # fmt: skip
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr
    row = results(tmp_path / "timed-results.jsonl")[5]
    assert row["error_kind"] == "batch_expired", "its own failure, not a part the deadline cut"
    sent = times_in_parts(tmp_path / "timed-journal.sqlite3")[5]
    assert sent <= 2, "never a part the deadline could not hold"
    assert stats(server, key)["batches_created"] == sent
