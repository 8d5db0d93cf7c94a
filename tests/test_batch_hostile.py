"""The batch endpoint against a hostile provider (tests/hostile_batch.py in front of the mock of
both batch APIs, which counts server-side): a paid answer is never thrown away, a part is never
paid twice, and whatever the provider does, each row ends with one Result of its own.

Each test is a row of the table in the issue that asked for these promises: a one-off 404, 403
or redirect; a clock ten minutes off; a key busy with thousands of others' batches; answers
nested 100 000 deep or holding numbers Python refuses; a part whose rows were all journaled
before it was closed; a day-long Retry-After under a deadline; a results URL spelled another
way; a create answered without its id or with a status nobody documented; a journal naming
another's batch."""

from __future__ import annotations

import errno
import io
import json
import re
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from batchsync import Batch
from batchsync.batches.providers import PROVIDERS as PROVIDERS_BY_NAME

from .hostile_batch import (
    DROP,
    HostileProvider,
    deep_json,
    huge_int,
    replace_body,
    results_lines,
    set_fields,
)
from .mockserver import MockServerProcess
from .test_batch_api import (
    PROVIDERS,
    check_in_order,
    command,
    cookbook,
    counts_so_far,
    no_canary_in,
    parts,
    results,
    run,
    start,
    stats,
    wait_for,
)

pytestmark = pytest.mark.integration

BOTH = ["openai", "anthropic"]
# Where each provider's calls go, as path patterns.
POLL = r"/(batches/batch_|messages/batches/msgbatch_)[^/]+$"
CREATE = r"/(v1/batches|messages/batches)$"
DOWNLOAD = r"/(files/file-[^/]+/content|messages/batches/msgbatch_[^/]+/results)$"
LIST = CREATE


@pytest.fixture
def hostile(server: MockServerProcess) -> Iterator[HostileProvider]:
    with HostileProvider(upstream=server.url) as provider:
        yield provider


def endpoint(hostile: HostileProvider, provider: str, knobs: str = "pace=0.05") -> tuple[str, str]:
    """A fresh KEY's endpoint through the hostile provider, and the KEY."""
    key = f"h{time.monotonic_ns():x}"[-10:]
    return f"{hostile.url}/llm/{key}/{knobs}{PROVIDERS[provider][0]}", key


def batch_args(tmp_path: Path, url: str, provider: str, rows: int, *more: str) -> list[str]:
    source = cookbook(tmp_path / "in.jsonl", rows)
    return command(source, url, provider, "--batch-api", "--poll", "0.05", *more)


def cleaned_up(server: MockServerProcess, key: str, provider: str, batches: int) -> bool:
    """Nothing the run made is left at the provider."""
    counts = stats(server, key)
    if provider == "openai":
        return bool(counts["files_alive"] == [])
    return bool(counts["batches_deleted"] == batches)


def paid_once(server: MockServerProcess, key: str, provider: str) -> None:
    """One batch made, no row run twice, as the provider counts; nothing of it left there."""
    counts = stats(server, key)
    assert counts["batches_created"] == 1, "a part was submitted twice"
    assert counts["twice"] == [], "a row ran twice"
    assert cleaned_up(server, key, provider, 1)


def journal_of(tmp_path: Path) -> Path:
    return tmp_path / "in-journal.sqlite3"


def kill_when(process: subprocess.Popen[str], condition: Callable[[], bool], what: str) -> None:
    wait_for(condition, process, what)
    process.send_signal(signal.SIGKILL)
    process.wait()


