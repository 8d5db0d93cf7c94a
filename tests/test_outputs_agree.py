"""Every output of a run says the same thing: the summary line, the results file, the failed
file, the report and a columnar table, over random runs, resumes, retry passes and journals
whose columns beside the records were altered (issue 34, items 3 and 7).

Each step runs the real CLI in a forked child (``test_invariants.run_cli``) against the mock
server; after each one that ends whole, ``agree`` reads every output back and compares them.
A journal altered under the outputs is refused (exit 2, outputs untouched) or gives outputs
that still agree: never outputs that disagree.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
import sqlite3
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchsync import Batch, Breaker
from tests.mockserver import MockServerProcess
from tests.test_invariants import BROKEN_LINES, run_cli, strict_json

pytestmark = pytest.mark.integration

# Quick paths of the mock server (see python -m batchsync.mock --help): answers, failures, retries.
PATHS = [
    "/ok/{key}",
    "/ok/{key}?delay=0.3",
    "/503/{key}",
    "/404/{key}",
    "/429-once/{key}?retry_after=0",
    "/503-then-ok/{key}/x?after=1",
    "/broken-json",
]
# The breaker opens after 4 calls of a host with half of them failed (a short break).
ARGS = ["-c", "3", "--attempts", "2", "--timeout", "2", "--budget", "3", "--no-progress"]
ARGS += ["--breaker", "0.5:4:4:0.3"]
# Columns beside each stored record that an edit of the journal may change (and what to).
TAMPERINGS = [
    "UPDATE results SET ok = 1 - ok",
    "UPDATE results SET request = NULL WHERE ok = 0",
    "UPDATE results SET attempts = attempts + 3",
    "UPDATE results SET error_kind = 'timeout', status_code = 299",
    "UPDATE results SET elapsed = elapsed + 100, backoff = 7",
]
SUMMARY = re.compile(
    r"^(\d+) items?: (\d+) ok, (\d+) failed(?: \(([^)]*)\))?; (\d+) requests?", re.MULTILINE
)


@st.composite
def input_lines(draw: st.DrawFn, base: str) -> list[str]:
    lines = []
    for _ in range(draw(st.integers(1, 7))):
        pick = draw(st.integers(0, 6))
        if pick == 0:
            lines.append(draw(st.sampled_from(BROKEN_LINES)))
            continue
        url = base + draw(st.sampled_from(PATHS)).format(key=uuid.uuid4().hex[:8])
        if pick == 1:
            lines.append(json.dumps({"url": url, "id": draw(st.sampled_from([7, "x", None]))}))
        else:
            lines.append(url)
    return lines


def expected_failed_line(line: str) -> Any:
    """What the failed file holds for an input line that failed: the item as given."""
    text = line.strip()
    try:
        item = json.loads(text)
    except ValueError:
        return {"url": text}
    return item if isinstance(item, dict) else None  # (None: an entry that is no item)


def summary_of(stderr: str) -> tuple[str, dict[str, Any]]:
    """The summary line and its numbers."""
    found = SUMMARY.search(stderr)
    assert found is not None, repr(stderr)
    line = stderr[found.start() :].splitlines()[0]
    kinds = {}
    for part in (found[4] or "").split(", "):
        if part:
            kind, count = part.rsplit(" ", 1)
            kinds[kind] = int(count)
    circuits = re.search(r"(\d+) circuits? opened", line)
    numbers = {
        "items": int(found[1]),
        "ok": int(found[2]),
        "failed": int(found[3]),
        "kinds": kinds,
        "requests": int(found[5]),
        "circuits": int(circuits[1]) if circuits else 0,
    }
    return line, numbers


def report_numbers(path: Path) -> tuple[str, dict[str, Any]]:
    """The summary the report shows, and the numbers of its counts table."""
    page = path.read_text(encoding="utf-8")
    shown = re.search(r"<p class='summary'>(.*?)</p>", page)
    assert shown is not None
    counts = {key: int(n) for key, n in re.findall(r"data-count='([^']+)'>(\d+)<", page)}
    circuits = re.search(r"<th>circuits opened</th><td class='n'>(\d+)</td>", page)
    numbers = {
        "items": counts["items"],
        "ok": counts["ok"],
        "failed": counts["failed"],
        "kinds": {k[5:]: n for k, n in counts.items() if k.startswith("kind-")},
        "requests": counts["requests"],
        "circuits": int(circuits[1]) if circuits else 0,
    }
    return html.unescape(shown[1]), numbers


def agree(folder: Path, lines: list[str], stderr: str) -> str:
    """Every output of the run in ``folder`` says the same; the summary line."""
    line, said = summary_of(stderr)
    results = [strict_json(t) for t in (folder / "in-results.jsonl").read_text().splitlines()]
    failed_lines = (folder / "in-failed.jsonl").read_text().splitlines()
    assert [r["index"] for r in results] == list(range(len(lines)))
    kinds: dict[str, int] = {}
    for result in results:
        if not result["ok"]:
            kinds[result["error_kind"]] = kinds.get(result["error_kind"], 0) + 1
    from_results = {
        "items": len(results),
        "ok": sum(r["ok"] for r in results),
        "failed": sum(not r["ok"] for r in results),
        "kinds": kinds,
        "requests": sum(r["attempts"] for r in results),
        "circuits": said["circuits"],
    }
    assert said == from_results, (line, from_results)
    # The failed file: the failed Results' items exactly as the input gave them, in order.
    failures = [r["index"] for r in results if not r["ok"]]
    assert len(failed_lines) == len(failures), (failed_lines, failures)
    for index, text in zip(failures, failed_lines, strict=True):
        wanted, written = expected_failed_line(lines[index]), strict_json(text)
        if wanted is None or "invalid" in written:
            assert written.get("given") == lines[index], (written, lines[index])
        else:
            assert written == wanted, (written, lines[index])
    shown, counted = report_numbers(folder / "in-report.html")
    assert shown == line
    assert counted == said, (counted, said)
    return line


def table_agrees(folder: Path, stderr: str) -> None:
    """The columnar table holds the results file's Results."""
    results = [json.loads(t) for t in (folder / "in-results.jsonl").read_text().splitlines()]
    try:
        import pyarrow.parquet as pq
    except ImportError:  # (the parquet extra is not installed: the CSV form, then)
        import csv

        with (folder / "in-results.csv").open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        got = [(int(r["index"]), r["ok"] == "true", int(r["attempts"])) for r in rows]
        got_kinds = [r["error_kind"] or None for r in rows]
    else:
        table = pq.read_table(folder / "in-results.parquet").to_pylist()
        got = [(r["index"], r["ok"], r["attempts"]) for r in table]
        got_kinds = [r["error_kind"] for r in table]
    assert got == [(r["index"], r["ok"], r["attempts"]) for r in results], stderr
    assert got_kinds == [r["error_kind"] for r in results]


