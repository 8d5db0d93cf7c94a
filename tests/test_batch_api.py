"""Runs through the providers' batch endpoints (``--batch-api``, ``batch_api=``) against the
mock of both batch APIs (scripts/mock_batch.py): the command line and the library, split into
parts, killed in each phase and resumed, interrupted, cancelled, refused for the enqueued-token
cap, retried live; every row one Result, in input order, shaped as a live run's; no part
submitted twice, as the mock counts; no secret in any byte written."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from batchsync import Batch

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
        args, cwd=cwd, capture_output=True, text=True, timeout=300, env=_environment()
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
    marks = {n: "[[expire]]" for n in expired} | {7: "[[error]]"}
    source = cookbook(tmp_path / "requests.jsonl", rows, marks)
    url, key = endpoint(server, provider, "pace=0.5,rpm=100000,tpm=100000000")
    args = command(source, url, provider, "--batch-api", "--poll", "0.1", "--batch-rows", "700")
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
    for through_batch, sent_live in zip(written[:40], results(tmp_path / "live-results.jsonl")):
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
        "pace=0.1,stall_upload=1.5",
        lambda states, counts: "planned" in states and counts.get("files_uploaded", 0) > 0,
    ),
    "create": (
        "pace=0.1,stall_create=1.5",
        lambda states, counts: "submitting" in states and counts.get("batches_created", 0) > 0,
    ),
    "polling": ("pace=0.5", lambda states, counts: "in_progress" in states),
    "download": (
        "pace=0.1,stall_results=1.5",
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
    assert all(state == "cleaned" or state == "dropped" for state, _ in parts(journal))
