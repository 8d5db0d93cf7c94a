"""A generated property of the batch endpoint, over both providers: whatever the provider does
(one refused poll or download, a lost or unreadable answer, a clock ten minutes off, a key busy
with thousands of others' batches, a status nobody documented, a row it answers in JSON Python
cannot read), wherever the run is killed (upload, create, polling, download) and however it
goes on (``--resume``, ``--retry-failed``, ``--cancel``):

* no row runs twice, as the provider counts;
* every row ends with exactly one Result, in input order, and an answer is its own row's (the
  one a live call of the same row gets, but for its id and time);
* the exit code matches the Results;
* nothing the run made is left at the provider once its parts are closed (a part the run had
  to hold is read again by ``--retry-failed``, which closes it).

``BATCHSYNC_PROPERTY_EXAMPLES`` runs more cases than the suite's default.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .hostile_batch import HostileProvider, deep_json, results_lines, set_fields
from .mockserver import MockServerProcess
from .test_batch_api import PROVIDERS, command, cookbook, parts, results, run, start
from .test_batch_hostile import CREATE, DOWNLOAD, POLL, _unreadable_row

pytestmark = pytest.mark.integration

ROWS = 5
EXAMPLES = int(os.environ.get("BATCHSYNC_PROPERTY_EXAMPLES", "8"))
KNOBS = "pace=0.2,rpm=100000,tpm=100000000"

Fault = Callable[[HostileProvider, str], None]
FAULTS: dict[str, Fault] = {
    "none": lambda hostile, provider: None,
    "poll 404": lambda hostile, provider: hostile.once("GET", POLL, status=404),
    "download 403": lambda hostile, provider: hostile.once("GET", DOWNLOAD, status=403),
    "poll 503": lambda hostile, provider: hostile.once("GET", POLL, status=503),
    "create answer lost": lambda hostile, provider: hostile.drop("POST", CREATE),
    "provider clock +10 min": lambda hostile, provider: setattr(hostile, "skew", 600.0),
    "provider clock -10 min": lambda hostile, provider: setattr(hostile, "skew", -600.0),
    "3000 other batches": lambda hostile, provider: setattr(hostile, "other_batches", 3000),
    "poll answer deep": lambda hostile, provider: hostile.rewrite(
        "GET", POLL, lambda body: deep_json(), times=1
    ),
    "unknown status": lambda hostile, provider: hostile.rewrite(
        "POST",
        CREATE,
        set_fields(**{"status" if provider == "openai" else "processing_status": "queued"}),
        times=1,
    ),
    "row 2 unreadable": lambda hostile, provider: hostile.rewrite(
        "GET", DOWNLOAD, results_lines(_unreadable_row(deep_json)), times=1
    ),
}
# Where a run is killed: the call held while it happens, and what says it has.
KILLS = ("none", "upload", "create", "polling", "download")
GOING_ON = {
    "resume": ["--resume"],
    "retry-failed": ["--resume", "--retry-failed"],
    "cancel": ["--resume", "--cancel"],
}


def counts(server: MockServerProcess, key: str) -> dict[str, Any]:
    try:
        return server.get(f"/llm/{key}/batch-stats")
    except OSError:
        return {}


def killed_in(
    phase: str, hostile: HostileProvider, server: MockServerProcess, key: str, journal: Path
) -> Callable[[], bool]:
    """Holds the call of ``phase`` and says when the run is in it."""
    if phase == "upload":
        hostile.hold("POST", r"/v1/files$", 20.0)
        return lambda: counts(server, key).get("files_uploaded", 0) > 0
    if phase == "create":
        hostile.hold("POST", CREATE, 20.0)
        return lambda: counts(server, key).get("batches_created", 0) > 0
    if phase == "download":
        hostile.hold("GET", DOWNLOAD, 20.0)
        return lambda: hostile.count("GET", DOWNLOAD) > 0
    return lambda: bool({"validating", "in_progress"} & {s for s, _ in parts(journal)})


def own_answers(url: str, provider: str, rows: list[dict[str, Any]], written: list[Any]) -> None:
    """Each ok row's answer is the one a live call of its row gets (the mock draws an answer
    from the KEY and the body), but for its id and time."""
    headers = dict(
        line.split(": ", 1) for line in PROVIDERS[provider][1] if not line.startswith("-")
    )
    for row, result in zip(rows, written, strict=True):
        if not result["ok"]:
            continue
        body = {k: v for k, v in row.items() if k != "metadata"}
        live = requests.post(url, json=body, headers=headers, timeout=30).json()
        unique = {"id", "created"}
        assert {k: v for k, v in result["data"].items() if k not in unique} == {
            k: v for k, v in live.items() if k not in unique
        }


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    provider=st.sampled_from(sorted(PROVIDERS)),
    fault=st.sampled_from(sorted(FAULTS)),
    kill=st.sampled_from(KILLS),
    going_on=st.sampled_from(sorted(GOING_ON)),
)
def test_no_row_twice_each_row_its_own_answer_nothing_left_behind(  # noqa: PLR0917
    server: MockServerProcess,
    tmp_path_factory: pytest.TempPathFactory,
    provider: str,
    fault: str,
    kill: str,
    going_on: str,
) -> None:
    if provider == "anthropic" and kill == "upload":
        kill = "create"  # (Anthropic's rows go in the create: there is no upload)
    folder = tmp_path_factory.mktemp("case")
    key = uuid.uuid4().hex[:10]
    source = cookbook(folder / "in.jsonl", ROWS)
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    journal = folder / "in-journal.sqlite3"
    with HostileProvider(upstream=server.url) as hostile:
        url = f"{hostile.url}/llm/{key}/{KNOBS}{PROVIDERS[provider][0]}"
        args = command(source, url, provider, "--batch-api", "--poll", "0.05")
        FAULTS[fault](hostile, provider)
        if kill == "none":
            first = run(args, folder)
            assert first.returncode in (0, 1), first.stderr
        else:
            in_phase = killed_in(kill, hostile, server, key, journal)
            process = start(args, folder)
            ends = time.monotonic() + 60
            # (a fault may end the run before it reaches the phase: then it is not killed)
            while not in_phase() and process.poll() is None:
                assert time.monotonic() < ends, f"never in {kill}"
                time.sleep(0.01)
            process.send_signal(signal.SIGKILL)
            process.communicate()
        then = run([*args, *GOING_ON[going_on]], folder)
        assert "Traceback" not in then.stderr
        written = results(folder / "in-results.jsonl")
        assert [r["index"] for r in written] == list(range(ROWS))
        assert [r["id"] for r in written] == [{"row": n} for n in range(ROWS)]
        assert then.returncode == (0 if all(r["ok"] for r in written) else 1), then.stderr
        if any(state == "held" for state, _ in parts(journal)):  # (read again, and closed)
            settled = run([*args, "--retry-failed"], folder)
            assert settled.returncode in (0, 1), settled.stderr
            written = results(folder / "in-results.jsonl")
        seen = counts(server, key)
        assert seen.get("twice", []) == [], "a row ran twice"
        assert hostile.touched_others == []
    states = {state for state, _ in parts(journal)}
    assert states <= {"cleaned", "dropped"}, states
    if provider == "openai":
        assert seen.get("files_alive", []) == [], "a file the run made is left"
    else:
        made = len(seen.get("batches", []))
        assert seen.get("batches_deleted", 0) == made, "a batch the run made is left"
    own_answers(f"{server.url}/llm/{key}/{KNOBS}{PROVIDERS[provider][0]}", provider, rows, written)
