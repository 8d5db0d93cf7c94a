"""Runs through the providers' batch endpoints (``--batch-api``, ``batch_api=``) against the
mock of both batch APIs (batchsync/mock/batch.py): the command line and the library, split into
parts, killed in each phase and resumed, interrupted, cancelled, refused for the enqueued-token
cap, retried live; every row one Result, in input order, shaped as a live run's; no part
submitted twice, as the mock counts; no secret in any byte written."""

from __future__ import annotations

import errno
import http.server
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any, ClassVar

import pytest

from batchsync import Batch

from . import test_journal_tamper as tamper
from .mockserver import ROOT, MockServerProcess

pytestmark = pytest.mark.integration

PROVIDERS = {
    "openai": ("/v1/chat/completions", ("-H", "Authorization: Bearer sk-canary-openai-7Qx")),
    "anthropic": (
        "/v1/messages",
        ("-H", "x-api-key: sk-ant-canary-9Zk", "-H", "anthropic-version: 2023-06-01"),
    ),
}
CANARIES = (b"sk-canary-openai-7Qx", b"sk-ant-canary-9Zk")
# Keys of a Result as a live run writes it.
RESULT_KEYS = [
    "index", "url", "final_url", "redirects", "id", "ok", "status_code", "attempts",
    "error_kind", "error", "data", "elapsed", "attempt_log", "fallback_used",
]  # fmt: skip


def endpoint(server: MockServerProcess, provider: str, knobs: str) -> tuple[str, str]:
    """A fresh KEY's live endpoint URL for ``provider`` with these knobs, and the KEY."""
    key = uuid.uuid4().hex[:10]
    return f"{server.url}/llm/{key}/{knobs}{PROVIDERS[provider][0]}", key


def cookbook(path: Path, count: int, marks: dict[int, str] | None = None) -> Path:
    """The OpenAI cookbook's request file: one body a line, its ``metadata`` the row's id."""
    marks = marks or {}
    lines = [
        {
            "model": "mock-model",
            "messages": [{"role": "user", "content": f"question {n:04d} {marks.get(n, '')}"}],
            "max_tokens": 12,
            "metadata": {"row": n},
        }
        for n in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def command(input_path: Path, url: str, provider: str, *more: str) -> list[str]:
    return [
        sys.executable, "-m", "batchsync", str(input_path), "--url", url, "--row-as-body",
        "--no-progress", *PROVIDERS[provider][1], *more,
    ]  # fmt: skip


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=300, env=_environment(), check=False
    )


def start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(),
    )


def _environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def parts(journal: Path) -> list[tuple[str, str | None]]:
    """Each part's state and batch id, as the journal holds them now (none before any)."""
    if not journal.exists():
        return []
    uri = f"file:{journal}?mode=ro"
    try:
        with closing(sqlite3.connect(uri, uri=True, timeout=0.5)) as db:
            return list(db.execute("SELECT state, batch FROM submissions ORDER BY part"))
    except sqlite3.Error:
        return []


def wait_for(condition: Callable[[], bool], process: subprocess.Popen[str], what: str) -> None:
    end = time.monotonic() + 60
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {process.communicate()}")
        if time.monotonic() > end:
            process.kill()
            raise AssertionError(f"never {what}")
        time.sleep(0.01)


def write_when_read(fifo: Path, text: str, reader: subprocess.Popen[str]) -> None:
    """Write ``text`` to the named pipe ``fifo`` once ``reader`` has opened it: an error, not
    a test that hangs, when it ends before."""
    end = time.monotonic() + 60
    while True:
        try:
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as exc:  # (ENXIO: no reader yet)
            if exc.errno != errno.ENXIO:
                raise
            if reader.poll() is not None:
                raise AssertionError(
                    f"the run ended before it read: {reader.communicate()}"
                ) from None
            assert time.monotonic() < end, "the run never read its input"
            time.sleep(0.01)
    os.set_blocking(descriptor, True)
    with os.fdopen(descriptor, "w", encoding="utf-8") as pipe:
        pipe.write(text)


def stats(server: MockServerProcess, key: str) -> dict[str, Any]:
    return server.get(f"/llm/{key}/batch-stats")


def no_canary_in(folder: Path) -> None:
    """No byte of any file the runs wrote holds an API key."""
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for canary in CANARIES:
                assert canary not in data, f"{path.name} holds {canary!r}"


def check_in_order(rows: list[dict[str, Any]], count: int) -> None:
    assert [row["index"] for row in rows] == list(range(count))
    assert [row["id"] for row in rows] == [{"row": n} for n in range(count)]
    for row in rows:
        assert list(row) == RESULT_KEYS


