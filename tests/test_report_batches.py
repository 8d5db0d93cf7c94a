"""The report's section on the parts sent through a provider's batch endpoint: the real
command line run through the mock server's batch routes (batchsync/mock/batch.py), its
report read back against the journal and the results; the section escaped, drawn without
plotly, and absent from a live run's report."""

from __future__ import annotations

import html
import importlib.util
import json
import re
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest

from batchsync.core.result import Result
from batchsync.output.resultset import ResultSet
from batchsync.store.submissions import Part

from .mockserver import MockServerProcess
from .test_cli import batchsync, read_jsonl

HALF = "The batch endpoints are billed at half the live price"


def rows_file(tmp_path: Path, count: int, model: str = "gpt-mock") -> Path:
    """``count`` chat rows in the cookbook's shape: a request body with ``metadata``."""
    path = tmp_path / "rows.jsonl"
    lines = [
        {
            "model": model,
            "max_tokens": 20,
            "messages": [{"role": "user", "content": f"question {n:02d}"}],
            "metadata": {"row": n},
        }
        for n in range(count)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def base(server: MockServerProcess) -> str:
    return f"{server.url}/llm/{uuid.uuid4().hex[:10]}/pace=0.1"


def table(page: str, name: str) -> list[list[str]]:
    """The cells of each body row of the table ``name``, as text."""
    found = re.search(rf"<table id='{name}'>.*?<tbody>(.*?)</tbody>", page, re.DOTALL)
    assert found, name
    rows = re.findall(r"<tr>(.*?)</tr>", found.group(1), re.DOTALL)
    cells = (re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows)
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in row] for row in cells]


def submissions_of(journal: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(journal) as db:
        query = "SELECT part, provider, batch, state, history, input_tokens, output_tokens"
        return db.execute(f"{query} FROM submissions ORDER BY part").fetchall()


def used(results: list[dict[str, Any]], names: tuple[str, str]) -> tuple[int, int]:
    usages = [r["data"]["usage"] for r in results if r["ok"]]
    return sum(u[names[0]] for u in usages), sum(u[names[1]] for u in usages)


LANE_BATCH = "answered through the provider's batch endpoint, at its price"


@pytest.mark.integration
def test_the_report_of_an_openai_batch_run_shows_each_part_and_the_tokens(
    server: MockServerProcess, tmp_path: Path
) -> None:
    rows_file(tmp_path, 12)
    url = f"{base(server)}/v1/chat/completions"
    done = batchsync(
        "rows.jsonl", "--url", url, "--row-as-body", "--batch-api", "--poll", "0.1",
        "--batch-rows", "5", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "rows-report.html").read_text()
    assert "<h2 id='batch-submissions'>Batch submissions</h2>" in page
    journaled = submissions_of(tmp_path / "rows-journal.sqlite3")
    shown = table(page, "submissions")
    assert len(shown) == len(journaled) == 3
    for cells, (number, provider, batch, state, _, inputs, outputs) in zip(
        shown, journaled, strict=True
    ):
        assert cells[0] == str(number) and cells[1] == "1"
        assert (
            (cells[2], cells[4], cells[5])
            == (provider, batch, state)
            == (
                "openai",
                batch,
                "cleaned",
            )
        )
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cells[6]), cells[6]
        assert cells[6] <= cells[7]
        assert (cells[8], cells[9]) == (str(inputs), str(outputs))
    assert [cells[3] for cells in shown] == ["5 (0-4)", "5 (5-9)", "2 (10-11)"]
    # The tokens: as the answers' usage says, summed over the parts, with the saving as the
    # providers state it (and no price per token).
    results = read_jsonl(tmp_path / "rows-results.jsonl")
    inputs, outputs = used(results, ("prompt_tokens", "completion_tokens"))
    assert inputs > 0 and outputs > 0
    assert (inputs, outputs) == (sum(p[5] for p in journaled), sum(p[6] for p in journaled))
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert f"Tokens used: {inputs} input and {outputs} output" in text
    assert f"these {inputs} input and {outputs} output tokens cost half what the same" in text
    assert "$" not in text.split("Batch submissions", 1)[1].split("Slowest items", 1)[0]
    # Each part's states over time, as its history has them.
    history = table(page, "submission-history")
    for number, _, _, _, entries, _, _ in journaled:
        states = [cells[1] for cells in history if cells[0] == str(number)]
        assert states == [state for _, state in json.loads(entries)]
        assert states[:3] == ["planned", "uploaded", "submitting"]
        assert states[-3:] == ["completed", "collected", "cleaned"]
    # Which lane answered the rows: all the batch endpoint.
    assert table(page, "lanes") == [["batch", "12", LANE_BATCH]]
    if importlib.util.find_spec("plotly") is not None:
        assert "chart-submissions" in page
        assert page.count("plotly.js v") <= 1  # (plotly.js once, with the first chart)
        # The live calls' charts over time are not drawn: no row went live.
        for chart in ("chart-rate", "chart-latency", "chart-waits"):
            assert f"id='{chart}'" not in page and f'id="{chart}"' not in page
        assert "chart-attempts" in page and "chart-outcomes" in page


