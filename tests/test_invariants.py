"""The CLI's promise over random mixes of hostile bodies, ids, server faults and signals.

Every run ends in one of two ways: the results file has exactly one line per input, in input
order, the failed file holds exactly the failures, and the exit status matches them (0 all
ok, 1 some failed; 130 after a signal, with the lines of what finished); or the run fails
loudly (exit 2 or 3, one ``Error:`` line). Nothing in between, and never a traceback.

Each example runs ``batchsync.cli.main`` in a forked child (cheap: everything is imported),
so that 150 examples fit in about half a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsync import cli  # imported here: a child's signal must find main() running
from batchsync.cli import signals
from tests.mockserver import MockServerProcess

pytestmark = pytest.mark.integration

# Paths of the mock server (see python -m batchsync.mock --help), the hostile ones among them.
PATHS = [
    "/ok/{key}",
    "/ok/{key}?delay=0.2",
    "/503/{key}",
    "/404/{key}",
    "/429-once/{key}?retry_after=0",
    "/broken-json",
    "/surrogate",
    "/deep?depth=3000",
    "/bad-location",
    "/redirect?to=/ok/{key}",
    "/half",
    "/trickle-headers?interval=0.05&lines=3",
    "/huge?mb=2",
]
IDS = [None, 7, "plain", "\ud800", "caf\u00e9", {"nested": [1, "\udfff"]}, "NaN"]
BROKEN_LINES = [
    "not a url",
    '{"url": 5}',
    "{broken json",
    "http://127.0.0.1:1/refused",
    '{"url": "http://h/", "method": "TRACE"}',
]


def strict_json(text: str) -> Any:
    """JSON without NaN or Infinity, as every line the CLI writes must be."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


@st.composite
def input_lines(draw: st.DrawFn, base: str) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(1, 8))):
        if draw(st.integers(0, 5)) == 0:
            lines.append(draw(st.sampled_from(BROKEN_LINES)))
            continue
        url = base + draw(st.sampled_from(PATHS)).format(key=uuid.uuid4().hex[:8])
        item_id = draw(st.sampled_from(IDS))
        if item_id is None:
            lines.append(url)
        elif item_id == "NaN":
            lines.append(f'{{"url": "{url}", "id": NaN}}')
        else:
            lines.append(json.dumps({"url": url, "id": item_id}))
    return lines


def run_cli(
    args: list[str], folder: Path, signal_after: float | None, stdin: bytes | None = None
) -> tuple[int, str]:
    """The CLI in a forked child; its exit status and stderr (``stdin``: what its standard
    input holds, a pipe already written and closed, for INPUT ``/dev/stdin``).

    SIGINT is blocked across the fork, until the child has its handler: one that landed
    inside CPython's own after-fork work (resetting the threading module's locks) could leave
    that half done and the child hung, a hazard of forking a test process, not of the CLI.
    """
    piped = None
    if stdin is not None:  # (small: the pipe's buffer holds it all)
        piped, writer = os.pipe()
        os.write(writer, stdin)
        os.close(writer)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code, entered = 98, False
        try:
            # As batchsync's main() does first: a signal now stops the run as it starts.
            signal.signal(signal.SIGINT, lambda signum, frame: signals.signalled_early.set())
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            os.chdir(folder)
            out = os.open("stderr.txt", os.O_WRONLY | os.O_CREAT, 0o600)
            os.dup2(out, 1)
            os.dup2(out, 2)
            # (pytest's capture replaced them: what the CLI echoes must land in the file too)
            sys.stdout = sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
            if piped is not None:
                os.dup2(piped, 0)
            entered = True
            cli.main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 97
        except KeyboardInterrupt:  # before main() began: as a Ctrl-C before the program ran
            code = 99 if entered else 130
        except BaseException:
            code = 99
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if piped is not None:
        os.close(piped)
    if signal_after is not None:
        time.sleep(signal_after)
        os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 60
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:  # a hung run: a failure, not a hung suite
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1, "the run hung"
        time.sleep(0.01)
    err = folder / "stderr.txt"  # (none when the signal came before the child got that far)
    stderr = err.read_text(errors="replace") if err.exists() else ""
    return os.waitstatus_to_exitcode(waited[1]), stderr


