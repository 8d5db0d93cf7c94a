"""Templates from a table (issue 19): one request per row of a CSV/TSV/JSONL table or of any
iterable of mappings, its values percent-encoded into the URL (and typed into a JSON body), as
the mock server received them; bad templates refused up front; the journal knows the template;
memory stays flat however many rows."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

import batchsync
from batchsync.http.template import RowError, Template

from .mockserver import MockServerProcess
from .test_cli import batchsync as run_cli
from .test_cli import key, read_jsonl

# What a value can hold that a URL must not take as its own syntax.
AWKWARD = ["a/b", "two words", "x&y=z", "frag#ment", "what?", "plus+sign", "100%", "héllo Ωμέγα"]


def received(server: MockServerProcess, marker: str) -> list[tuple[str, dict[str, list[str]]]]:
    """(path, query) of each request the server got whose target holds ``marker``, decoded by
    the server's side of the wire: the raw target as it arrived, split, then unquoted."""
    entries = server.log(marker)
    return [(urlsplit(e["target"]).path, parse_qs(urlsplit(e["target"]).query)) for e in entries]


def segment(path: str, position: int) -> str:
    return unquote(path.split("/")[position])


# --- the template module, pure ------------------------------------------------------------


@given(st.text(min_size=1).filter(lambda text: text not in (".", "..")))
def test_a_value_stays_one_path_segment_and_one_query_value(value: str) -> None:
    template = Template.parse("https://h.test/c/{v}/orders?since={v}&n=1")
    url = template.expand({"v": value})["url"]
    parts = urlsplit(url)
    assert parts.netloc == "h.test"
    assert parts.path.count("/") == 3
    assert segment(parts.path, 2) == value
    assert parse_qs(parts.query, keep_blank_values=True) == {"since": [value], "n": ["1"]}
    assert parts.fragment == ""


@pytest.mark.parametrize("value", [".", ".."])
def test_a_dot_segment_fails_its_row_in_the_path_not_in_the_query(value: str) -> None:
    """Clients resolve '.' and '..' segments before sending: /c/../orders goes to /orders."""
    template = Template.parse("https://h.test/c/{v}/orders?since={q}")
    with pytest.raises(RowError, match=r"^\{v\} would make a '\.' or '\.\.' path segment"):
        template.expand({"v": value, "q": "x"})
    assert template.expand({"v": "a", "q": value})["url"].endswith(f"since={value}")
    assert template.expand({"v": "...", "q": "x"})["url"] == "https://h.test/c/.../orders?since=x"


def test_a_dot_segment_row_sends_nothing(server: MockServerProcess) -> None:
    marker = key()
    rows = [{"id": ".."}, {"id": "a"}]
    rs = batchsync.fetch_all(rows, url=f"{server.url}/ok/{marker}/{{id}}/orders", progress=False)
    assert [r.error_kind for r in rs] == ["invalid_request", None]
    assert [path for path, _ in received(server, marker)] == [f"/ok/{marker}/a/orders"]


def test_a_body_template_nested_too_deeply_is_one_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        Template.parse("https://h.test/{v}", body=json.loads("[" * 900 + "]" * 900))


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://h.test/c/{id", "unbalanced '{' at character 18"),
        ("https://h.test/c/id}", "unbalanced '}' at character 20"),
        ("https://h.test/c/{}", "{} at character 18 names no field"),
        ("ftp://h.test/{id}", "not an http(s) URL"),
        ("{base}/orders", "not an http(s) URL"),
        ("https://{host}/orders", "the scheme, host and port must be written out"),
        ("https://h.test:{port}/orders", "the scheme, host and port must be written out"),
    ],
)
def test_a_bad_url_template_is_a_value_error_naming_the_problem(url: str, message: str) -> None:
    with pytest.raises(ValueError, match="the URL template") as caught:
        Template.parse(url)
    assert message in str(caught.value)


def test_braces_doubled_are_literal_and_fields_may_hold_any_name() -> None:
    template = Template.parse("https://h.test/{{x}}/{customer id}")
    assert template.fields == ("customer id",)
    assert template.expand({"customer id": 7})["url"] == "https://h.test/{x}/7"


def test_the_body_template_types_whole_fields_and_puts_others_in_as_text() -> None:
    template = Template.parse(
        "https://h.test/o",
        "post",
        {"n": "{n}", "tags": ["{tags}", "x"], "note": "order {n} of {who}", "lit": "{{n}}"},
    )
    item = template.expand({"n": 5, "tags": ["a"], "who": True, "id": "c-1"})
    assert item == {
        "url": "https://h.test/o",
        "method": "POST",
        "json": {"n": 5, "tags": [["a"], "x"], "note": "order 5 of true", "lit": "{n}"},
        "id": "c-1",
    }


