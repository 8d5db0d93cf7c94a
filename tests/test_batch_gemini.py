"""Gemini's batch mode, a third provider behind the same interface: a JSONL of
GenerateContentRequest bodies split into parts, each uploaded through the Files API
(resumable), made a batch with ``models/MODEL:batchGenerateContent``, polled, its results read
by key and put in input order; a run killed while it polls, or while a create is unanswered,
is resumed without making a batch twice. Counted by the mock (batchsync/mock/gemini.py)."""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from .mockserver import MockServerProcess
from .test_batch_api import check_in_order, results, run, start, wait_for

pytestmark = pytest.mark.integration

CANARY = "gemini-canary-4Fq"


def gemini(server: MockServerProcess, knobs: str) -> tuple[str, str]:
    key = uuid.uuid4().hex[:10]
    return f"{server.url}/gemini/{key}/{knobs}/v1beta/models/gemini-2.5-flash:generateContent", key


def requests_file(path: Path, count: int, marks: dict[int, str] | None = None) -> Path:
    """GenerateContentRequest bodies, one a line, each with its ``metadata`` (the row's id)."""
    marks = marks or {}
    lines = [
        {
            "contents": [{"role": "user", "parts": [{"text": f"question {n} {marks.get(n, '')}"}]}],
            "metadata": {"row": n},
        }
        for n in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def command(source: Path, url: str, *more: str) -> list[str]:
    return [
        sys.executable, "-m", "batchsync", str(source), "--url", url, "--row-as-body",
        "--no-progress", "--batch-api", "--poll", "0.05", "-H", f"x-goog-api-key: {CANARY}",
        *more,
    ]  # fmt: skip


def stats(server: MockServerProcess, key: str) -> dict[str, Any]:
    return server.get(f"/gemini/{key}/batch-stats")


def states(journal: Path) -> list[str]:
    if not journal.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True, timeout=0.5)) as db:
            return [state for (state,) in db.execute("SELECT state FROM submissions")]
    except sqlite3.Error:
        return []


@pytest.mark.parametrize(
    ("knobs", "in_phase"),
    [
        ("pace=0.5", lambda found: "BATCH_STATE_RUNNING" in found),  # (killed while polling)
        ("pace=0.2,stall_create=0.8", lambda found: "submitting" in found),  # (create unanswered)
    ],
)
def test_a_jsonl_through_gemini_batch_mode_killed_then_resumed_makes_no_batch_twice(
    server: MockServerProcess, tmp_path: Path, knobs: str, in_phase: Any
) -> None:
    rows = 30
    source = requests_file(tmp_path / "in.jsonl", rows, {4: "[[error]]"})
    url, key = gemini(server, knobs)
    args = command(source, url, "--batch-rows", "10")
    journal = tmp_path / "in-journal.sqlite3"
    first = start(args, tmp_path)
    wait_for(lambda: in_phase(states(journal)), first, "in the phase")
    first.send_signal(signal.SIGKILL)
    first.wait()

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 1, resumed.stderr  # (row 4 is refused)
    assert "Traceback" not in resumed.stderr
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, rows)
    failed = [row for row in written if not row["ok"]]
    assert [(row["index"], row["status_code"], row["error_kind"]) for row in failed] == [
        (4, 400, "batch_errored")
    ]
    ok = written[0]
    assert ok["data"]["candidates"][0]["content"]["role"] == "model"
    assert ok["attempt_log"][0]["lane"] == "batch"
    counts = stats(server, key)
    assert counts["batches_created"] == 3, "three parts, one batch each"
    assert counts["twice"] == [] and counts["rows_answered"] == rows
    assert counts["files_alive"] == [], "the inputs and results deleted once journaled"
    assert all(batch["deleted"] for batch in counts["batches"])
    assert set(states(journal)) == {"cleaned"}
    # Its tokens, as the answers' usageMetadata says.
    with closing(sqlite3.connect(journal)) as db:
        inputs, outputs = db.execute(
            "SELECT SUM(input_tokens), SUM(output_tokens) FROM submissions"
        ).fetchone()
    usage = [row["data"]["usageMetadata"] for row in written if row["ok"]]
    assert inputs == sum(u["promptTokenCount"] for u in usage)
    assert outputs == sum(u["candidatesTokenCount"] for u in usage)
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert CANARY.encode() not in path.read_bytes(), path.name


def test_the_google_genai_clients_batch_calls_work_against_the_mock(
    server: MockServerProcess, tmp_path: Path
) -> None:
    genai = pytest.importorskip("google.genai")
    key = uuid.uuid4().hex[:10]
    base = f"{server.url}/gemini/{key}/pace=0.1"
    client = genai.Client(api_key="sdk-key", http_options={"base_url": base})
    lines = [
        {"key": f"request-{n}", "request": {"contents": [{"parts": [{"text": f"q {n}"}]}]}}
        for n in range(5)
    ]
    source = tmp_path / "requests.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    uploaded = client.files.upload(
        file=str(source), config={"display_name": "sdk-rows", "mime_type": "jsonl"}
    )
    assert uploaded.name.startswith("files/")
    job = client.batches.create(
        model="gemini-2.5-flash", src=uploaded.name, config={"display_name": "sdk-job"}
    )
    assert job.name.startswith("batches/")
    for _ in range(100):
        job = client.batches.get(name=job.name)
        if job.state.name == "JOB_STATE_SUCCEEDED":
            break
        time.sleep(0.05)
    assert job.state.name == "JOB_STATE_SUCCEEDED"
    assert job.dest is not None and job.dest.file_name
    content = client.files.download(file=job.dest.file_name)
    answered = [json.loads(line) for line in content.decode().splitlines()]
    assert sorted(line["key"] for line in answered) == [f"request-{n}" for n in range(5)]
    assert all("candidates" in line["response"] for line in answered)
    assert any(listed.name == job.name for listed in client.batches.list())
    other = client.batches.create(model="gemini-2.5-flash", src=uploaded.name)
    client.batches.cancel(name=other.name)
    client.batches.delete(name=job.name)
    assert stats(server, key)["batches_created"] == 2


def test_ids_that_are_path_segments_are_no_ids() -> None:
    from batchsync.store.submissions import well_formed

    for given in (".", "..", "...", ""):
        assert well_formed("gemini", "batch", given) is None, given
        assert well_formed("gemini", "file", given) is None, given
    assert well_formed("gemini", "batch", "b.1") == "b.1"
    assert well_formed("openai", "batch", "batch_..") == "batch_.."


def test_a_list_that_never_ends_is_given_up_not_followed_for_ever() -> None:
    """Every page empty with a new token (a hostile or broken provider): the look for a batch
    stops at a bound, a retryable refusal (the part waits, never submitted again on a guess)."""
    from batchsync.batches.client import _MOST_PAGES, Client, Clocks, ProviderRefused
    from batchsync.batches.gemini import Gemini

    asked: list[dict[str, Any]] = []

    class Endless:
        clocks = Clocks()

        def _json(self, method: str, url: str, doing: str, params: dict[str, Any]) -> Any:
            asked.append(params)
            return {"operations": [], "nextPageToken": f"t{len(asked)}"}

    gemini = Gemini()
    pages = Client._pages(Endless(), "u", "batches", gemini.list_params, gemini.listed)  # type: ignore[arg-type]
    with pytest.raises(ProviderRefused, match="cannot be followed to its end") as refused:
        for _ in pages:
            pass
    assert refused.value.retryable
    assert len(asked) == _MOST_PAGES
    assert asked[1] == {"pageSize": 100, "pageToken": "t1"}