def check_run(folder: Path, entries: int, code: int, stderr: str) -> list[dict[str, Any]]:
    """The promise, checked; the results (none after a loud failure or an early signal)."""
    assert "Traceback" not in stderr, stderr
    assert code in (0, 1, 2, 3, 130), (code, stderr)
    if code in (2, 3):
        assert "Error: " in stderr, stderr
        return []
    results_path, failed_path = folder / "in-results.jsonl", folder / "in-failed.jsonl"
    if code == 130 and not results_path.exists():
        return []  # stopped before the run began: nothing to write
    results = [strict_json(line) for line in results_path.read_text().splitlines()]
    failed = [strict_json(line) for line in failed_path.read_text().splitlines()]
    indexes = [r["index"] for r in results]
    if code == 130:
        assert indexes == sorted(set(indexes)) and all(0 <= i < entries for i in indexes)
    else:
        assert indexes == list(range(entries)), (indexes, stderr)
        assert code == (0 if all(r["ok"] for r in results) else 1), stderr
    assert len(failed) == sum(1 for r in results if not r["ok"])
    return results


@pytest.fixture(scope="module")
def folders() -> Any:
    with tempfile.TemporaryDirectory() as top:
        yield Path(top)


# The examples in three shards, each its own stream of examples: parallel workers share them,
# so the suite is not as long as one worker's runs of the command line. 90 in the suite (each
# a process of its own); BATCHSYNC_INVARIANT_EXAMPLES runs more (150 before a release).
EXAMPLES = int(os.environ.get("BATCHSYNC_INVARIANT_EXAMPLES", "90"))