# --- the "done when" ---------------------------------------------------------------------
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_cookbook_file_through_the_batch_api_killed_polling_resumed_then_retried_live(
    server: MockServerProcess, tmp_path: Path, provider: str
) -> None:
    rows, expired = 2000, {10, 1500}
    marks = dict.fromkeys(expired, "[[expire]]") | {7: "[[error]]"}
    source = cookbook(tmp_path / "requests.jsonl", rows, marks)
    url, key = endpoint(server, provider, "pace=0.3,rpm=100000,tpm=100000000")
    # (--batch-retries 0: the expired rows end so, for --retry-failed --live to send later)
    args = command(
        source, url, provider, "--batch-api", "--poll", "0.1", "--batch-rows", "700",
        "--batch-retries", "0",
    )  # fmt: skip
    journal = tmp_path / "requests-journal.sqlite3"

    first = start(args, tmp_path)
    wait_for(
        lambda: sum(state == "in_progress" for state, _ in parts(journal)) >= 1,
        first,
        "a part was in progress",
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    submitted_before = [batch for _, batch in parts(journal) if batch]

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 1, resumed.stderr
    assert "Traceback" not in resumed.stderr
    written = results(tmp_path / "requests-results.jsonl")
    check_in_order(written, rows)
    counts = stats(server, key)
    assert counts["batches_created"] == 3, "2000 rows, 700 a part: three submissions"
    assert counts["twice"] == [] and counts["rows_run"] == rows
    assert {batch["id"] for batch in counts["batches"]} >= set(submitted_before)
    failed = {row["index"]: row for row in written if not row["ok"]}
    assert {n for n, row in failed.items() if row["error_kind"] == "batch_expired"} == expired
    assert failed[7]["status_code"] == 400
    assert failed[7]["error_kind"] == ("status" if provider == "openai" else "batch_errored")
    ok = [row for row in written if row["ok"]]
    assert len(ok) == rows - 3
    assert all(row["attempts"] == 1 and row["status_code"] == 200 for row in ok)
    assert all(row["attempts"] == 0 for n, row in failed.items() if n in expired)
    if provider == "openai":
        assert counts["files_alive"] == [], "every file deleted once the results were in"
    else:
        assert counts["batches_deleted"] == 3

    # The same rows live: the same fields, the same answers (the mock seeds them by body).
    head = tmp_path / "head.jsonl"
    head.write_text("".join(source.read_text().splitlines(keepends=True)[:40]))
    live = run(command(head, url, provider, "-o", "live"), tmp_path)
    assert live.returncode == 0, live.stderr
    for through_batch, sent_live in zip(
        written[:40], results(tmp_path / "live-results.jsonl"), strict=True
    ):
        if through_batch["ok"]:
            same = {"elapsed", "attempt_log", "data"}
            assert {k: v for k, v in through_batch.items() if k not in same} == {
                k: v for k, v in sent_live.items() if k not in same
            }
            answer, live_answer = through_batch["data"], sent_live["data"]
            assert answer.keys() == live_answer.keys()
            unique = {"id", "created"}
            assert {k: answer[k] for k in answer if k not in unique} == {
                k: live_answer[k] for k in live_answer if k not in unique
            }

    # The expired rows (and the refused one), live, under the limits.
    before = server.get(f"/llm/{key}/stats")["requests"]
    again = run([*args[: args.index("--batch-api")], "--retry-failed", "--live"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert server.get(f"/llm/{key}/stats")["requests"] - before == 3
    final = results(tmp_path / "requests-results.jsonl")
    check_in_order(final, rows)
    assert all(row["ok"] for row in final)
    assert stats(server, key)["batches_created"] == 3, "nothing more went through the batch API"
    no_canary_in(tmp_path)


# --- killed in each phase ------------------------------------------------------------------------
# What the journal shows while the run is in each phase, and the mock's knob that holds the run
# there: the upload stored but not yet answered, the batch made but its id not yet answered,
# the batch polled, its results being read.
PHASES: dict[str, tuple[str, Callable[[list[str], dict[str, Any]], bool]]] = {
    "upload": (
        "pace=0.1,stall_upload=0.8",
        lambda states, counts: "planned" in states and counts.get("files_uploaded", 0) > 0,
    ),
    "create": (
        "pace=0.1,stall_create=0.8",
        lambda states, counts: "submitting" in states and counts.get("batches_created", 0) > 0,
    ),
    "polling": ("pace=0.3", lambda states, counts: "in_progress" in states),
    "download": (
        "pace=0.1,stall_results=0.8",
        lambda states, counts: bool({"completed", "ended"} & set(states)),
    ),
}


def counts_so_far(server: MockServerProcess, key: str) -> dict[str, Any]:
    """The mock's batch counts for KEY, empty before its first batch call."""
    try:
        return stats(server, key)
    except OSError:
        return {}


@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_killed_in_each_phase_the_resumed_run_submits_no_part_twice(
    server: MockServerProcess, tmp_path: Path, provider: str, phase: str
) -> None:
    if provider == "anthropic" and phase == "upload":
        pytest.skip("Anthropic's rows go in the create itself: there is no upload")
    knob, in_phase = PHASES[phase]
    rows = 30
    source = cookbook(tmp_path / "in.jsonl", rows)
    url, key = endpoint(server, provider, knob)
    args = command(source, url, provider, "--batch-api", "--poll", "0.05", "--batch-rows", "10")
    journal = tmp_path / "in-journal.sqlite3"

    first = start(args, tmp_path)
    wait_for(
        lambda: in_phase([state for state, _ in parts(journal)], counts_so_far(server, key)),
        first,
        f"in {phase}",
    )
    first.send_signal(signal.SIGKILL)
    first.wait()

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), rows)
    counts = stats(server, key)
    assert counts["twice"] == [], "a row ran in two batches"
    assert counts["batches_run"] == 3 and counts["rows_run"] == rows
    if phase == "create":
        assert counts["batches_created"] == 3, "the batch made before the kill was found again"
    if provider == "openai":
        assert counts["files_alive"] == [], "the file of an upload cut short was deleted too"
    else:
        assert counts["batches_deleted"] == 3
    assert all(state in {"cleaned", "dropped"} for state, _ in parts(journal))


# --- interrupted, cancelled, refused for the queue -----------------------------------------------
def test_ctrl_c_leaves_the_batches_running_and_cancel_collects_what_they_ran(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 20)
    url, key = endpoint(server, "openai", "pace=5")  # (it is cancelled long before it runs)
    args = command(source, url, "openai", "--batch-api", "--poll", "0.05", "--batch-rows", "10")
    journal = tmp_path / "in-journal.sqlite3"
    first = start(args, tmp_path)
    wait_for(lambda: len(parts(journal)) == 2 and all(b for _, b in parts(journal)), first, "sent")
    first.send_signal(signal.SIGINT)
    _, stderr = first.communicate(timeout=60)
    assert first.returncode == 130, stderr
    assert "resume with: python -m batchsync" in stderr and "--batch-api" in stderr
    assert "Traceback" not in stderr
    assert [b["status"] for b in stats(server, key)["batches"]] == ["validating"] * 2

    cancelled = run([*args, "--resume", "--cancel"], tmp_path)
    assert cancelled.returncode == 1, cancelled.stderr
    written = results(tmp_path / "in-results.jsonl")
    assert [row["index"] for row in written] == list(range(20))
    assert {row["error_kind"] for row in written} == {"batch_cancelled"}, written
    assert all(row["attempts"] == 0 for row in written)
    counts = stats(server, key)
    assert [b["status"] for b in counts["batches"]] == ["cancelled"] * 2
    assert counts["files_alive"] == []


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_part_refused_for_the_enqueued_token_cap_waits_and_is_submitted_again(
    server: MockServerProcess, tmp_path: Path, provider: str
) -> None:
    # Each row is about 20 tokens as the mock counts them: 10 rows a part, one part at a time.
    source = cookbook(tmp_path / "in.jsonl", 30)
    url, key = endpoint(server, provider, "pace=0.1,enqueued=300")
    args = command(source, url, provider, "--batch-api", "--poll", "0.1", "--batch-rows", "10")
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 30)
    counts = stats(server, key)
    assert counts["refused_creates"] > 0, "the cap refused a part"
    assert counts["batches_run"] == 3 and counts["twice"] == []
    if provider == "openai":  # (its batch fails later: the part waits, and the run says so)
        assert "enqueued-token cap" in done.stderr
    # (Anthropic's 429 refuses the create itself: tried again as a live 429 is, by its wait)