# --- row 1: one refusal of a poll or a download --------------------------------------------------
@pytest.mark.parametrize(
    ("where", "status"), [(POLL, 404), (DOWNLOAD, 404), (DOWNLOAD, 403), (DOWNLOAD, 302)]
)
@pytest.mark.parametrize("provider", BOTH)
def test_one_refused_poll_or_download_keeps_the_batch_and_a_retry_reads_it_again(  # noqa: PLR0917
    server: MockServerProcess,
    hostile: HostileProvider,
    tmp_path: Path,
    provider: str,
    where: str,
    status: int,
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 6)
    headers = {"Location": "http://127.0.0.1:9/elsewhere"} if status == 302 else None
    hostile.once("GET", where, status=status, headers=headers)
    first = run(args, tmp_path)
    counts = stats(server, key)
    if provider == "openai":
        assert len(counts["files_alive"]) == 2, "the input and output files are kept"
    else:
        assert counts["batches_deleted"] == 0, "the batch is kept"
    assert first.returncode == 1, first.stderr
    written = results(tmp_path / "in-results.jsonl")
    states = [state for state, _ in parts(journal_of(tmp_path))]

    again = run([*args, "--retry-failed"], tmp_path)
    assert again.returncode == 0, again.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 6)
    counts = stats(server, key)
    assert counts["batches_created"] == 1 and counts["twice"] == [], "no row paid twice"
    assert cleaned_up(server, key, provider, 1)
    # (what the first run said of the rows, and of the part it kept)
    assert {row["error_kind"] for row in written} == {"batch_errored"}
    assert "--retry-failed reads it again" in written[0]["error"]
    assert states == ["held"]


# --- rows 2 and 3: a create that got no answer, found whatever the clock or the key's traffic ----
@pytest.mark.parametrize(
    ("skew", "others"), [(600.0, 0), (-600.0, 0), (0.0, 3000)], ids=["ahead", "behind", "busy"]
)
@pytest.mark.parametrize("provider", BOTH)
def test_a_create_killed_before_its_answer_is_found_whatever_the_clock_or_other_batches(  # noqa: PLR0917
    server: MockServerProcess,
    hostile: HostileProvider,
    tmp_path: Path,
    provider: str,
    skew: float,
    others: int,
) -> None:
    """The provider's clock ``skew`` off the client's (the client 10 min ahead: -600), or
    ``others`` batches made on the key between the create and the resume."""
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 5)
    hostile.skew = skew
    hostile.hold("POST", CREATE, 30.0)
    first = start(args, tmp_path)
    kill_when(
        first,
        lambda: counts_so_far(server, key).get("batches_created", 0) == 1,
        "the batch was made",
    )
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["submitting"]
    hostile.other_batches = others

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 5)
    counts = stats(server, key)
    assert counts["batches_created"] == 1, "the batch the create made was found, not made again"
    assert counts["twice"] == []
    assert hostile.touched_others == [], "no other batch was cancelled, read or deleted"
    assert cleaned_up(server, key, provider, 1)


# --- rows 4 and 5: answers Python's json cannot read ---------------------------------------------
def _unreadable_row(make: Callable[[], bytes]) -> Callable[[bytes], bytes]:
    """A results line whose row 2 holds ``make()`` after its custom_id (where providers write
    it), the others as they were."""

    def line(given: bytes) -> bytes:
        custom_id = str(json.loads(given)["custom_id"])
        if not custom_id.endswith("-2"):
            return given
        return b'{"custom_id": "' + custom_id.encode() + b'", "response": ' + make() + b"}"

    return line


@pytest.mark.parametrize("value", ["deep", "digits"])
@pytest.mark.parametrize("provider", BOTH)
def test_a_results_line_python_cannot_read_is_its_rows_invalid_body(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str, value: str
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 5)
    make = deep_json if value == "deep" else huge_int
    hostile.rewrite("GET", DOWNLOAD, results_lines(_unreadable_row(make)), times=1)
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, 5)
    assert [row["ok"] for row in written] == [True, True, False, True, True]
    assert written[2]["error_kind"] == "invalid_body"
    # (its paid answer kept at the provider: read again, not paid again)
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["held"]
    again = run([*args, "--retry-failed"], tmp_path)
    assert again.returncode == 0, again.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 5)
    paid_once(server, key, provider)