@pytest.mark.integration
def test_the_report_of_an_anthropic_batch_run_names_its_batches(
    server: MockServerProcess, tmp_path: Path
) -> None:
    rows_file(tmp_path, 3, model="claude-mock")
    url = f"{base(server)}/v1/messages"
    done = batchsync(
        "rows.jsonl", "--url", url, "--row-as-body", "--batch-api=anthropic", "--poll", "0.1",
        "--batch-rows", "2", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "rows-report.html").read_text()
    journaled = submissions_of(tmp_path / "rows-journal.sqlite3")
    shown = table(page, "submissions")
    assert [(c[2], c[3], c[4], c[5]) for c in shown] == [
        ("anthropic", "2 (0-1)", journaled[0][2], "cleaned"),
        ("anthropic", "1 (2)", journaled[1][2], "cleaned"),
    ]
    results = read_jsonl(tmp_path / "rows-results.jsonl")
    inputs, outputs = used(results, ("input_tokens", "output_tokens"))
    assert f"these {inputs} input and {outputs} output tokens cost half" in page
    states = {cells[1] for cells in table(page, "submission-history")}
    assert {"planned", "submitting", "in_progress", "ended", "collected"} <= states


@pytest.mark.integration
def test_a_live_run_has_no_batch_section(server: MockServerProcess, tmp_path: Path) -> None:
    rows_file(tmp_path, 3)
    url = f"{base(server)}/v1/chat/completions"
    done = batchsync("rows.jsonl", "--url", url, "--row-as-body", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "rows-report.html").read_text()
    assert "Batch submissions" not in page and "submissions" not in page
    assert HALF not in page


@pytest.mark.integration
def test_a_library_batch_reports_its_parts_from_memory(
    server: MockServerProcess, tmp_path: Path
) -> None:
    from batchsync import Batch

    rows = [{"n": n, "prompt": f"question {n:02d}"} for n in range(4)]
    messages = [{"role": "user", "content": "{prompt}"}]
    body = {"model": "gpt-mock", "max_tokens": 20, "messages": messages}
    url = f"{base(server)}/v1/chat/completions"
    batch = Batch(
        rows, url=url, method="POST", body=body, id_field="n", batch_api="openai", poll=0.1,
        progress=False,
    )  # fmt: skip
    rs = batch.run()
    assert all(r.ok for r in rs)
    page = rs.report(tmp_path / "batch.html", charts=False).read_text()
    shown = table(page, "submissions")
    assert [(c[2], c[3], c[5]) for c in shown] == [("openai", "4 (0-3)", "cleaned")]
    assert HALF in page


def test_the_section_escapes_what_the_provider_named_and_draws_no_chart_without_plotly(
    tmp_path: Path,
) -> None:
    hostile = "<script>alert(1)</script>"
    parts = [
        Part(1, 1, "openai", ((0, 2), (4, 4), (6, 6), (8, 8), (10, 11)), batch=hostile,
             state="in_progress", submitted=1_700_000_000.0, tokens=(30, 40),
             history=((1_699_999_999.0, "planned"), (1_700_000_000.0, "submitting"),
                      (1_700_000_005.0, "in_progress"))),
        Part(2, 2, "openai", ((3, 3),), state="dropped", history=((1_700_000_010.0, "dropped"),)),
    ]  # fmt: skip
    results = [Result(index=i, url="http://x/v1/chat/completions", ok=True) for i in range(12)]
    written = ResultSet(results, submissions=parts).report(tmp_path / "r.html", charts=False)
    page = written.read_text()
    assert hostile not in page and html.escape(hostile) in page
    shown = table(page, "submissions")
    assert shown[0][3] == "8 (0-2, 4, 6, 8, …)"
    assert (shown[1][4], shown[1][6], shown[1][8]) == ("", "", "0")
    assert "these 30 input and 40 output tokens cost half" in page
    assert "Parts dropped: 1 (" in page and "Parts still open at the provider: 1 (" in page
    history = table(page, "submission-history")
    assert [c[:2] + c[3:] for c in history] == [
        ["1", "planned", "0.0", "1.0"],
        ["1", "submitting", "1.0", "5.0"],
        ["1", "in_progress", "6.0", ""],
        ["2", "dropped", "0.0", ""],
    ]
    assert "chart-submissions" not in page