# --- what a live run may not do, and what the command line refuses -------------------------------
def test_a_live_run_is_refused_while_batches_of_the_journal_are_open(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 5)
    url, key = endpoint(server, "openai", "pace=5")
    args = command(source, url, "openai", "--batch-api", "--poll", "0.05")
    journal = tmp_path / "in-journal.sqlite3"
    first = start(args, tmp_path)
    wait_for(lambda: any(b for _, b in parts(journal)), first, "submitted")
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = parts(journal)
    for more in (["--resume"], ["--resume", "--live"], ["--resume", "--retry-failed", "--live"]):
        refused = run([*command(source, url, "openai"), *more], tmp_path)
        assert refused.returncode == 2, refused.stderr
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in refused.stderr, lines
        assert "still open" in lines[0] or "--batch-api" in lines[0]
    assert parts(journal) == before
    assert not list(tmp_path.glob("in-results.*")) and not list(tmp_path.glob("in-failed.*"))
    assert stats(server, key)["batches_created"] == 1


LIBRARY_RUN = """
import json, sys
from batchsync import Batch
rows = [json.loads(line) for line in open(sys.argv[1])]
Batch(rows, url=sys.argv[2], batch_api="auto", journal=sys.argv[3], poll=0.05, progress=False,
      headers={"Authorization": "Bearer sk-canary-openai-7Qx"}).run()
"""
KEY_HEADER = {"Authorization": "Bearer sk-canary-openai-7Qx"}