@pytest.mark.parametrize("call", ["create", "poll"])
@pytest.mark.parametrize("provider", BOTH)
def test_a_control_answer_nested_too_deeply_is_tried_again_never_paid_twice(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str, call: str
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 4)
    method, where = ("POST", CREATE) if call == "create" else ("GET", POLL)
    hostile.rewrite(method, where, lambda body: deep_json(), times=1)
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 4)
    paid_once(server, key, provider)


# --- row 11: a row the results list twice --------------------------------------------------------
def _listed_twice(line: bytes) -> bytes:
    """Row 1's line followed by another answer for the same row; row 3's repeated as it was."""
    custom_id = str(json.loads(line)["custom_id"])
    if custom_id.endswith("-1"):
        other = {**json.loads(line), "tampered": "another answer"}
        return line + b"\n" + json.dumps(other).encode()
    if custom_id.endswith("-3"):
        return line + b"\n" + line
    return line


def _row_1_failed(
    hostile: HostileProvider,
    tmp_path: Path,
    provider: str,
    rows: int,
    per_line: Callable[[bytes], bytes],
    *more: str,
) -> tuple[str, list[str], list[dict[str, Any]]]:
    """A run of ``rows`` whose results lines the provider rewrites with ``per_line``, that
    ends row 1 ``invalid_body`` (exit 1): the KEY, the run's arguments and what it wrote."""
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, rows)
    hostile.rewrite("GET", DOWNLOAD, results_lines(per_line))
    done = run([*args, *more], tmp_path)
    assert done.returncode == 1, done.stderr
    written = results(tmp_path / "in-results.jsonl")
    check_in_order(written, rows)
    assert written[1]["error_kind"] == "invalid_body"
    return key, args, written


@pytest.mark.parametrize("provider", BOTH)
def test_a_row_listed_twice_with_different_answers_is_a_conflict_not_a_pick(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    key, _, written = _row_1_failed(hostile, tmp_path, provider, 5, _listed_twice)
    assert [row["ok"] for row in written] == [True, False, True, True, True]
    assert "more than once, with different answers" in written[1]["error"]
    # (reading the batch again would give the same two answers: the part is done with)
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["cleaned"]
    paid_once(server, key, provider)


def _large_and_listed_twice(line: bytes) -> bytes:
    """Row 1's line made larger than 20 000 bytes, and listed twice as it is."""
    if not str(json.loads(line)["custom_id"]).endswith("-1"):
        return line
    large = json.dumps({**json.loads(line), "padding": "x" * 40_000}).encode()
    return large + b"\n" + large


@pytest.mark.parametrize("provider", BOTH)
def test_a_line_too_large_to_read_listed_twice_alike_keeps_the_batch(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    key, args, written = _row_1_failed(
        hostile, tmp_path, provider, 3, _large_and_listed_twice, "--max-bytes", "20000"
    )
    assert "larger than max_bytes" in written[1]["error"]
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["held"]
    again = run([*args, "--retry-failed", "--max-bytes", "200000"], tmp_path)
    assert again.returncode == 0, again.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 3)
    paid_once(server, key, provider)


class _FullDisk:
    """A temporary file on a disk that is full for its first ``refusals`` flushes, as a
    real one fails: writes are buffered, the flush (at ``seek`` too) raises, and closing
    with what could not be flushed raises again."""

    refusals = 1

    def __init__(self) -> None:
        self._file = io.BytesIO()
        self._unflushed = False

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, data: bytes) -> int:
        self._unflushed = True
        return self._file.write(data)

    def flush(self) -> None:
        if self._unflushed and _FullDisk.refusals > 0:
            _FullDisk.refusals -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        self._unflushed = False

    def seek(self, where: int) -> int:
        self.flush()
        return self._file.seek(where)

    def close(self) -> None:
        if self._unflushed:
            self._unflushed = False
            raise OSError(errno.ENOSPC, "No space left on device")

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._file)


