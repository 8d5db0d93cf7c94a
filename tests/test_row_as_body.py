"""The OpenAI cookbook's input runs as it is (issue 28 item 4): ``--row-as-body`` sends each
JSON record, less its ``metadata`` field, as the body of a POST to one URL, the metadata as the
result's id; results in input order, resumable, the failed file valid input again; refused up
front (exit 2, nothing sent) where it cannot mean anything."""

from __future__ import annotations

import hashlib
import json
import shlex
import signal
from pathlib import Path
from typing import Any

import pytest

from batchsync.http.template import RowError, Template

from .mockserver import MockServerProcess
from .test_cli import batchsync as run_cli
from .test_cli import key, read_jsonl
from .test_durability import start_cli, wait_until

URL = "https://api.example/v1/chat/completions"


def chat(content: str, **extra: Any) -> dict[str, Any]:
    """A request body as the cookbook's files hold them."""
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": content}], **extra}


# Every kind of metadata the cookbook lets through (any JSON value, or none) and bodies whose
# JSON must arrive as written: key order, unicode, nesting, numbers of each kind, null.
ROWS: list[dict[str, Any]] = [
    {**chat("héllo Ωμέγα", max_tokens=50), "metadata": {"row_id": 7}},
    {"metadata": "second", **chat("two", temperature=0.25, n=2, stop=None)},
    {**chat("three", max_tokens=10**20), "metadata": 3},
    chat("no metadata", tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    {**chat("null metadata"), "metadata": None},
    {**chat("a list"), "metadata": [1, "b"], "user": "u-5"},
]


def without_metadata(row: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in row.items() if name != "metadata"}


def write_rows(path: Path, rows: list[Any]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


# --- the template, pure ----------------------------------------------------------------------


def test_the_row_less_its_metadata_is_the_body_and_the_metadata_the_id() -> None:
    template = Template.parse(URL, "POST", row_as_body=True)
    for row in ROWS:
        item = template.expand(row)
        assert item["url"] == URL and item["method"] == "POST"
        assert list(item["json"].items()) == list(without_metadata(row).items())
        assert item.get("id") == row.get("metadata")
    assert "id" not in template.expand({"id": "the API's own field", "input": "x"})


def test_another_id_field_stays_in_the_body_and_metadata_goes_all_the_same() -> None:
    template = Template.parse(URL, "POST", id_field="custom_id", row_as_body=True)
    item = template.expand({"custom_id": "r-1", "input": "x", "metadata": {"k": 1}})
    assert item["json"] == {"custom_id": "r-1", "input": "x"}
    assert item["id"] == "r-1"
    with pytest.raises(RowError, match=r"no value for \{custom_id\}"):
        template.expand({"input": "x"})


def test_a_row_strict_json_cannot_write_fails_alone_naming_no_value() -> None:
    template = Template.parse(URL, "POST", row_as_body=True)
    with pytest.raises(RowError) as raised:
        template.expand({"api_key": "sk-s3cr3t", "temperature": float("nan")})
    assert "no JSON form" in str(raised.value)
    assert "s3cr3t" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "body", "message"),
    [
        (URL + "?model={model}", None, r"cannot name a field \(\{model\}"),
        ("https://api.example/v1/{path}", None, r"cannot name a field \(\{path\}"),
        (URL, {"input": "{text}"}, "give no body template"),
    ],
)
def test_a_template_that_would_fill_what_the_row_gives_is_refused(
    url: str, body: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Template.parse(url, "POST", body, row_as_body=True)


def test_literal_braces_stay_in_the_one_url_and_no_value_goes_in_it() -> None:
    template = Template.parse("https://api.example/v1/{{x}}/chat", "POST", row_as_body=True)
    item = template.expand({"x": "../admin", "input": "a"})
    assert item["url"] == "https://api.example/v1/{x}/chat"


def test_the_identity_tells_the_row_as_body_apart_and_earlier_digests_stay() -> None:
    plain = Template.parse(URL, "POST")
    as_body = Template.parse(URL, "POST", row_as_body=True)
    assert plain.identity() != as_body.identity()
    # a journal made before the option existed resumes as it did
    earlier = json.dumps([URL, "POST", None, None], sort_keys=True, default=repr)
    assert plain.identity() == hashlib.sha256(earlier.encode()).hexdigest()


# --- the command line against the mock server ------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("method", [["--method", "POST"], []])
def test_each_row_less_metadata_reaches_the_one_url_as_the_body_in_input_order(
    server: MockServerProcess, tmp_path: Path, method: list[str]
) -> None:
    marker = key()
    write_rows(tmp_path / "requests.jsonl", ROWS)
    done = run_cli(
        "requests.jsonl", "--url", f"{server.url}/echo/{marker}", *method, "--row-as-body",
        "-H", "Authorization: Bearer sk-test-key", "-c", "4", "--no-report", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    results = read_jsonl(tmp_path / "requests-results.jsonl")
    assert [r["index"] for r in results] == list(range(len(ROWS)))
    assert [r.get("id") for r in results] == [row.get("metadata") for row in ROWS]
    for result, row in zip(results, ROWS, strict=True):
        echoed = result["data"]
        assert echoed["method"] == "POST"  # (--method POST, or the default with --row-as-body)
        assert echoed["path"] == f"/echo/{marker}" and echoed["query"] == {}
        assert echoed["headers"]["Content-Type"] == "application/json"
        assert echoed["headers"]["Authorization"] == "Bearer sk-test-key"
        received = json.loads(echoed["body"])
        assert list(received.items()) == list(without_metadata(row).items())
    assert [entry["target"] for entry in server.log(marker)] == [f"/echo/{marker}"] * len(ROWS)


@pytest.mark.integration
def test_a_line_that_is_no_object_fails_alone_naming_its_line_never_its_text(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    (tmp_path / "requests.jsonl").write_text(
        json.dumps({**chat("one"), "metadata": 1}) + "\n"
        '["sk-s3cr3t-in-a-list"]\n'
        '"sk-s3cr3t-in-a-string"\n' + json.dumps({**chat("four"), "metadata": 4}) + "\n"
    )
    done = run_cli(
        "requests.jsonl", "--url", f"{server.url}/echo/{marker}", "--row-as-body", "-v",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    results = read_jsonl(tmp_path / "requests-results.jsonl")
    assert [r["ok"] for r in results] == [True, False, False, True]
    assert [r["id"] for r in results] == [1, None, None, 4]
    assert [r["error"] for r in results[1:3]] == [
        "line 2: a record must be a JSON object",
        "line 3: a record must be a JSON object",
    ]
    assert all(r["error_kind"] == "invalid_request" and r["attempts"] == 0 for r in results[1:3])
    assert "s3cr3t" not in done.stderr
    assert "s3cr3t" not in (tmp_path / "requests-results.jsonl").read_text()
    assert len(server.log(marker)) == 2


@pytest.mark.integration
def test_a_key_in_a_body_is_shown_nowhere_but_the_failed_file(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    write_rows(tmp_path / "requests.jsonl", [{"api_key": "sk-s3cr3t-body", "metadata": "m"}])
    done = run_cli(
        "requests.jsonl", "--url", f"{server.url}/status/400?m={marker}", "--row-as-body",
        "-vv", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "s3cr3t" not in done.stderr
    for output in ("results.jsonl", "report.html"):
        assert "s3cr3t" not in (tmp_path / f"requests-{output}").read_text()
    # the failed file holds the request as it was sent, to send it again (the owner's file)
    assert read_jsonl(tmp_path / "requests-failed.jsonl")[0]["json"]["api_key"] == "sk-s3cr3t-body"


@pytest.mark.integration
def test_the_failed_file_is_input_again_and_retry_failed_sends_only_the_failures(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A chat completion that fails once (500) fails its row; the failed file holds the
    request built from it (the body, the method, the metadata as the id), which runs again
    as it is, as does --retry-failed on the same command."""
    marker = key()
    url = f"{server.url}/v1/chat/completions"
    rows = [
        {**chat(f"ok:{marker}"), "metadata": {"n": 0}},
        {**chat(f"500-once:{marker}-a"), "metadata": {"n": 1}},
        {**chat(f"500-once:{marker}-b"), "metadata": {"n": 2}},
    ]
    write_rows(tmp_path / "requests.jsonl", rows)
    given = ["requests.jsonl", "--url", url, "--row-as-body", "--attempts", "1", "--no-report"]
    first = run_cli(*given, cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    failed = read_jsonl(tmp_path / "requests-failed.jsonl")
    assert failed == [
        {"url": url, "method": "POST", "json": without_metadata(row), "id": row["metadata"]}
        for row in rows[1:]
    ]
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "failed.jsonl").write_text(
        (tmp_path / "requests-failed.jsonl").read_text()
    )
    again = run_cli("failed.jsonl", "--no-report", cwd=tmp_path / "again")
    assert again.returncode == 0, again.stderr
    assert [r["id"] for r in read_jsonl(tmp_path / "again" / "failed-results.jsonl")] == [
        {"n": 1},
        {"n": 2},
    ]
    retried = run_cli(*given, "--retry-failed", cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    results = read_jsonl(tmp_path / "requests-results.jsonl")
    assert [r["id"] for r in results] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert all(r["ok"] for r in results)
    assert results[1]["data"]["choices"][0]["message"]["content"] == f"echo: 500-once:{marker}-a"


@pytest.mark.integration
def test_an_interrupted_run_resumes_only_with_the_row_as_body_and_sends_each_row_once(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    rows = [{**chat(f"row {n}"), "metadata": {"row_id": n}} for n in range(40)]
    write_rows(tmp_path / "requests.jsonl", rows)
    url = f"{server.url}/echo/{marker}?delay=0.2"
    process = start_cli(
        "requests.jsonl", "--url", url, "--method", "POST", "--row-as-body", "-c", "2",
        "--no-progress", "--no-report", cwd=tmp_path,
    )  # fmt: skip
    wait_until(lambda: len(server.log(marker)) >= 6)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    done = read_jsonl(tmp_path / "requests-results.jsonl")
    assert 6 <= len(done) < 40
    command = shlex.split(stderr.split("resume with: ", 1)[1].splitlines()[0])
    assert "--row-as-body" in command and "--resume" in command
    sent = len(server.log(marker))
    for other in (
        [a for a in command if a != "--row-as-body"],
        [*command, "--id-field", "model"],
        [a if a != "POST" else "PUT" for a in command],
    ):
        refused = run_cli(*other[3:], cwd=tmp_path)
        assert refused.returncode == 2, (other, refused.stderr)
        assert "its template options were different" in refused.stderr
    assert len(server.log(marker)) == sent  # nothing sent by the refused ones
    resumed = run_cli(*command[3:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    results = read_jsonl(tmp_path / "requests-results.jsonl")
    assert [r["id"] for r in results] == [{"row_id": n} for n in range(40)]
    assert all(r["ok"] for r in results)
    bodies = sorted(json.loads(r["data"]["body"])["messages"][0]["content"] for r in results)
    assert bodies == sorted(f"row {n}" for n in range(40))
    assert len(server.log(marker)) == 40  # each row sent once, over both runs


BAD = [
    (["--body-template", '{"input": "{text}"}'], "--row-as-body sends each row as the body"),
    (["--url", None], "--row-as-body goes with --url"),
    (["--url", "{server}/echo/{marker}/{model}"], "cannot name a field ({model}"),
    (["--input-format", "csv"], "requests.jsonl is read as CSV (its cells are text)"),
    (["--input-format", "tsv"], "is read as TSV"),
]


@pytest.mark.integration
@pytest.mark.parametrize(("args", "message"), BAD)
def test_what_cannot_be_sent_as_the_row_exits_2_before_anything_is_sent_or_written(
    server: MockServerProcess, tmp_path: Path, args: list[str | None], message: str
) -> None:
    marker = key()
    write_rows(tmp_path / "requests.jsonl", [{**chat("x"), "text": "y", "metadata": 1}])
    (tmp_path / "requests-results.jsonl").write_text("earlier\n")
    url = f"{server.url}/echo/{marker}"
    options = {"--url": url}
    for name, value in zip(args[::2], args[1::2], strict=True):
        assert name is not None
        options[name] = (value or "").replace("{server}", server.url).replace("{marker}", marker)
    given = [word for name, value in options.items() if value for word in (name, value)]
    done = run_cli("requests.jsonl", *given, "--row-as-body", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert done.stderr.startswith("Error: ") and len(done.stderr.splitlines()) == 1
    assert (tmp_path / "requests-results.jsonl").read_text() == "earlier\n"
    assert not (tmp_path / "requests-failed.jsonl").exists()
    assert not (tmp_path / "requests-journal.sqlite3").exists()
    assert server.log(marker) == []


def test_help_names_the_option() -> None:
    from click.testing import CliRunner

    from batchsync.cli.command import command

    text = CliRunner().invoke(command, ["--help"], terminal_width=200).output
    assert "--row-as-body" in text
    assert "with --row-as-body: metadata" in text
