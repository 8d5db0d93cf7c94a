"""--format csv|parquet and --flatten: the results file as typed columns, read back equal to
the JSONL records field by field; flattened bodies equal to_pandas(expand=True)'s; written
atomically, in flat memory; Parquet without pyarrow refused before anything is sent."""

from __future__ import annotations

import csv
import json
import math
import tracemalloc
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from batchsync.cli.output import write_outputs
from batchsync.core.records import dumps
from batchsync.core.result import Result, flat_body
from batchsync.output import columnar
from batchsync.output.columnar import FIXED, Layout
from batchsync.output.resultset import ResultSet

from .mockserver import MockServerProcess
from .test_cli import batchsync, key, read_jsonl

pq = pytest.importorskip("pyarrow.parquet")

KINDS = dict(FIXED) | {"pages": "int"}


def expected_cell(name: str, value: Any) -> Any:
    """What the table holds for a record's field (see columnar's docstring)."""
    if value is None:
        return None
    if KINDS[name] == "json" or (KINDS[name] == "id" and not isinstance(value, str)):
        return dumps(value)
    return value


def from_csv(name: str, text: str) -> Any:
    if text == "":
        return None
    kind = KINDS.get(name, "str")
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "bool":
        return {"true": True, "false": False}[text]
    return text


def read_csv(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [
            {name: from_csv(name, text) for name, text in row.items()}
            for row in csv.DictReader(handle)
        ]


@pytest.fixture
def finished_run(server: MockServerProcess, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """A run (JSONL) of ok, 404, 503, broken-JSON and formula-looking items, with ids of
    several types and a secret query parameter."""
    tag = key()
    items = [
        f"{server.url}/ok/{tag}/a",
        json.dumps({"url": f"{server.url}/404/{tag}", "id": "order-1"}),
        json.dumps({"url": f"{server.url}/503/{tag}", "id": 7}),
        json.dumps({"url": f"{server.url}/broken-json/{tag}", "id": {"k": [1, 2]}}),
        f"{server.url}/echo/{tag}?f==HYPERLINK(%22x%22)",
        f"{server.url}/ok/{tag}/b,c%22d?api_key=SECRET1",
    ]
    (tmp_path / "items.txt").write_text("\n".join(items) + "\n")
    done = batchsync("items.txt", "--attempts", "2", "--no-progress", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    return tmp_path, read_jsonl(tmp_path / "items-results.jsonl")


@pytest.mark.integration
def test_csv_and_parquet_hold_the_jsonl_records_field_by_field(
    server: MockServerProcess, finished_run: tuple[Path, list[dict[str, Any]]]
) -> None:
    """Also: --resume with another --format rebuilds the outputs from the journal (nothing
    is sent again) and the failed file stays the same JSONL."""
    folder, records = finished_run
    failed = (folder / "items-failed.jsonl").read_bytes()
    tag = records[0]["url"].split("/")[-2]
    sent = {k: v for k, v in server.stats()["counts"].items() if tag in k}
    assert "SECRET1" not in json.dumps(records)
    for form in ("csv", "parquet"):
        again = batchsync("items.txt", "--resume", "--format", form, "-q", cwd=folder)
        assert again.returncode == 1, again.stderr
        path = folder / f"items-results.{form}"
        rows = read_csv(path) if form == "csv" else pq.read_table(path).to_pylist()
        assert [list(row) for row in rows] == [[name for name, _ in FIXED]] * len(records)
        for row, record in zip(rows, records, strict=True):
            assert row == {name: expected_cell(name, record[name]) for name, _ in FIXED}
            assert json.loads(row["attempt_log"]) == record["attempt_log"]
        assert (folder / "items-failed.jsonl").read_bytes() == failed
        assert "SECRET1" not in path.read_bytes().decode("utf-8", "replace")
    assert {k: v for k, v in server.stats()["counts"].items() if tag in k} == sent
    # The kinds of outcome the table was checked on.
    assert [r["error_kind"] for r in records] == [
        None, "status", "status", "invalid_body", None, None
    ]  # fmt: skip


def parquet_types(path: Path) -> dict[str, str]:
    return {field.name: str(field.type) for field in pq.read_schema(path)}


@pytest.mark.integration
def test_flatten_spreads_the_bodies_as_to_pandas_expand_does(
    finished_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    pytest.importorskip("pandas")
    folder, records = finished_run
    for form in ("parquet", "csv"):
        done = batchsync(
            "items.txt", "--resume", "--format", form, "--flatten", "-q", cwd=folder
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
    wide = ResultSet([Result.from_dict(record) for record in records]).to_pandas(expand=True)
    expected = {name for name in wide.columns if name.startswith("data.")}
    table = pq.read_table(folder / "items-results.parquet").to_pylist()
    texts = read_csv(folder / "items-results.csv")
    spread = [name for name in table[0] if name.startswith("data.")]
    assert set(spread) == expected and "data.query.f" in spread
    types = parquet_types(folder / "items-results.parquet")
    assert types["data.ok"] == "bool" and types["data.path"] == "string"
    for position, row in enumerate(table):
        assert row["data"] is None  # everything was spread (a failure here has no data)
        for name in spread:
            want = wide[name].iloc[position]
            cell, text = row[name], texts[position][name]
            if cell is None:
                assert want is None or (isinstance(want, float) and math.isnan(want)), name
                assert text is None
                continue
            if text is None:  # CSV: an empty cell is a null or an empty text
                assert cell == "", name
                continue
            got = json.loads(cell) if isinstance(want, list | dict) else cell
            assert got == want, name
            assert text == (cell if isinstance(cell, str) else columnar._csv_text(cell))
    assert texts[4]["data.query.f"] == '=HYPERLINK("x")'


def test_flat_body_spreads_as_pandas_json_normalize() -> None:
    pd = pytest.importorskip("pandas")
    bodies: list[dict[str, Any]] = [
        {"a": {}, "b": {"c": {"d": 1}}, "l": [1, {"x": 2}]},
        {"a.b": 1, "a": {"b": 2}},
        {"e": None, "s": "t"},
    ]
    normalized = pd.json_normalize(bodies).to_dict("records")
    for body, row in zip(bodies, normalized, strict=True):
        present = {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
        assert flat_body(body) == present | ({"e": None} if "e" in body else {})
    assert flat_body([1, 2]) == {"value": [1, 2]}


def test_columns_beyond_the_cap_stay_in_data() -> None:
    records = [
        Result(0, "u", True, data={"a": 1, "b": {"c": 2.5}, "d": [1]}).to_dict(),
        Result(1, "u", True, data={"a": 2.5, "z": "x"}).to_dict(),
        Result(2, "u", False, data=[{"page": 1}], pages=1).to_dict(),
    ]
    layout = Layout.of(records, paged=True, flatten=True, cap=3)
    assert layout.columns()[len(FIXED) :] == [
        ("pages", "int"), ("data.a", "float"), ("data.b.c", "float"), ("data.d", "json"),
    ]  # fmt: skip
    data = len(FIXED) - 4
    rows = [layout.row(record) for record in records]
    assert [row[data] for row in rows] == [None, '{"z":"x"}', '[{"page":1}]']
    assert [row[-4:] for row in rows] == [[None, 1.0, 2.5, "[1]"], [None, 2.5, None, None],
                                          [1, None, None, None]]  # fmt: skip


def synthetic(count: int) -> Iterator[tuple[str, str | None]]:
    """Journal rows of ``count`` results, every tenth failed."""
    for index in range(count):
        ok = index % 10 != 0
        result = Result(
            index, f"https://h.test/{index}", ok, id=f"i{index}",
            status_code=200 if ok else 503, attempts=1, error_kind=None if ok else "status",
            data={"n": index, "name": f"item {index}", "deep": {"x": index / 3}} if ok else None,
            elapsed=0.01,
        )  # fmt: skip
        yield dumps(result.to_dict()), None if ok else '{"url":"https://h.test/"}'


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_memory_stays_flat_as_the_rows_grow(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(columnar, "GROUP_ROWS", 1000)  # (small groups at this small scale)
    peaks = []
    for count in (5_000, 25_000):
        tracemalloc.start()
        try:
            source = partial(synthetic, count)
            write_outputs(str(tmp_path / f"m{count}"), source, form=form, flatten=True)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    # Five times the rows, about the same peak (a row group, a body, the column set).
    assert peaks[1] < peaks[0] * 1.5 + 256 * 1024, peaks
    rows = (
        read_csv(tmp_path / "m25000-results.csv")
        if form == "csv"
        else pq.read_table(tmp_path / "m25000-results.parquet").to_pylist()
    )
    assert len(rows) == 25_000 and float(rows[-1]["data.deep.x"]) == 24_999 / 3
    assert len((tmp_path / "m25000-failed.jsonl").read_text().splitlines()) == 2_500


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_a_failure_mid_write_leaves_the_previous_files_untouched(
    form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(columnar, "GROUP_ROWS", 10)  # (row groups written before it fails)
    prefix = str(tmp_path / "run")
    results, failed = write_outputs(prefix, lambda: synthetic(30), form=form)
    before = results.read_bytes(), failed.read_bytes()

    def failing() -> Iterator[tuple[str, str | None]]:
        for number, row in enumerate(synthetic(100)):
            if number == 55:
                raise OSError(28, "No space left on device")
            yield row

    with pytest.raises(OSError, match="No space"):
        write_outputs(prefix, failing, form=form, flatten=True)
    assert (results.read_bytes(), failed.read_bytes()) == before
    assert sorted(path.name for path in tmp_path.iterdir()) == [failed.name, results.name]


@pytest.mark.integration
def test_parquet_without_pyarrow_is_one_line_exit_2_before_anything_is_sent(
    server: MockServerProcess, tmp_path: Path
) -> None:
    url = f"{server.url}/ok/{key()}"
    (tmp_path / "urls.txt").write_text(url + "\n")
    no_pyarrow = (
        "import sys; sys.modules['pyarrow'] = sys.modules['pyarrow.parquet'] = None; "
        "from batchsync.cli import main; main()"
    )
    done = batchsync_script(no_pyarrow, "urls.txt", "--format", "parquet", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "Error: --format parquet needs pyarrow: pip install 'batchsync[parquet]'"
    ]
    flat = batchsync("urls.txt", "--flatten", cwd=tmp_path)
    assert flat.returncode == 2
    assert flat.stderr.splitlines() == ["Error: --flatten goes with --format csv or parquet"]
    assert server.count(f"/ok/{url.rsplit('/', 1)[1]}") == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["urls.txt"]


def batchsync_script(script: str, *args: str, cwd: Path) -> Any:
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=cwd, capture_output=True, text=True,
        timeout=60, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_resultset_writes_the_same_table_as_the_cli(form: str, tmp_path: Path) -> None:
    results = [Result.from_dict(json.loads(record)) for record, _ in synthetic(50)]
    rs = ResultSet(results)
    write = rs.to_csv if form == "csv" else rs.to_parquet
    write(tmp_path / f"library.{form}", flatten=True)
    rows = [(dumps(result.to_dict()), None) for result in results]
    cli, _ = write_outputs(str(tmp_path / "cli"), rows, form=form, flatten=True)
    if form == "csv":
        assert (tmp_path / "library.csv").read_bytes() == cli.read_bytes()
    else:
        assert pq.read_table(tmp_path / "library.parquet").equals(pq.read_table(cli))
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "cli-failed.jsonl", cli.name, f"library.{form}"
    ]  # fmt: skip


def test_flatten_refuses_rows_it_could_read_only_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="twice"):
        write_outputs(str(tmp_path / "x"), synthetic(3), form="csv", flatten=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_a_lone_surrogate_is_written_as_its_escape_in_every_table(
    server: MockServerProcess, tmp_path: Path, form: str
) -> None:
    """A JSON "\\ud800" escape is valid JSON but no UTF-8 text: the JSONL keeps it as the
    escape, and so must the tables (and the report), not fail the run's outputs."""
    marker = key()
    lines = [
        json.dumps({"url": f"{server.url}/ok/{marker}", "id": "\ud800"}),
        json.dumps({"url": f"{server.url}/ok/{marker}/\udc00x"}),
        f"{server.url}/surrogate",
    ]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    done = batchsync(
        "in.txt", "-o", "out", "--format", form, "--flatten", "-q", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if form == "csv":
        rows = read_csv(tmp_path / "out-results.csv")
        cells = [(row["id"], row["url"], row.get("data.name")) for row in rows]
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(tmp_path / "out-results.parquet").to_pylist()
        cells = [(row["id"], row["url"], row.get("data.name")) for row in table]
    assert cells[0][0] == "\\ud800"
    assert cells[1][1].endswith(f"/ok/{marker}/\\udc00x")
    assert cells[2][2] == "\\ud800"
    report = (tmp_path / "out-report.html").read_text()
    assert "\ufffd" in report  # the id and URL, shown with a replacement mark


def test_the_library_writes_nan_as_the_command_line_does(tmp_path: Path) -> None:
    results = ResultSet([Result(0, "http://h.test/x", True, data={"x": math.nan, "y": 1.5})])
    results.to_csv(tmp_path / "r.csv", flatten=True)
    (row,) = read_csv(tmp_path / "r.csv")
    assert (row["data.x"], row["data.y"]) == (None, "1.5")


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_a_lone_surrogate_in_a_body_key_is_written_as_its_escape(
    server: MockServerProcess, tmp_path: Path, form: str
) -> None:
    """A key "\\ud800" is valid JSON but no UTF-8 text: its column is named by the escape,
    as a value's cell already is, instead of failing the run's outputs."""
    (tmp_path / "in.txt").write_text(f"{server.url}/surrogate-key\n")
    done = batchsync("in.txt", "-o", "out", "--format", form, "--flatten", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    if form == "csv":  # (CSV cells are text)
        (row,) = read_csv(tmp_path / "out-results.csv")
        assert (row["data.\\ud800"], row["data.a.\\udc00b"]) == ("1", "2")
    else:
        (row,) = pq.read_table(tmp_path / "out-results.parquet").to_pylist()
        assert (row["data.\\ud800"], row["data.a.\\udc00b"]) == (1, 2)


def test_the_library_writes_a_lone_surrogate_key_as_its_escape(tmp_path: Path) -> None:
    body = {"\ud800": 1, "a": {"\udc00b": 2}}
    results = ResultSet([Result(0, "http://h.test/x", True, data=body)])
    results.to_csv(tmp_path / "r.csv", flatten=True)
    results.to_parquet(tmp_path / "r.parquet", flatten=True)
    (row,) = read_csv(tmp_path / "r.csv")
    assert (row["data.\\ud800"], row["data.a.\\udc00b"]) == ("1", "2")
    (row,) = pq.read_table(tmp_path / "r.parquet").to_pylist()
    assert (row["data.\\ud800"], row["data.a.\\udc00b"]) == (1, 2)
    frame = results.to_pandas(expand=True)
    assert list(frame.columns[-2:]) == ["data.\\ud800", "data.a.\\udc00b"]
    frame.to_csv(tmp_path / "frame.csv")  # (a raw surrogate cannot be written as UTF-8)