@pytest.mark.parametrize("provider", BOTH)
def test_a_disk_too_full_to_keep_the_results_keeps_the_batch_and_reads_it_again(
    server: MockServerProcess,
    hostile: HostileProvider,
    monkeypatch: pytest.MonkeyPatch,
    provider: str,
) -> None:
    url, key = endpoint(hostile, provider)
    monkeypatch.setattr(tempfile, "TemporaryFile", _FullDisk)
    _FullDisk.refusals = 1
    rows = [{"text": f"question {n}"} for n in range(3)]
    body = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}
    done = Batch(
        rows, url=url, method="POST", body=body, batch_api="auto", poll=0.05, progress=False
    ).run()
    assert [result.ok for result in done] == [True, True, True]
    assert _FullDisk.refusals == 0, "the disk was never full"
    paid_once(server, key, provider)


# --- row 6: every row journaled, the part not yet closed -----------------------------------------
@pytest.mark.parametrize("provider", BOTH)
def test_a_part_whose_rows_are_all_journaled_is_closed_and_cleaned_by_the_next_run(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 4)
    assert run([*args, "--keep-files"], tmp_path).returncode == 0
    # (as a run stopped after the rows were journaled leaves it: the batch's ended status)
    ended = "completed" if provider == "openai" else "ended"
    with closing(sqlite3.connect(journal_of(tmp_path))) as db, db:
        history = json.loads(db.execute("SELECT history FROM submissions").fetchone()[0])
        while history[-1][1] != ended:
            history.pop()
        db.execute(
            "UPDATE submissions SET state = ?, history = ?, output_file = NULL, error_file = NULL",
            (ended, json.dumps(history)),
        )
    assert not cleaned_up(server, key, provider, 1)

    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["cleaned"]
    assert cleaned_up(server, key, provider, 1)
    assert stats(server, key)["batches_created"] == 1


@pytest.mark.parametrize("provider", BOTH)
def test_a_usage_count_past_any_counter_is_read_as_none(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 3)

    def enormous(line: bytes) -> bytes:
        return re.sub(rb'"(prompt|input)_tokens": [0-9]+', rb'"\1_tokens": ' + b"9" * 23, line)

    hostile.rewrite("GET", DOWNLOAD, results_lines(enormous))
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 3)
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["cleaned"]
    assert cleaned_up(server, key, provider, 1)


# --- row 7: a Retry-After the deadline leaves no time for ----------------------------------------
@pytest.mark.parametrize("provider", BOTH)
def test_a_day_long_retry_after_on_a_poll_ends_at_the_deadline(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    url, key = endpoint(hostile, provider, "pace=2")
    args = batch_args(tmp_path, url, provider, 3, "--deadline", "3")
    hostile.once("GET", POLL, status=503, headers={"Retry-After": "86400"}, times=100)
    began = time.monotonic()
    done = subprocess.run(
        args, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        env=run.__globals__["_environment"](),
    )  # fmt: skip
    assert time.monotonic() - began < 30, "the wait ended with the deadline"
    assert done.returncode == 1, done.stderr
    written = results(tmp_path / "in-results.jsonl")
    assert {row["error_kind"] for row in written} == {"deadline"}
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["held"]
    assert stats(server, key)["batches_created"] == 1


# --- row 8: the same origin, spelled another way -------------------------------------------------
def test_a_results_url_spelled_another_way_on_the_same_origin_is_read(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path
) -> None:
    port = hostile.url.rsplit(":", 1)[1]
    url, key = endpoint(hostile, "anthropic")
    url = url.replace(f"127.0.0.1:{port}", f"user@LocalHost:{port}")

    def spelled(body: bytes) -> bytes:
        batch = json.loads(body)
        if isinstance(batch.get("results_url"), str):
            batch["results_url"] = batch["results_url"].replace(
                f"LocalHost:{port}", f"LOCALHOST.:{port}"
            )
        return json.dumps(batch).encode()

    hostile.rewrite("GET", POLL, spelled)
    done = run(batch_args(tmp_path, url, "anthropic", 3), tmp_path)
    assert done.returncode == 0, done.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 3)
    assert cleaned_up(server, key, "anthropic", 1)