def table_form() -> str:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return "csv"
    return "parquet"


def cli(folder: Path, *args: str, signal_after: float | None = None) -> tuple[int, str]:
    """``run_cli`` over ``in.txt`` with ``ARGS``; its stderr this run's only."""
    (folder / "stderr.txt").unlink(missing_ok=True)
    return run_cli(["in.txt", *ARGS, *args], folder, signal_after)


def outputs(folder: Path) -> dict[str, bytes]:
    kept = [
        p for p in sorted(folder.iterdir()) if p.name.startswith("in-") and "-journal" not in p.name
    ]
    return {p.name: p.read_bytes() for p in kept}


@pytest.fixture(scope="module")
def folders() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as top:
        yield Path(top)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_every_output_says_the_same(
    server: MockServerProcess, folders: Path, data: st.DataObject
) -> None:
    lines = data.draw(input_lines(server.url), label="lines")
    signal_after = data.draw(st.none() | st.floats(0.1, 0.5), label="signal_after")
    retry = data.draw(st.booleans(), label="retry")
    tampering = data.draw(st.sampled_from(TAMPERINGS), label="tampering")
    folder = folders / uuid.uuid4().hex
    folder.mkdir()
    (folder / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, stderr = cli(folder, signal_after=signal_after)
    assert code in (0, 1, 130), (code, stderr)
    if code == 130:  # interrupted: --resume finishes it
        code, stderr = cli(folder, "--resume")
        assert code in (0, 1), (code, stderr)
    line = agree(folder, lines, stderr)
    if retry and code == 1:  # a retry pass over the failures
        code, stderr = cli(folder, "--retry-failed")
        assert code in (0, 1), (code, stderr)
        line = agree(folder, lines, stderr)
    # A resume that sends nothing keeps every number, the summary byte for byte.
    code, stderr = cli(folder, "--resume", "--format", table_form())
    assert code in (0, 1), (code, stderr)
    assert summary_of(stderr)[0] == line
    table_agrees(folder, stderr)
    # The journal's columns beside the records altered: refused, or outputs that agree.
    with contextlib.closing(sqlite3.connect(folder / "in-journal.sqlite3")) as db, db:
        db.execute(tampering)
    before = outputs(folder)
    code, stderr = cli(folder, "--resume")
    assert "Traceback" not in stderr, stderr
    if code == 2:
        assert "Error: " in stderr and outputs(folder) == before, stderr
    else:
        assert code in (0, 1), (code, stderr)
        agree(folder, lines, stderr)  # (the resume may send: it plans from those columns)


@pytest.mark.parametrize(
    "case",
    [
        # Two hosts answering only 503 open their circuits; the resume of the finished run
        # sends nothing.
        ("503/{key}-{host}{n}", 1, "2 circuits opened", ("--resume",)),
        # Every item fails once, then works: circuits open, nothing fails in the end, and
        # --retry-failed has no failure to send again.
        ("503-then-ok/{key}-{host}{n}/x?after=1", 0, "opened",
         ("--retry-failed", "--resume")),
    ],
    ids=["resume", "retry-failed"],
)  # fmt: skip
def test_a_run_that_sends_nothing_keeps_its_summary_circuits_and_all(
    server: MockServerProcess, tmp_path: Path, case: tuple[str, int, str, tuple[str, ...]]
) -> None:
    """A run of a finished journal that sends nothing writes the run's summary, byte for
    byte, its circuits included."""
    path, code, opened, again = case
    key = uuid.uuid4().hex[:8]
    other = server.url.replace("127.0.0.1", "localhost")
    lines = [
        f"{base}/{path.format(key=key, host=host, n=n)}"
        for host, base in enumerate((server.url, other))
        for n in range(8)
    ]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    done, first = cli(tmp_path)
    assert done == code, first
    line = summary_of(first)[0]
    assert opened in line, line
    sent = len(server.log(key))
    for option in again:
        done, stderr = cli(tmp_path, option)
        assert done == code, stderr
        assert summary_of(stderr)[0] == line, option
    assert len(server.log(key)) == sent  # (nothing sent)
    assert agree(tmp_path, lines, stderr) == line


def test_a_batch_run_again_or_read_back_keeps_its_summary_circuits_and_all(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """The library's forms of the same, over a journal: ``run()`` again, a retry of a kind
    that did not fail, and a new Batch over the journal (a new session) send nothing and show
    the run's summary, byte for byte, "2 circuits opened" included."""
    key = uuid.uuid4().hex[:8]
    other = server.url.replace("127.0.0.1", "localhost")
    items = [f"{base}/503/{key}-{n}" for base in (server.url, other) for n in range(8)]
    options: dict[str, Any] = {
        "concurrency": 3, "attempts": 2, "timeout": 2, "budget": 3, "progress": False,
        "breaker": Breaker(0.5, 4, 4, 0.3), "journal": tmp_path / "j.sqlite3",
    }  # fmt: skip
    batch = Batch(items, **options)
    line = str(batch.run().summary())
    assert "2 circuits opened" in line, line
    sent = len(server.log(key))
    again = [
        batch.run(),
        batch.run(retry_failed=["timeout"]),
        Batch(items, **options).results,
        Batch(items, **options).run(),
    ]
    assert [str(results.summary()) for results in again] == [line] * len(again)
    assert len(server.log(key)) == sent  # (nothing sent)