def test_a_value_that_is_not_text_fails_its_row_alone() -> None:
    template = Template.parse("https://h.test/{id}")
    with pytest.raises(RowError, match=r"^\{id\} is not UTF-8 text"):
        template.expand({"id": "\ud800"})  # (JSON's "\ud800": a lone surrogate)
    with pytest.raises(RowError, match=r"^\{id\} is a dict, not a value to put in text"):
        template.expand({"id": {"a": 1}})


@pytest.mark.parametrize("row", [{}, {"since": None}, {"since": float("nan")}])
def test_a_missing_value_names_the_field_never_a_value(row: dict[str, Any]) -> None:
    template = Template.parse("https://h.test/{id}?since={since}")
    with pytest.raises(RowError, match=r"^no value for \{since\}$"):
        template.expand({"id": "s3cr3t", **row})


# --- the command line against the mock server ------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".tab", ".jsonl"])
def test_every_row_is_one_request_its_values_percent_encoded(
    server: MockServerProcess, tmp_path: Path, suffix: str
) -> None:
    marker = key()
    rows = [{"id": value, "since": f"2024-01-0{n} 00:00"} for n, value in enumerate(AWKWARD)]
    if suffix == ".jsonl":
        text = "".join(json.dumps(row) + "\n" for row in rows)
    else:
        sep = "," if suffix == ".csv" else "\t"
        quoted = [
            '"' + str(value).replace('"', '""') + '"' for row in rows for value in row.values()
        ]
        lines = [sep.join(quoted[i : i + 2]) for i in range(0, len(quoted), 2)]
        text = f"id{sep}since\n" + "\n".join(lines) + "\n"
    (tmp_path / f"table{suffix}").write_text(text, encoding="utf-8")
    done = run_cli(
        f"table{suffix}", "--url", f"{server.url}/ok/{marker}/{{id}}/orders?since={{since}}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = received(server, marker)
    assert sorted((segment(path, 3), query["since"][0]) for path, query in got) == sorted(
        (row["id"], row["since"]) for row in rows
    )
    assert all(path.count("/") == 4 for path, _ in got)  # no value added a segment
    results = read_jsonl(tmp_path / "table-results.jsonl")
    assert [r["id"] for r in results] == [row["id"] for row in rows]  # the id column, by default


@pytest.mark.integration
def test_input_format_reads_a_table_whatever_its_name(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    (tmp_path / "export.txt").write_text("code;x\nk1,1\n".replace(";", ","))
    done = run_cli(
        "export.txt", "--input-format", "csv", "--url", f"{server.url}/ok/{marker}/{{code}}",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [path for path, _ in received(server, marker)] == [f"/ok/{marker}/k1"]


@pytest.mark.integration
def test_a_row_missing_a_field_fails_alone_naming_the_field_never_its_values(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    (tmp_path / "rows.jsonl").write_text(
        '{"id": 1, "since": "2024"}\n{"id": 2, "token": "s3cr3t-t0ken"}\n{"id": 3, "since": "x"}\n'
    )
    (tmp_path / "rows.csv").write_text("id,since\n1,2024\n2,\n3,x\n")
    for name, where in (("rows.jsonl", "line 2"), ("rows.csv", "row 2")):
        done = run_cli(
            name, "--url", f"{server.url}/ok/{marker}/{{id}}?since={{since}}", "-o", name,
            cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 1, done.stderr
        results = read_jsonl(tmp_path / f"{name}-results.jsonl")
        assert [r["ok"] for r in results] == [True, False, True]
        assert results[1]["error_kind"] == "invalid_request"
        assert results[1]["error"] == f"{where}: no value for {{since}}"
        assert results[1]["attempts"] == 0
        assert "s3cr3t" not in (tmp_path / f"{name}-results.jsonl").read_text()
        assert "s3cr3t" not in done.stderr
    assert sorted(path for path, _ in received(server, marker)) == [
        f"/ok/{marker}/{n}" for n in (1, 1, 3, 3)
    ]


BAD = [
    (["--url", "{server}/ok/{id"], "unbalanced '{'"),
    (["--url", "ftp://h.test/{id}"], "not an http(s) URL"),
    (["--url", "https://{id}.test/x"], "the scheme, host and port must be written out"),
    (["--url", "{server}/echo/{id}", "--body-template", '{"a": '], "the body template is not JSON"),
    (["--url", "{server}/echo/{id}", "--method", "TRACE"], "method must be one of"),
    (["--url", "{server}/ok/{customer}"], "the template names {customer}, but the header row"),
    (["--url", "{server}/ok/{id}", "--id-field", "nope"], "the template names {nope}"),
    (["--method", "POST"], "--method goes with --url"),
    (["--url", "{server}/ok/{id}", "urls.txt"], "--url needs a table"),
    (["--url", "{server}/ok/{id}", "empty.csv"], "has no header row"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("args", "message"), BAD)
def test_a_bad_template_or_table_exits_2_before_anything_is_sent_or_written(
    server: MockServerProcess, tmp_path: Path, args: list[str], message: str
) -> None:
    marker = key()
    (tmp_path / "table.csv").write_text("id,since\n1,2\n")
    (tmp_path / "urls.txt").write_text(f"{server.url}/ok/{marker}\n")
    (tmp_path / "empty.csv").write_text("")
    given_input = [a for a in args if a.endswith((".txt", ".csv"))] or ["table.csv"]
    prefix = Path(given_input[0]).stem
    (tmp_path / f"{prefix}-results.jsonl").write_text("earlier\n")
    options = [a.replace("{server}", f"{server.url}").replace("/ok/", f"/ok/{marker}/")
               for a in args if not a.endswith((".txt", ".csv"))]  # fmt: skip
    done = run_cli(*given_input, *options, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stderr.startswith("Error: ") and len(done.stderr.splitlines()) == 1
    assert "Traceback" not in done.stderr
    assert (tmp_path / f"{prefix}-results.jsonl").read_text() == "earlier\n"
    assert not (tmp_path / f"{prefix}-failed.jsonl").exists()
    assert server.log(marker) == []


@pytest.mark.integration
def test_the_body_template_reaches_the_server_typed(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    (tmp_path / "rows.jsonl").write_text(
        '{"sku": "a/1", "qty": 3, "gift": true}\n{"sku": "b 2", "qty": 1.5, "gift": null}\n'
    )
    body = '{"item": {"sku": "{sku}", "qty": "{qty}"}, "note": "{qty} x {sku}", "gift": "{gift}"}'
    done = run_cli(
        "rows.jsonl", "--url", f"{server.url}/echo/{marker}/{{sku}}", "--method", "put",
        "--body-template", body, "--id-field", "sku", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # the second row has no value for {gift}
    first, second = read_jsonl(tmp_path / "rows-results.jsonl")
    assert first["data"]["method"] == "PUT"
    assert first["data"]["path"] == f"/echo/{marker}/a%2F1"
    assert json.loads(first["data"]["body"]) == {
        "item": {"sku": "a/1", "qty": 3}, "note": "3 x a/1", "gift": True,
    }  # fmt: skip
    assert first["id"] == "a/1"
    assert second["error"] == "line 2: no value for {gift}"


@pytest.mark.integration
def test_the_failed_file_holds_the_built_requests_and_reruns_only_them(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    (tmp_path / "t.csv").write_text("id,route\nc1,ok\nc2,404\nc3,ok\n")
    first = run_cli("t.csv", "--url", f"{server.url}/{{route}}/{marker}/{{id}}", cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    failed = read_jsonl(tmp_path / "t-failed.jsonl")
    assert failed == [{"url": f"{server.url}/404/{marker}/c2", "id": "c2"}]
    again = run_cli("t-failed.jsonl", cwd=tmp_path)
    assert again.returncode == 1
    assert server.count(f"/404/{marker}/c2") == 2
    assert server.count(f"/ok/{marker}/c1") == 1
    assert [r["id"] for r in read_jsonl(tmp_path / "t-failed-results.jsonl")] == ["c2"]


@pytest.mark.integration
def test_resuming_with_other_template_options_is_refused(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    (tmp_path / "t.csv").write_text("id,alt\n1,a\n2,b\n")
    url = f"{server.url}/ok/{marker}/{{id}}"
    assert run_cli("t.csv", "--url", url, cwd=tmp_path).returncode == 0
    for other in (
        ["--url", f"{server.url}/ok/{marker}/{{alt}}"],
        ["--url", url, "--method", "DELETE"],
        ["--url", url, "--id-field", "alt"],
        ["--url", url, "--body-template", "{}"],
        [],
    ):
        refused = run_cli("t.csv", *other, "--resume", cwd=tmp_path)
        assert refused.returncode == 2, (other, refused.stderr)
        assert "made for other input" in refused.stderr
        if other:
            assert "its template options were different" in refused.stderr
    same = run_cli("t.csv", "--url", url, "--resume", cwd=tmp_path)
    assert same.returncode == 0, same.stderr
    assert server.count(f"/ok/{marker}/1") == 1  # nothing fetched twice


# --- the library ---------------------------------------------------------------------------


@pytest.mark.integration
def test_fetch_all_takes_a_list_of_rows_or_a_generator(server: MockServerProcess) -> None:
    marker = key()
    rows = [{"id": value, "since": 2024} for value in AWKWARD] + [{"id": "no-since"}]

    def generated() -> Iterator[dict[str, Any]]:
        yield from rows

    for given_rows in (rows, generated()):
        rs = batchsync.fetch_all(
            given_rows, url=f"{server.url}/ok/{marker}/{{id}}?since={{since}}", progress=False
        )
        assert len(rs) == len(rows)
        # (a row that could not be built has no id, as a line that is no item has none)
        assert [r.id for r in rs] == [row["id"] for row in rows[:-1]] + [None]
        assert [r.ok for r in rs] == [True] * len(AWKWARD) + [False]
        assert rs[-1].error_kind == "invalid_request"
        assert rs[-1].error == "no value for {since}"
    got = received(server, marker)
    assert sorted(segment(path, 3) for path, _ in got) == sorted(AWKWARD * 2)


@pytest.mark.integration
def test_batch_posts_a_body_per_row_with_another_id_field(server: MockServerProcess) -> None:
    marker = key()
    batch = batchsync.Batch(
        [{"customer": "c/1", "n": 2}], url=f"{server.url}/echo/{marker}", method="POST",
        body={"customer": "{customer}", "n": "{n}"}, id_field="customer", progress=False,
    )  # fmt: skip
    (result,) = batch.run()
    assert result.id == "c/1"
    assert result.data["method"] == "POST"
    assert json.loads(result.data["body"]) == {"customer": "c/1", "n": 2}


def test_the_library_refuses_bad_templates_and_resuming_another_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unbalanced"):
        batchsync.fetch_all([{"id": 1}], url="https://h.test/{id")
    with pytest.raises(ValueError, match="go with url="):
        batchsync.fetch_all([{"id": 1}], method="POST")
    journal = tmp_path / "j.sqlite3"
    rows = [{"id": 1}]
    # (nothing is sent: the deadline has passed before the item starts)
    batchsync.Batch(rows, url="https://h.test/{id}", journal=journal, deadline=1e-9).run()
    with pytest.raises(ValueError, match="its template options were different"):
        batchsync.Batch(rows, url="https://h.test/x/{id}", journal=journal)


# --- flat memory ---------------------------------------------------------------------------


def test_reading_and_expanding_a_big_table_keeps_memory_flat(tmp_path: Path) -> None:
    """100 000 rows through the CLI's reader and the template: were rows or requests kept,
    the peak would be tens of MiB; it stays a few KiB."""
    from batchsync.cli.inputs import TableInput  # (here: the other tests run without it)

    path = tmp_path / "big.csv"
    with path.open("w") as out:
        out.write("id,since\n")
        for start in range(0, 100_000, 10_000):
            out.write(
                "".join(f"{i},2024-01-{i % 28 + 1:02d}\n" for i in range(start, start + 10_000))
            )
    template = Template.parse("https://api.example.com/v2/customers/{id}/orders?since={since}")
    source = TableInput(str(path), template)
    try:
        tracemalloc.start()
        try:
            count = 0
            for entry in source:
                count += 1
                assert entry.problem is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    finally:
        source.close()
    assert count == 100_000
    assert peak < 256 * 2**10, peak


@pytest.mark.integration
def test_stdin_is_read_as_json_records(server: MockServerProcess, tmp_path: Path) -> None:
    marker = key()
    rows = '{"id": "s/1"}\n[not a record]\n'
    done = run_cli("-", "--url", f"{server.url}/ok/{marker}/{{id}}", cwd=tmp_path, stdin=rows)
    assert done.returncode == 1, done.stderr
    first, second = read_jsonl(tmp_path / "batch-results.jsonl")
    assert first["ok"] and first["id"] == "s/1"
    assert second["error"] == "line 2: a record must be a JSON object"
    assert [path for path, _ in received(server, marker)] == [f"/ok/{marker}/s%2F1"]


def test_help_names_every_template_option() -> None:
    from click.testing import CliRunner

    from batchsync.cli.command import command

    text = CliRunner().invoke(command, ["--help"], terminal_width=200).output
    for flag in ("--url TEMPLATE", "--method METHOD", "--body-template JSON", "--id-field NAME",
                 "--input-format"):  # fmt: skip
        assert flag in text, flag