# --- row 9: a create answered without its id, or with an unknown status --------------------------
@pytest.mark.parametrize("answer", ["no id", "queued"])
@pytest.mark.parametrize("provider", BOTH)
def test_a_create_answered_without_an_id_or_with_an_unknown_status_is_not_paid_twice(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str, answer: str
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 4)
    status = "status" if provider == "openai" else "processing_status"
    fields: dict[str, Any] = {"id": DROP} if answer == "no id" else {status: "queued"}
    hostile.rewrite("POST", CREATE, set_fields(**fields), times=1)
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 4)
    paid_once(server, key, provider)


# --- row 11: only the run's own batches are cancelled --------------------------------------------
def test_cancel_never_reaches_a_batch_the_journal_names_that_is_not_the_parts(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path
) -> None:
    url, key = endpoint(hostile, "openai", "pace=5")
    args = batch_args(tmp_path, url, "openai", 3)
    first = start(args, tmp_path)
    kill_when(first, lambda: any(b for _, b in parts(journal_of(tmp_path))), "submitted")
    hostile.other_batches = 3
    with closing(sqlite3.connect(journal_of(tmp_path))) as db, db:
        db.execute("UPDATE submissions SET batch = 'batch_other1'")
    done = run([*args, "--resume", "--cancel"], tmp_path)
    assert "Traceback" not in done.stderr
    assert hostile.touched_others == [], "another's batch was never cancelled"
    assert [b["status"] for b in stats(server, key)["batches"]] != ["cancelled"]
    no_canary_in(tmp_path)


# --- one way out ---------------------------------------------------------------------------------
_AUDITED = """
import json, runpy, sys
strays = []

def hook(event, args):
    if event != "socket.connect":
        return
    frame, files = sys._getframe(1), []
    while frame is not None:
        files.append(frame.f_code.co_filename.replace("\\\\", "/"))
        frame = frame.f_back
    ours = [name for name in files if "/batchsync/" in name]
    if ours and not any("/batchsync/http/" in name for name in ours):
        strays.append(ours[0])

sys.addaudithook(hook)
sys.argv = ["batchsync", *json.loads(sys.argv[1])]
try:
    runpy.run_module("batchsync", run_name="__main__")
except SystemExit as exc:
    code = exc.code
with open(sys.argv[-1] + ".audit", "w") as out:
    json.dump({"strays": strays, "code": code}, out)
"""


@pytest.mark.parametrize("provider", BOTH)
def test_every_connection_of_a_batch_run_is_opened_by_the_transport(
    hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    """Each socket a batch run connects is connected from within ``batchsync/http`` (the
    run's Transport), as a live run's are: none by a client of its own."""
    url, _ = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 3, "--keep-files")
    marker = tmp_path / "run"
    script = [args[0], "-c", _AUDITED, json.dumps([*args[3:], "-o", str(marker)])]
    done = run(script, tmp_path)
    audit = json.loads((tmp_path / "run.audit").read_text())
    assert audit == {"strays": [], "code": 0}, done.stderr