def test_a_notebooks_batch_submits_then_a_new_batch_later_collects_what_ran(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 12, {3: "[[expire]]"})
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    url, key = endpoint(server, "openai", "pace=0.5")
    journal = tmp_path / "lab.sqlite3"
    script = [sys.executable, "-c", LIBRARY_RUN, str(source), url, str(journal)]
    closed_laptop = start(script, tmp_path)
    wait_for(lambda: any(b for _, b in parts(journal)), closed_laptop, "submitted")
    closed_laptop.send_signal(signal.SIGKILL)
    closed_laptop.wait()

    later = Batch(
        rows, url=url, batch_api="auto", journal=journal, poll=0.05, progress=False,
        headers=KEY_HEADER, batch_retries=0,
    )  # fmt: skip
    results_set = later.run()
    assert [r.index for r in results_set] == list(range(12))
    assert [r.id for r in results_set] == [{"row": n} for n in range(12)]
    assert [r.error_kind for r in results_set if not r.ok] == ["batch_expired"]
    assert results_set[0].data["object"] == "chat.completion"
    counts = stats(server, key)
    assert counts["batches_run"] == 1 and counts["twice"] == []
    assert counts["files_alive"] == []
    # Its expired row again through the batch endpoint, in a second pass.
    again = later.run(retry_failed=True)
    assert [r.index for r in again] == list(range(12))
    assert stats(server, key)["batches_created"] == 2
    assert again[3].error_kind == "batch_expired", "the marker expires it again"
    assert again[3].attempts == 0
    no_canary_in(tmp_path)


def test_a_live_batch_is_refused_while_its_rows_are_in_batches_still_open(
    server: MockServerProcess, tmp_path: Path
) -> None:
    rows = [{"text": f"question {n}"} for n in range(4)]
    body = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}
    url, key = endpoint(server, "openai", "pace=5")
    journal = tmp_path / "j.sqlite3"
    same: dict[str, Any] = {
        "url": url, "method": "POST", "body": body, "journal": journal, "progress": False,
        "headers": KEY_HEADER,
    }  # fmt: skip
    through_batch = Batch(rows, batch_api="auto", poll=0.05, deadline=1.0, **same)
    assert {r.error_kind for r in through_batch.run()} == {"deadline"}
    with pytest.raises(ValueError, match="still open"):
        Batch(rows, **same).run(retry_failed=True)
    assert stats(server, key)["batches_created"] == 1
    assert server.get(f"/llm/{key}/stats")["requests"] == 0, "nothing was sent live"


