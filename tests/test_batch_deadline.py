"""A deadline that picks the lane (``--lanes auto``): rows go through the batch endpoint, and once
what is left of the deadline would no longer hold a live pass of the rows still open, their
batches are cancelled, what the batches answered is collected, and only the rest is sent live.
Counted by the mock: no row answered in both lanes, none twice, the run done by its deadline."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any, Literal

import pytest

from batchsync import Batch

from .mockserver import MockServerProcess
from .test_batch_api import (
    KEY_HEADER,
    check_in_order,
    command,
    cookbook,
    endpoint,
    no_canary_in,
    parts,
    results,
    run,
    start,
    stats,
    wait_for,
)

pytestmark = pytest.mark.integration

# The live routes of the mock never refuse here: the deadline, not a 429, sets the pace.
LIVE = "rpm=1000000,tpm=1000000000,latency=0.05"


def lane_of(row: dict[str, Any]) -> str:
    log = row["attempt_log"]
    return (log[-1].get("lane") or "live") if log else "none"


def live_answered(server: MockServerProcess, key: str) -> int:
    """The live calls the mock admitted for KEY (none before its first call of any kind)."""
    try:
        return int(server.get(f"/llm/{key}/stats")["requests"])
    except OSError:  # (404: no request of KEY yet)
        return 0


def test_a_deadline_the_batches_cannot_meet_sends_live_only_the_rows_they_did_not_run(
    server: MockServerProcess, tmp_path: Path
) -> None:
    rows, deadline = 2000, 20.0
    source = cookbook(tmp_path / "in.jsonl", rows)
    # Each batch: validating 3 s, in progress 3 s (its rows done one by one), finalizing 3 s.
    url, key = endpoint(server, "openai", f"pace=3,{LIVE}")
    args = command(
        source, url, "openai", "--batch-api", "--lanes", "auto", "--deadline", str(deadline),
        "--poll", "0.1", "--batch-rows", "500", "-c", "50", "--live-latency", "0.2",
    )  # fmt: skip
    began = time.monotonic()
    done = run(args, tmp_path)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert took < deadline + 5, "the run ended by its deadline (the process's start aside)"
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, rows)
    assert all(row["ok"] for row in written)
    lanes = [lane_of(row) for row in written]
    batch, live = lanes.count("batch"), lanes.count("live")
    assert batch + live == rows
    assert 0 < live < rows, "the batches answered a share, the live lane the rest"
    counts = stats(server, key)
    assert counts["both_lanes"] == [] and counts["twice"] == []
    assert counts["rows_answered"] == batch, "the mock answered in batches exactly these"
    assert live_answered(server, key) == live, "and live exactly the others"
    assert [b["status"] for b in counts["batches"]] == ["cancelled"] * 4
    report = (tmp_path / "in-report.html").read_text()
    assert "id='lanes'" in report
    assert f"<td>batch</td><td class='n'>{batch}</td>" in report
    assert f"<td>live</td><td class='n'>{live}</td>" in report
    assert all(state == "cleaned" for state, _ in parts(tmp_path / "in-journal.sqlite3"))
    no_canary_in(tmp_path)


def test_a_generous_deadline_sends_nothing_live(server: MockServerProcess, tmp_path: Path) -> None:
    url, key = endpoint(server, "openai", f"pace=0.3,{LIVE}")
    body = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}
    rows = [{"text": f"question {n}"} for n in range(400)]
    batch = Batch(
        rows, url=url, body=body, batch_api="auto", lanes="auto", deadline=60, poll=0.05,
        batch_rows=100, concurrency=20, live_latency=0.5, headers=KEY_HEADER,
        journal=tmp_path / "j.sqlite3", progress=False,
    )  # fmt: skip
    results_set = batch.run()
    assert [r.index for r in results_set] == list(range(400))
    assert all(r.ok and r.attempt_log[-1].lane == "batch" for r in results_set)
    assert live_answered(server, key) == 0, "not one live call"
    assert stats(server, key)["rows_answered"] == 400


# The moments of a replan a run is killed at: the batches being cancelled, and the live pass.
MOMENTS = {
    "cancelling": lambda journal, server, key: "cancelling" in {s for s, _ in parts(journal)},
    "live": lambda journal, server, key: live_answered(server, key) > 50,
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_killed_during_a_replan_the_resumed_run_answers_no_row_in_both_lanes(
    server: MockServerProcess, tmp_path: Path, moment: str
) -> None:
    rows = 600
    source = cookbook(tmp_path / "in.jsonl", rows)
    url, key = endpoint(server, "openai", f"pace=2,{LIVE}")
    args = command(
        source, url, "openai", "--batch-api", "--lanes", "auto", "--deadline", "14",
        "--poll", "0.05", "--batch-rows", "200", "-c", "20", "--live-latency", "0.2",
    )  # fmt: skip
    journal = tmp_path / "in-journal.sqlite3"
    first = start(args, tmp_path)
    wait_for(lambda: MOMENTS[moment](journal, server, key), first, f"the replan's {moment}")
    first.send_signal(signal.SIGKILL)
    first.wait()

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, rows)
    assert all(row["ok"] for row in written)
    counts = stats(server, key)
    assert counts["both_lanes"] == [], "a row answered by a batch and live"
    assert counts["twice"] == [] and counts["batches_created"] == 3
    batch = sum(lane_of(row) == "batch" for row in written)
    assert counts["rows_answered"] == batch
    live = live_answered(server, key)
    if moment == "cancelling":  # (nothing went live before the kill)
        assert live == rows - batch
    else:  # (a live answer the kill kept from the journal is asked again, as in any live run)
        assert live >= rows - batch


def test_lanes_live_sends_every_row_live_and_is_refused_while_batches_are_open(
    server: MockServerProcess, tmp_path: Path
) -> None:
    url, key = endpoint(server, "openai", f"pace=5,{LIVE}")
    body = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}
    rows = [{"text": f"question {n}"} for n in range(30)]

    def batch(lanes: Literal["batch", "live"], journal: str, **more: Any) -> Batch:
        return Batch(
            rows, url=url, body=body, batch_api="auto", lanes=lanes, poll=0.05,
            headers=KEY_HEADER, journal=tmp_path / journal, progress=False, **more,
        )  # fmt: skip

    live = batch("live", "live.sqlite3", rate="100/s").run()
    assert all(r.ok and r.attempt_log[-1].lane is None for r in live)
    assert live_answered(server, key) == 30
    # A journal whose batches are still open at the provider (pace=5: long after the deadline).
    held = batch("batch", "open.sqlite3", deadline=1).run()
    assert {r.error_kind for r in held} == {"deadline"}
    with pytest.raises(ValueError, match="still open"):
        batch("live", "open.sqlite3").run()
    assert live_answered(server, key) == 30, "nothing more went live"


def test_cancel_is_refused_with_lanes_live(server: MockServerProcess, tmp_path: Path) -> None:
    url, key = endpoint(server, "openai", f"pace=1,{LIVE}")
    body = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}
    rows = [{"text": f"question {n}"} for n in range(5)]
    batch = Batch(rows, url=url, body=body, batch_api="auto", lanes="live", headers=KEY_HEADER,
                  progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="no batch to cancel"):
        batch.cancel()
    assert live_answered(server, key) == 0


def test_parts_slow_to_submit_still_leave_the_live_pass_its_time(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """Each create is answered 4 s late: the plan is checked before each part is submitted,
    with a cancel reckoned at least as slow as the slowest call, so the rows go live in time."""
    rows = 300
    source = cookbook(tmp_path / "in.jsonl", rows)
    url, key = endpoint(server, "openai", f"pace=3,stall_create=4,{LIVE}")
    args = command(
        source, url, "openai", "--batch-api", "--lanes", "auto", "--deadline", "14",
        "--poll", "0.05", "--batch-rows", "100", "-c", "20", "--live-latency", "0.2",
    )  # fmt: skip
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, rows)
    assert all(row["ok"] for row in written), {row["error_kind"] for row in written}
    counts = stats(server, key)
    assert counts["both_lanes"] == [] and counts["twice"] == []
    assert counts["batches_created"] < 3, "the last part never went to the provider"


@pytest.mark.parametrize("retries", [2, 0])
def test_a_row_a_batch_failed_goes_live_with_its_batch_try_when_retries_allow(
    server: MockServerProcess, tmp_path: Path, retries: int
) -> None:
    """Row 0 is answered 500 by every batch; its part ends 3 s in, when the deadline no longer
    leaves the time for another part: it goes live (and counts its batch try), unless
    --batch-retries 0 says never again."""
    source = cookbook(tmp_path / "in.jsonl", 20, {0: "[[500]]"})
    url, key = endpoint(server, "openai", f"pace=1,{LIVE}")
    args = command(
        source, url, "openai", "--batch-api", "--lanes", "auto", "--deadline", "6",
        "--poll", "0.05", "-c", "10", "--live-latency", "0.2", "--batch-retries", str(retries),
    )  # fmt: skip
    done = run(args, tmp_path)
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, 20)
    row = written[0]
    if retries:
        assert done.returncode == 0, done.stderr
        assert row["ok"] and row["attempts"] == 2
        tries = [(entry["status_code"], entry.get("lane")) for entry in row["attempt_log"]]
        assert tries == [(500, "batch"), (200, None)]
    else:
        assert done.returncode == 1, done.stderr
        assert (row["status_code"], row["attempts"]) == (500, 1)
        assert live_answered(server, key) == 0
    assert all(other["ok"] and lane_of(other) == "batch" for other in written[1:])
    assert stats(server, key)["both_lanes"] == []