# --- a Ctrl-C at any moment ---------------------------------------------------------------------
_STARTED = """
import json, runpy, sys
sys.argv = ["batchsync", *json.loads(sys.argv[1])]  # (as the console script names itself)
sys.stderr.write("started\\n")
sys.stderr.flush()
runpy.run_module("batchsync", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("after", [0.02, 0.1, 0.3, 0.6, 1.0, 1.5])
def test_a_ctrl_c_at_any_moment_after_start_is_exit_130_without_a_traceback(
    hostile: HostileProvider, tmp_path: Path, after: float
) -> None:
    """While the package loads, while the parts are cut and submitted, while they are polled
    (counted from when the interpreter runs its first line: a signal while Python itself
    starts is the interpreter's)."""
    url, _ = endpoint(hostile, "openai", "pace=5")
    args = batch_args(tmp_path, url, "openai", 4)
    process = start([args[0], "-c", _STARTED, json.dumps(args[3:])], tmp_path)
    assert process.stderr is not None
    assert process.stderr.readline() == "started\n"
    time.sleep(after)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr


def test_a_journal_with_a_part_dropped_then_cleaned_is_taken_by_the_next_run(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path
) -> None:
    """A part killed in its upload is dropped (its rows in a new part) and its file deleted by
    the run that goes on: later runs still trust the journal."""
    url, key = endpoint(hostile, "openai")
    args = batch_args(tmp_path, url, "openai", 4)
    hostile.hold("POST", r"/v1/files$", 20.0)
    first = start(args, tmp_path)
    kill_when(first, lambda: counts_so_far(server, key).get("files_uploaded", 0) > 0, "uploaded")
    hostile.once("GET", DOWNLOAD, status=403)
    assert run([*args, "--resume"], tmp_path).returncode == 1
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["cleaned", "held"]
    again = run([*args, "--retry-failed"], tmp_path)
    assert again.returncode == 0, again.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 4)
    counts = stats(server, key)
    assert counts["batches_created"] == 1 and counts["twice"] == []
    assert cleaned_up(server, key, "openai", 1)


# --- found by a review: the part closed before its rows were journaled, … ------------------------
def journaled(journal: Path) -> int:
    with closing(sqlite3.connect(f"file:{journal}?mode=ro", uri=True)) as db:
        return int(db.execute("SELECT count(*) FROM results").fetchone()[0])