@pytest.mark.parametrize("shard", range(3))
@settings(
    max_examples=max(1, EXAMPLES // 3),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_run_ends_whole_or_loudly(
    server: MockServerProcess, folders: Path, shard: int, data: st.DataObject
) -> None:
    lines = data.draw(input_lines(server.url), label="lines")
    signal_after = data.draw(st.none() | st.floats(0.0, 0.6), label="signal_after")
    attempts = data.draw(st.sampled_from(["1", "2"]), label="attempts")
    folder = folders / uuid.uuid4().hex
    folder.mkdir()
    (folder / "in.txt").write_text(
        "\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass"
    )
    args = ["in.txt", "-q", "-c", "4", "--attempts", attempts, "--timeout", "2", "--budget", "3"]
    code, stderr = run_cli(args, folder, signal_after)
    check_run(folder, len(lines), code, stderr)


# --- the new paths: pagination, templates over a table, INPUT from a pipe or a FIFO -----------

# Paginated collections (link style): TOTAL records, SIZE a page, one of them failing first.
PAGED = [
    "/pages/link/{key}?total={total}&size=2",
    "/pages/link/{key}?total={total}&size=3&fail=2&fail_times=1&tag={key}",
    "/pages/link/{key}?total={total}&size=2&fail=2",  # page 2 always 503: the item fails
]


def expected_records(url: str) -> list[dict[str, int]]:
    """The records of a paginated item that succeeded: all of its collection, in order."""
    total = int(url.split("total=", 1)[1].split("&", 1)[0])
    return [{"n": n} for n in range(total)]


@st.composite
def paged_lines(draw: st.DrawFn, base: str) -> list[str]:
    """A list of items under --paginate link: collections, other paths, broken lines."""
    lines = []
    for _ in range(draw(st.integers(1, 6))):
        pick = draw(st.integers(0, 5))
        if pick == 0:
            lines.append(draw(st.sampled_from(BROKEN_LINES)))
        elif pick == 1:
            lines.append(base + draw(st.sampled_from(PATHS)).format(key=uuid.uuid4().hex[:8]))
        else:
            path = draw(st.sampled_from(PAGED))
            total = draw(st.integers(0, 7))
            lines.append(base + path.format(key=uuid.uuid4().hex[:8], total=total))
    return lines


@st.composite
def table_rows(draw: st.DrawFn) -> list[dict[str, str]]:
    """Rows for --url TEMPLATE: a name, a total, a page that fails (0: none); a row may lack
    a value (it fails alone, as invalid_request)."""
    rows = []
    for n in range(draw(st.integers(1, 6))):
        row = {
            "id": str(n),
            "name": uuid.uuid4().hex[:8],
            "total": str(draw(st.integers(0, 7))),
            "fail": draw(st.sampled_from(["0", "0", "2"])),
        }
        if draw(st.integers(0, 5)) == 0:
            row["total"] = ""
        rows.append(row)
    return rows


def table_text(rows: list[dict[str, str]], as_csv: bool) -> str:
    if as_csv:
        return "id,name,total,fail\n" + "".join(",".join(r.values()) + "\n" for r in rows)
    return "".join(json.dumps(row) + "\n" for row in rows)


def feed_fifo(fifo: Path, data: bytes) -> threading.Thread:
    """A thread that writes ``data`` into ``fifo`` once the run opens it."""

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as writer:
            writer.write(data)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    return feeder


def run_on(
    kind: str, folder: Path, data: bytes, args: list[str], signal_after: float | None
) -> tuple[int, str]:
    """``run_cli`` with INPUT ``data`` given as ``kind``: a file, /dev/stdin, or a FIFO."""
    if kind == "file":
        (folder / "in.txt").write_bytes(data)
        return run_cli(["in.txt", *args], folder, signal_after)
    if kind == "stdin":
        return run_cli(["/dev/stdin", *args], folder, signal_after, stdin=data)
    fifo = folder / "in.fifo"
    os.mkfifo(fifo)
    feeder = feed_fifo(fifo, data)
    try:
        return run_cli([str(fifo), *args], folder, signal_after)
    finally:  # (a run stopped before it opened the FIFO leaves the feeder waiting: let it go)
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        feeder.join(timeout=5)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_paginated_templated_and_piped_runs_end_whole_or_loudly(
    server: MockServerProcess, folders: Path, data: st.DataObject
) -> None:
    kind = data.draw(st.sampled_from(["file", "stdin", "fifo"]), label="input")
    templated = data.draw(st.booleans(), label="templated")
    signal_after = data.draw(st.none() | st.none() | st.floats(0.0, 0.6), label="signal_after")
    folder = folders / uuid.uuid4().hex
    folder.mkdir()
    args = ["-q", "-c", "3", "--attempts", "2", "--timeout", "2", "--budget", "4", "-o", "in"]
    args += ["--paginate", "link", "--items", "items", "--no-report"]
    if templated:
        rows = data.draw(table_rows(), label="rows")
        as_csv = data.draw(st.booleans(), label="as_csv")
        text = table_text(rows, as_csv)
        template = f"{server.url}/pages/link/{{name}}?total={{total}}&size=2&fail={{fail}}"
        args += ["--url", template, "--input-format", "csv" if as_csv else "jsonl"]
        urls = [template.format(**row) if row["total"] else None for row in rows]
    else:
        lines = data.draw(paged_lines(server.url), label="lines")
        text = "\n".join(lines) + "\n"
        urls = [line if "/pages/" in line else None for line in lines]
    code, stderr = run_on(kind, folder, text.encode(), args, signal_after)
    results = check_run(folder, len(urls), code, stderr)
    for result in results:  # a collection that succeeded: all its records, in order
        url = urls[result["index"]]
        if url is not None and result["ok"]:
            assert result["data"] == expected_records(url), (url, result["data"])