@pytest.mark.parametrize(
    ("more", "said"),
    [
        (["--batch-api"], "needs --url"),
        (["--url", "http://127.0.0.1:9/v1/other", "--row-as-body", "--batch-api"], "provider"),
        (
            ["--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api=openai"],
            "must end in one of the endpoints",
        ),
        (
            [
                "--url",
                "http://127.0.0.1:9/v1/messages",
                "--row-as-body",
                "--batch-api",
                "--live",
                "--resume",
            ],
            "contradict",
        ),
        (
            ["--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api", "--cancel"],
            "--cancel",
        ),
        (
            ["--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--poll", "1"],
            "go with batch_api",
        ),
        (
            ["--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api=azure"],
            "azure",
        ),
        (
            ["--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api", "--dedup"],
            "dedup",
        ),
        (["--url", "http://127.0.0.1:9/v1/messages", "--batch-api"], "--row-as-body"),
        (
            ["--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api", "-c", "4"],
            "concurrency",
        ),
        (
            [
                *("--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api"),
                *("--rate", "auto", "--adaptive"),
            ],
            "adaptive, rate",
        ),
        (
            [
                *("--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api"),
                *("--auth-command", "echo sk-from-a-command"),
            ],
            "--auth-command",
        ),
        (
            [
                *("--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api"),
                *("--redis", "redis://127.0.0.1:9/0"),
            ],
            "--redis",
        ),
        (
            [
                *("--url", "http://127.0.0.1:9/v1/messages", "--row-as-body", "--batch-api"),
                *("--method", "GET"),
            ],
            "--method GET",
        ),
    ],
)
def test_a_batch_run_that_cannot_be_is_exit_2_in_one_line_nothing_written(
    tmp_path: Path, more: list[str], said: str
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 3)
    refused = run([sys.executable, "-m", "batchsync", str(source), *more], tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert said in refused.stderr and "Traceback" not in refused.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.jsonl"]


# --- a tampered journal ---------------------------------------------------------------------------
# Tamperings a run cannot tell from a journal as a run leaves it, and what they cost.
UNTOLD: dict[tuple[str | None, str], str] = {
    (None, "drop"): "a journal made before submissions has none: its open parts' rows would "
    "be submitted again (a cost, never a row's Result mixed up); documented",
    (None, "delete"): "a journal whose last part was never recorded looks the same: as drop",
}


def test_every_tampering_of_the_submissions_is_refused_before_anything_is_sent(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """The journal's ``submissions`` rows say which batch to poll and which files to delete:
    each value of each row altered (as tests/test_journal_tamper.py alters the other tables),
    a row copied or deleted, is refused in one line naming the table, the journal as it was."""
    source = cookbook(tmp_path / "in.jsonl", 6)
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    url, _ = endpoint(server, "openai", "pace=30")
    folder = tmp_path / "source"
    folder.mkdir()
    journal = folder / "lab.sqlite3"
    script = [sys.executable, "-c", LIBRARY_RUN, str(source), url, str(journal)]
    with_open_parts = start([*script[:3], str(source), url, str(journal)], tmp_path)
    wait_for(lambda: any(b for _, b in parts(journal)), with_open_parts, "submitted")
    with_open_parts.send_signal(signal.SIGKILL)
    with_open_parts.wait()
    for stale in folder.glob("*.lock"):
        stale.unlink()
    arguments: dict[str, Any] = {"url": url, "batch_api": "auto", "progress": False}
    Batch(rows, journal=journal, **arguments)  # (trusted as it is)

    failures, refused = [], 0
    for number, case in enumerate(tamper.cases(journal, "submissions")):
        copy = tamper.copy_of(folder, tmp_path / str(number))
        altered = copy / "lab.sqlite3"
        if not tamper.apply(altered, case):
            continue
        before = tamper.snapshot(copy)
        try:
            Batch(rows, journal=altered, **arguments)
        except ValueError as exc:
            problem = tamper.refusal_problem(case, 2, str(exc))
            if problem is None and tamper.snapshot(copy) != before:
                problem = "the journal changed"
            refused += problem is None
        else:
            problem = None if (case.column, case.tampering) in UNTOLD else "trusted"
        if problem is not None:
            failures.append(f"{case}: {problem}")
    assert not failures, "\n".join(failures)
    assert refused > 100


# --- the wait bounded, the files kept -------------------------------------------------------------
def test_the_deadline_ends_the_wait_and_a_retry_polls_the_same_batch(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 8)
    url, key = endpoint(server, "openai", "pace=1")
    args = command(source, url, "openai", "--batch-api", "--poll", "0.1")
    ended = run([*args, "--deadline", "0.5"], tmp_path)
    assert ended.returncode == 1, ended.stderr
    written = results(tmp_path / "in-results.jsonl")
    assert {row["error_kind"] for row in written} == {"deadline"}
    assert "still validating at the provider" in written[0]["error"]
    assert [b["status"] for b in stats(server, key)["batches"]] != ["cancelled"]

    again = run([*args, "--retry-failed"], tmp_path)
    assert again.returncode == 0, again.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 8)
    counts = stats(server, key)
    assert counts["batches_created"] == 1, "the retry polled the batch it had, not a new one"
    assert counts["files_alive"] == []


def test_keep_files_leaves_the_files_at_the_provider(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 4, {1: "[[expire]]"})
    url, key = endpoint(server, "openai", "pace=0.1")
    done = run(
        command(
            source, url, "openai", "--batch-api", "--poll", "0.05", "--keep-files",
            "--batch-retries", "0",
        ),
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    # The input, output and error files.
    assert len(stats(server, key)["files_alive"]) == 3
    assert {state for state, _ in parts(tmp_path / "in-journal.sqlite3")} == {"cleaned"}


# --- a hostile provider ---------------------------------------------------------------------------
class _Recorder(http.server.BaseHTTPRequestHandler):
    """Another origin: records every request it gets (none should come)."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A batch API that misbehaves, by the first segment of the path: ``anthropic``, its
    results URL on another origin; ``openai``, its batch answered by a redirect there;
    ``echo``, results whose errors repeat the API key; ``huge``, a results line longer than
    ``--max-bytes``; ``stall``, a batch object that stops halfway; ``foreign``, results that
    are the rows of another part."""

    elsewhere = ""
    custom_ids: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        if self.path.endswith("/files"):
            self._json({"id": "file-1", "object": "file"})
            return
        if self.path.endswith("/messages/batches"):
            requests = json.loads(body)["requests"]
            type(self).custom_ids = [request["custom_id"] for request in requests]
        self._batch()

    def do_GET(self) -> None:
        mode = self.path.split("/")[1]
        if mode == "openai":
            self.send_response(302)
            self.send_header("Location", f"{self.elsewhere}/batch")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif mode == "stall":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"id"')
            self.wfile.flush()
            time.sleep(3)
        elif self.path.endswith("/results"):
            self._results(mode)
        else:
            self._batch()

    def do_DELETE(self) -> None:
        self._json({"id": "msgbatch_1", "type": "message_batch_deleted"})

    def _batch(self) -> None:
        mode = self.path.split("/")[1]
        if mode in ("openai", "stall"):
            self._json({"id": "batch_1", "status": "validating", "input_file_id": "file-1"})
            return
        rows = len(self.custom_ids) or 3
        counts = {"processing": 0, "succeeded": rows, "errored": 0, "canceled": 0, "expired": 0}
        here = f"http://{self.headers['Host']}/{mode}/v1/messages/batches/msgbatch_1/results"
        self._json(
            {
                "id": "msgbatch_1",
                "processing_status": "ended",
                "request_counts": counts,
                "results_url": f"{self.elsewhere}/results" if mode == "anthropic" else here,
            }
        )

    def _results(self, mode: str) -> None:
        key = self.headers.get("x-api-key", "")
        lines = []
        for number, given in enumerate(self.custom_ids):
            # (``foreign``: rows of another part, another nonce)
            custom_id = f"0123456789ab-{number}" if mode == "foreign" else given
            text = "x" * 300_000 if mode == "huge" and number == 1 else "fine"
            message = {"content": [{"type": "text", "text": text}], "usage": {}}
            result: dict[str, Any] = {"type": "succeeded", "message": message}
            if mode == "echo":
                inner = {"type": "authentication_error", "message": f"invalid x-api-key {key}"}
                result = {"type": "errored", "error": {"type": "error", "error": inner}}
            lines.append(json.dumps({"custom_id": custom_id, "result": result}))
        body = "\n".join(lines).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def hostile() -> Iterator[str]:
    recorder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    provider = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    _Hostile.elsewhere = f"http://127.0.0.1:{recorder.server_address[1]}"
    _Hostile.custom_ids = []
    _Recorder.seen.clear()
    for running in (recorder, provider):
        threading.Thread(target=running.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{provider.server_address[1]}"
    finally:
        for running in (recorder, provider):
            running.shutdown()
            running.server_close()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_api_key_goes_to_the_endpoints_origin_only(
    hostile: str, tmp_path: Path, provider: str
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 3)
    url = f"{hostile}/{provider}{PROVIDERS[provider][0]}"
    args = command(source, url, provider, "--batch-api", "--poll", "0.05", "--deadline", "1.5")
    done = run([*args, "-vv"], tmp_path)
    assert _Recorder.seen == [], "nothing went to the other origin"
    # (the redirect is not followed; the batch is held at the provider, its rows failed for
    # this run, and a later --retry-failed reads it again)
    assert done.returncode == 1, done.stderr
    written = results(tmp_path / "in-results.jsonl")
    assert {row["error_kind"] for row in written} == {"batch_errored"}
    said = "another origin" if provider == "anthropic" else "could not poll the batch: HTTP 302"
    assert said in written[0]["error"]
    assert [state for state, _ in parts(tmp_path / "in-journal.sqlite3")] == ["held"]
    no_canary_in(tmp_path)
    assert not any(canary.decode() in done.stderr for canary in CANARIES)


def test_cancel_reaches_a_batch_whose_rows_the_deadline_ended_then_live_may_go_on(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 5)
    url, key = endpoint(server, "openai", "pace=5,rpm=100000,tpm=100000000")
    args = command(source, url, "openai", "--batch-api", "--poll", "0.1")
    assert run([*args, "--deadline", "0.5"], tmp_path).returncode == 1
    written = results(tmp_path / "in-results.jsonl")
    assert {row["error_kind"] for row in written} == {"deadline"}
    assert all(row["elapsed"] == 0 for row in written), "(counted once the batch is collected)"
    live = command(source, url, "openai", "--retry-failed", "--live")
    assert run(live, tmp_path).returncode == 2, "the batch still holds the rows"

    cancelled = run([*args, "--resume", "--cancel"], tmp_path)
    assert cancelled.returncode == 1, cancelled.stderr
    assert [b["status"] for b in stats(server, key)["batches"]] == ["cancelling"]
    went_live = run(live, tmp_path)
    assert went_live.returncode == 0, went_live.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 5)
    assert server.get(f"/llm/{key}/stats")["requests"] == 5


def test_a_providers_message_that_repeats_the_key_is_written_masked(
    hostile: str, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 3)
    args = command(
        source, f"{hostile}/echo/v1/messages", "anthropic", "--batch-api", "--poll", "0.05"
    )
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr
    written = results(tmp_path / "in-results.jsonl")
    assert {row["error_kind"] for row in written} == {"batch_errored"}
    assert written[0]["error"] == "authentication_error: invalid x-api-key ***"
    assert written[0]["status_code"] == 401
    no_canary_in(tmp_path)


def test_a_results_line_longer_than_max_bytes_is_its_rows_invalid_body(
    hostile: str, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 3)
    url = f"{hostile}/huge/v1/messages"
    args = command(
        source, url, "anthropic", "--batch-api", "--poll", "0.05", "--max-bytes", "100000"
    )
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr
    written = results(tmp_path / "in-results.jsonl")
    assert [row["error_kind"] for row in written] == [None, "invalid_body", None]
    assert "larger than max_bytes (100000)" in written[1]["error"]


def test_a_batch_object_that_stops_halfway_is_polled_again_until_the_deadline(
    hostile: str, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 2)
    url = f"{hostile}/stall/v1/chat/completions"
    more = ("--batch-api", "--poll", "0.05", "--timeout", "1", "--attempts", "1")
    done = run([*command(source, url, "openai", *more), "--deadline", "4"], tmp_path)
    assert done.returncode == 1, done.stderr
    assert {row["error_kind"] for row in results(tmp_path / "in-results.jsonl")} == {"deadline"}


def test_an_anthropic_part_refused_for_the_queue_never_takes_another_runs_batch(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """Two runs on one account: the second's part is refused (429) while the first's batch of
    as many rows runs; it waits and is submitted itself, never taking the first's batch.

    The second run is started first, reading its rows from a named pipe: they are written
    once the first's batch is in, so that the second's create comes within the first's
    4 s in progress however long a loaded machine takes to start a Python."""
    url, key = endpoint(server, "anthropic", "pace=2,enqueued=250")
    first_rows = cookbook(tmp_path / "first.jsonl", 10)
    second_rows = tmp_path / "second.jsonl"
    os.mkfifo(second_rows)
    second = start(
        command(second_rows, url, "anthropic", "--batch-api", "--poll", "0.1", "-o", "second"),
        tmp_path,
    )
    first = start(command(first_rows, url, "anthropic", "--batch-api", "--poll", "0.1"), tmp_path)
    wait_for(lambda: any(b for _, b in parts(tmp_path / "first-journal.sqlite3")), first, "sent")
    write_when_read(second_rows, first_rows.read_text().replace("question", "other"), second)
    _, said = second.communicate(timeout=120)
    first.wait(timeout=60)
    assert first.returncode == 0 and second.returncode == 0, said
    counts = stats(server, key)
    assert counts["refused_creates"] > 0 and counts["batches_run"] == 2
    assert counts["rows_run"] == 20 and counts["twice"] == []
    answers = [row["data"]["id"] for row in results(tmp_path / "first-results.jsonl")]
    others = [row["data"]["id"] for row in results(tmp_path / "second-results.jsonl")]
    assert not set(answers) & set(others), "the second run took the first's answers"


def test_a_live_resume_is_refused_while_a_create_got_no_answer(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 5)
    url, key = endpoint(server, "openai", "pace=0.3,stall_create=3")
    journal = tmp_path / "in-journal.sqlite3"
    first = start(command(source, url, "openai", "--batch-api", "--poll", "0.05"), tmp_path)
    wait_for(
        lambda: (
            "submitting" in [state for state, _ in parts(journal)]
            and counts_so_far(server, key).get("batches_created", 0) > 0
        ),
        first,
        "creating",
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    live = run(command(source, url, "openai", "--resume", "--live"), tmp_path)
    assert live.returncode == 2, live.stderr
    assert "still open" in live.stderr
    assert server.get(f"/llm/{key}/stats")["requests"] == 0


def test_rows_collected_before_a_stop_keep_their_results_when_the_rest_is_collected(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 10)
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    url, _ = endpoint(server, "anthropic", "pace=0.1")
    seen: list[int] = []

    def stop_after_three(result: Any) -> None:
        seen.append(result.index)
        if len(seen) == 3:
            raise KeyboardInterrupt

    same: dict[str, Any] = {
        "url": url, "batch_api": "auto", "journal": tmp_path / "j.sqlite3", "poll": 0.05,
        "progress": False, "headers": {"x-api-key": "sk-ant-canary-9Zk"},
    }  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        Batch(rows, on_result=stop_after_three, **same).run()
    first = list(seen)
    collected = Batch(rows, on_result=lambda result: seen.append(result.index), **same).run()
    assert [r.id for r in collected] == [{"row": n} for n in range(10)]
    assert sorted(seen[3:]) == sorted(set(range(10)) - set(first)), "each row delivered once"


def test_fresh_is_refused_while_the_journals_batches_are_open(
    server: MockServerProcess, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 4)
    url, key = endpoint(server, "openai", "pace=5")
    args = command(source, url, "openai", "--batch-api", "--poll", "0.05")
    assert run([*args, "--deadline", "0.3"], tmp_path).returncode == 1
    for again in ([*args, "--fresh"], [*command(source, url, "openai"), "--fresh"]):
        refused = run(again, tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert "--fresh would forget them" in refused.stderr
    assert stats(server, key)["batches_created"] == 1
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    library = Batch(rows, url=url, batch_api="auto", journal=tmp_path / "lib.sqlite3",
                    poll=0.05, deadline=0.3, progress=False)  # fmt: skip
    library.run()
    with pytest.raises(ValueError, match="fresh=True would forget them"):
        Batch(rows, url=url, batch_api="auto", journal=tmp_path / "lib.sqlite3", fresh=True)


def test_a_retry_of_a_batch_without_journal_with_new_options_polls_its_batch(
    server: MockServerProcess, tmp_path: Path
) -> None:
    rows = [
        json.loads(line) for line in cookbook(tmp_path / "in.jsonl", 4).read_text().splitlines()
    ]
    url, key = endpoint(server, "openai", "pace=0.5")
    ran_out = Batch(rows, url=url, batch_api="auto", poll=0.05, deadline=0.3, progress=False).run()
    assert {r.error_kind for r in ran_out} == {"deadline"}
    retried = ran_out.retry_failed(deadline=None)
    assert all(r.ok for r in retried)
    assert stats(server, key)["batches_created"] == 1, "its batch polled again, not resubmitted"


def test_a_batch_whose_results_are_another_parts_rows_is_not_taken(
    hostile: str, tmp_path: Path
) -> None:
    source = cookbook(tmp_path / "in.jsonl", 3)
    url = f"{hostile}/foreign/v1/messages"
    done = run(command(source, url, "anthropic", "--batch-api", "--poll", "0.05"), tmp_path)
    assert done.returncode == 3, done.stderr
    assert "lists rows of another part" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "in-results.jsonl").exists()


def test_a_part_made_after_the_deadline_is_kept_for_its_rows_not_closed_unread(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """The deadline ends a run while its create is unanswered (the batch made, its id not
    heard): the rows end ``deadline``. A --resume finds the batch, ended, though no row of it
    is given to that run: it is kept (held), not closed unread, and --retry-failed reads its
    answers instead of submitting the rows again."""
    source = cookbook(tmp_path / "in.jsonl", 10)
    url, key = endpoint(server, "openai", "pace=0.4,stall_create=1")
    args = command(source, url, "openai", "--batch-api", "--poll", "0.05")
    first = run([*args, "--deadline", "0.5"], tmp_path)
    assert first.returncode == 1, first.stderr
    assert {row["error_kind"] for row in results(tmp_path / "in-results.jsonl")} == {"deadline"}
    end = time.monotonic() + 30
    while [batch["status"] for batch in stats(server, key)["batches"]] != ["completed"]:
        assert time.monotonic() < end, "the batch never ended"
        time.sleep(0.05)
    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 1, resumed.stderr
    assert [state for state, _ in parts(tmp_path / "in-journal.sqlite3")] == ["held"]
    retried = run([*args, "--retry-failed"], tmp_path)
    assert retried.returncode == 0, retried.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 10)
    counts = stats(server, key)
    assert counts["batches_created"] == 1 and counts["twice"] == [], "no row paid twice"