@pytest.mark.parametrize("provider", BOTH)
def test_a_part_is_closed_only_once_every_row_of_it_is_journaled(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    """Killed the moment its part shows ``collected``: the journal holds every row then, and
    the run that goes on pays for none again."""
    rows = 3000
    url, key = endpoint(hostile, provider, "pace=0.2,shuffle=0")
    args = batch_args(tmp_path, url, provider, rows)
    journal = journal_of(tmp_path)
    first = start(args, tmp_path)
    kill_when(first, lambda: "collected" in {s for s, _ in parts(journal)}, "collected")
    assert journaled(journal) == rows
    resumed = run([*args, "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    counts = stats(server, key)
    assert counts["batches_created"] == 1 and counts["twice"] == []


@pytest.mark.parametrize("body", [b"", b"<html>Service Unavailable</html>"], ids=["empty", "html"])
@pytest.mark.parametrize("provider", BOTH)
def test_a_results_download_that_lists_no_row_keeps_the_batch(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str, body: bytes
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 4)
    hostile.rewrite("GET", DOWNLOAD, replace_body(body), times=1)
    first = run(args, tmp_path)
    assert first.returncode == 1, first.stderr
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["held"]
    again = run([*args, "--retry-failed"], tmp_path)
    assert again.returncode == 0, again.stderr
    paid_once(server, key, provider)


@pytest.mark.parametrize("provider", BOTH)
def test_cancel_never_submits_a_part_whose_create_made_no_batch(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    url, key = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 4)
    hostile.once("POST", CREATE, status=503, times=1000)  # (answered here: nothing made)
    first = start(args, tmp_path)
    kill_when(first, lambda: "waiting" in {s for s, _ in parts(journal_of(tmp_path))}, "waiting")
    hostile.reset()
    hostile.once("GET", LIST, status=503, times=3)  # (the look for its batch decides nothing)
    cancelled = run([*args, "--resume", "--cancel"], tmp_path)
    assert cancelled.returncode == 1, cancelled.stderr
    assert counts_so_far(server, key).get("batches_created", 0) == 0, "nothing was created"
    written = results(tmp_path / "in-results.jsonl")
    assert {row["error_kind"] for row in written} == {"batch_cancelled"}


@pytest.mark.parametrize("provider", BOTH)
def test_a_create_refused_with_retry_after_is_not_tried_again_before_it(
    hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    url, _ = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 3, "--deadline", "4")
    hostile.once("POST", CREATE, status=429, headers={"Retry-After": "30"}, times=1000)
    done = run(args, tmp_path)
    assert done.returncode == 1, done.stderr
    assert hostile.count("POST", CREATE) <= 3, "tried again before its Retry-After"


@pytest.mark.parametrize("provider", BOTH)
def test_the_deadline_bounds_the_clean_up_too(
    hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    """The batch ends 3 to 4.5 s in; its clean-up may take what is left of the 7 s, no more
    (not another 7 s of its own)."""
    url, _ = endpoint(hostile, provider, "pace=1.5")
    args = batch_args(tmp_path, url, provider, 3, "--deadline", "7")
    hostile.hold("DELETE", r".", 100.0, times=10)
    began = time.monotonic()
    done = run(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert hostile.count("DELETE", r".") > 0, "the clean-up was tried"
    assert time.monotonic() - began < 10.5, "the clean-up waited past the deadline"


def test_a_ctrl_c_during_the_upload_creates_no_batch(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path
) -> None:
    url, key = endpoint(hostile, "openai")
    hostile.hold("POST", r"/v1/files$", 2.0)
    process = start(batch_args(tmp_path, url, "openai", 3), tmp_path)
    wait_for(lambda: hostile.count("POST", r"/v1/files$") > 0, process, "uploading")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert counts_so_far(server, key).get("batches_created", 0) == 0


@pytest.mark.parametrize("provider", BOTH)
def test_cancel_closes_a_batch_gone_at_the_provider(
    hostile: HostileProvider, tmp_path: Path, provider: str
) -> None:
    url, _ = endpoint(hostile, provider)
    args = batch_args(tmp_path, url, provider, 3)
    hostile.once("GET", POLL, status=404, times=1000)
    assert run(args, tmp_path).returncode == 1
    assert [state for state, _ in parts(journal_of(tmp_path))] == ["held"]
    cancelled = run([*args, "--resume", "--cancel"], tmp_path)
    assert "Traceback" not in cancelled.stderr
    assert {state for state, _ in parts(journal_of(tmp_path))} <= {"collected", "cleaned"}


def test_a_created_at_no_clock_reads_is_no_time() -> None:
    assert PROVIDERS_BY_NAME["openai"].created_at({"created_at": 10**400}) is None


def test_cancel_of_a_batch_found_late_that_has_ended_keeps_its_answers(
    server: MockServerProcess, hostile: HostileProvider, tmp_path: Path
) -> None:
    """A create killed before its answer; ``--resume --cancel`` at once: Anthropic's batch
    is taken only once it has ended, then cannot be cancelled (ended), and what it answered
    is delivered rather than dropped."""
    url, key = endpoint(hostile, "anthropic", "pace=0.3")
    args = batch_args(tmp_path, url, "anthropic", 4)
    hostile.hold("POST", CREATE, 30.0)
    first = start(args, tmp_path)
    kill_when(first, lambda: counts_so_far(server, key).get("batches_created", 0) == 1, "made")
    cancelled = run([*args, "--resume", "--cancel"], tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    check_in_order(results(tmp_path / "in-results.jsonl"), 4)
    paid_once(server, key, "anthropic")


def test_a_batch_id_that_repeats_the_key_is_masked_in_every_output_and_log(
    hostile: HostileProvider, tmp_path: Path
) -> None:
    """A hostile provider names its batch after the API key: the journal keeps the id as
    given (0600, to poll it), and every output, log line and message shows it masked."""
    url, _ = endpoint(hostile, "anthropic")
    key = PROVIDERS["anthropic"][1][1].partition(": ")[2]
    hostile.rewrite("POST", CREATE, set_fields(id=f"msgbatch_{key}"), times=1)
    done = run([*batch_args(tmp_path, url, "anthropic", 3, "--deadline", "3"), "-vv"], tmp_path)
    assert done.returncode == 1, done.stderr
    assert key not in done.stderr
    for name in ("in-results.jsonl", "in-failed.jsonl", "in-report.html"):
        assert key.encode() not in (tmp_path / name).read_bytes(), name
    assert "msgbatch_***" in (tmp_path / "in-report.html").read_text()
