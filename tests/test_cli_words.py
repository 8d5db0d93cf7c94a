"""The command line's words: --help in sections, the error lines that say the fix, the resume
line that names the environment variable a secret came from."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import click
import pytest

from batchsync.cli import main
from batchsync.cli.command import command
from batchsync.cli.options import HELP_SECTIONS, long_name, resume_command
from batchsync.core.redact import Secrets
from batchsync.core.result import Result, added_to
from batchsync.store.journal.checks import mismatch

from .mockserver import MockServerProcess
from .test_cli import batchsync, key, read_jsonl


def run(*args: str) -> tuple[int, str, str]:
    """``main`` run in this process: its exit status, standard output and standard error."""
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        pytest.raises(SystemExit) as exited,
    ):
        main(list(args))
    assert isinstance(exited.value.code, int)
    return exited.value.code, out.getvalue(), err.getvalue()


def _options() -> list[click.Option]:
    context = click.Context(command, **command.context_settings)
    return [p for p in command.get_params(context) if isinstance(p, click.Option)]


def test_every_option_is_in_exactly_one_section_of_the_help() -> None:
    listed = Counter(name for names in HELP_SECTIONS.values() for name in names)
    assert [name for name, times in listed.items() if times > 1] == []
    # (in that order the command gives them, so that the reference docs/cli.md generates
    # lists them as --help does)
    assert [long_name(option) for option in _options()] == list(listed)


def test_the_help_lists_input_output_resume_and_limits_first() -> None:
    code, out, _ = run("--help")
    assert code == 0
    titles = [line[:-1] for line in out.splitlines() if line.endswith(":") and line[0] != " "]
    assert titles[:4] == ["Input", "Output", "Resume and retry", "Limits"]
    assert titles == list(HELP_SECTIONS)
    lines = out.splitlines()

    def at(flag: str) -> int:
        return next(n for n, line in enumerate(lines) if line.lstrip().startswith(flag))

    assert at("--url") < at("-o, --output") < at("--resume") < at("-c, --concurrency")
    assert at("--resume") < 80  # (it was line 246, after the template and batch options)
    assert at("-c, --concurrency") < at("--batch-api") < at("-h, --help")


def test_the_cli_pages_options_table_has_the_sections_of_the_help() -> None:
    """docs/cli.md's short table, "## Options", in --help's sections: each row under the
    section of the option it names first."""
    text = (Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    table = text.split("\n## Options\n", 1)[1].split("\n## ", 1)[0]
    blocks = table.split("\n### ")[1:]
    assert [block.split("\n", 1)[0] for block in blocks] == list(HELP_SECTIONS)
    for block in blocks:
        title, rows = block.split("\n", 1)
        for row in (line for line in rows.splitlines() if line.startswith("| `-")):
            named = re.search(r"--[a-z][a-z-]*", row.split(" | ")[0])
            assert named is not None and named[0] in HELP_SECTIONS[title], (title, row)


@pytest.mark.parametrize(
    ("args", "meant"),
    [
        (("rows.jsonl", "--batch-api", "openai"), "--batch-api=openai"),
        (("--batch-api", "anthropic", "rows.jsonl"), "--batch-api=anthropic"),
        (("urls.txt", "--retry-failed", "status,timeout"), "--retry-failed=status,timeout"),
    ],
)
def test_an_optional_value_given_apart_is_told_to_go_after_an_equals_sign(
    args: tuple[str, ...], meant: str
) -> None:
    code, _, err = run(*args)
    assert code == 2
    assert err.count("\n") == 1, err
    assert err.startswith("Error: Got unexpected extra argument")
    assert f"did you mean {meant}?" in err


def test_an_extra_argument_that_is_no_value_of_the_option_before_it_has_no_hint() -> None:
    code, _, err = run("urls.txt", "--batch-api", "other.txt")
    assert code == 2
    assert "did you mean" not in err


def test_the_journals_mismatch_is_told_in_plain_words() -> None:
    identity = {"input": "urls.txt", "size": "10", "sha256": "abc", "entries": "3"}
    assert mismatch(identity, {**identity, "entries": "1"}) == (
        "its input had 3 entries, this one has 1 entry"
    )
    assert mismatch(identity, {**identity, "sha256": "def"}) == (
        "its input's SHA-256 was abc, this one's is def"
    )


@pytest.mark.parametrize("option", ["--timeout", "--budget", "--deadline", "--poll"])
def test_seconds_with_a_unit_are_refused_saying_the_form_they_take(option: str) -> None:
    code, _, err = run("urls.txt", option, "5s")
    assert code == 2
    assert err == (
        f"Error: Invalid value for '{option}': expected seconds as a plain number, e.g. 5 or "
        "2.5; got '5s'\n"
    )


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("--concurrency", "5x", "'-c' / '--concurrency'"),
        ("--attempts", "2.5", "'--attempts'"),
        ("--partition-size", "1k", "'--partition-size'"),
    ],
)
def test_a_count_that_is_no_whole_number_is_refused_saying_the_form_it_takes(
    option: str, value: str, named: str
) -> None:
    code, _, err = run("urls.txt", option, value)
    assert code == 2
    assert err == (
        f"Error: Invalid value for {named}: expected a whole number, e.g. 5 or 20; got {value!r}\n"
    )


def test_a_count_out_of_its_range_is_still_told_its_range() -> None:
    code, _, err = run("urls.txt", "--concurrency", "0")
    assert code == 2 and "0 is not in the range 1<=x<=" in err


def test_a_result_sent_again_counts_its_attempts_in_all_in_its_error() -> None:
    earlier = Result(0, "http://h.test/", False, attempts=3, error="HTTP 503 after 3 attempts")
    later = Result(0, "http://h.test/", False, attempts=3, error="HTTP 503 after 3 attempts")
    added = added_to(earlier, later)
    assert added.attempts == 6
    assert added.error == "HTTP 503 after 3 attempts; 6 attempts in all"
    never_sent = Result(0, "http://h.test/", False, error="deadline")
    assert added_to(never_sent, later).error == "HTTP 503 after 3 attempts"


@pytest.mark.integration
def test_a_retry_pass_error_agrees_with_the_attempts_field(
    server: MockServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "urls.txt").write_text(f"{server.url}/503/{key()}\n")
    first = batchsync("urls.txt", "--attempts", "2", "--no-progress", "--no-report", cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    [result] = read_jsonl(tmp_path / "urls-results.jsonl")
    assert (result["attempts"], result["error"]) == (2, "HTTP 503 after 2 attempts")
    again = batchsync(
        "urls.txt", "--retry-failed", "--attempts", "2", "--no-progress", "--no-report",
        cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 1, again.stderr
    [result] = read_jsonl(tmp_path / "urls-results.jsonl")
    assert result["attempts"] == 4
    assert result["error"] == "HTTP 503 after 2 attempts; 4 attempts in all"


def test_the_resume_line_names_the_variable_a_header_came_from(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    token, whole = f"tok{uuid.uuid4().hex}", f"key{uuid.uuid4().hex}"
    monkeypatch.setenv("WORDS_TOKEN", token)
    monkeypatch.setenv("WORDS_KEY", whole)
    argv = ["u.txt", "-H", f"Authorization: Bearer {token}", f"--header=X-Key: {whole}"]
    resume = resume_command(argv, Secrets(), command.params)
    assert resume.line == (
        'python -m batchsync u.txt -H "Authorization: Bearer ${WORDS_TOKEN}" '
        '--header "X-Key: ${WORDS_KEY}" --resume'
    )
    assert resume.hint is None
    # Run by a shell, the line gives back the headers as they were.
    printed = subprocess.run(
        ["sh", "-c", f"printf '%s\\n' {resume.line.removeprefix('python ')}"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert f"Authorization: Bearer {token}" in printed
    assert f"X-Key: {whole}" in printed


def test_only_an_auth_scheme_is_shown_before_a_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    ident, secret = f"id{uuid.uuid4().hex}", f"key{uuid.uuid4().hex}"
    monkeypatch.setenv("WORDS_SECRET", secret)
    argv = ["u.txt", "-H", f"X-Creds: {ident} {secret}"]  # (a first word that is no scheme)
    resume = resume_command(argv, Secrets(), command.params)
    assert ident not in resume.line
    assert "-H 'X-Creds: ***'" in resume.line


def test_a_header_given_literally_is_masked_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORDS_SHORT", "abc")  # (too short to be taken for a secret's source)
    argv = ["u.txt", "-vH", "X-Api-Key: literal-secret-value", "-H", "X-Short: abc"]
    resume = resume_command(argv, Secrets(), command.params)
    assert "literal-secret-value" not in resume.line
    assert "-H 'X-Api-Key: ***'" in resume.line
    assert "-H 'X-Short: ***'" in resume.line
    assert resume.hint is not None
    assert 'from an environment variable, e.g. -H "Authorization: Bearer $TOKEN"' in resume.hint


@pytest.mark.integration
def test_an_interrupted_run_names_the_variable_and_never_the_secret(
    server: MockServerProcess, tmp_path: Path
) -> None:
    from .test_secrets import batchsync_cli

    canary, literal, k = f"cnryenv{uuid.uuid4().hex}", f"cnrylit{uuid.uuid4().hex}", key()
    urls = [f"{server.url}/ok/{k}-{n}?delay=0.3" for n in range(40)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    os.environ["WORDS_RUN_TOKEN"] = canary
    try:
        process = batchsync_cli(
            "urls.txt", "-c", "1", "-H", f"Authorization: Bearer {canary}",
            "-H", f"X-Api-Key: {literal}", cwd=tmp_path,
        )  # fmt: skip
    finally:
        del os.environ["WORDS_RUN_TOKEN"]
    give_up = time.monotonic() + 30
    while server.stats()["counts"].get(f"/ok/{k}-1?delay=0.3", 0) == 0:
        assert time.monotonic() < give_up
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 130, stderr
    line = stderr.split("resume with: ", 1)[1].splitlines()[0]
    words = shlex.split(line)
    assert "Authorization: Bearer ${WORDS_RUN_TOKEN}" in words, line
    assert "X-Api-Key: ***" in words
    assert "(-H values are shown as ***: type them again; or give them from" in stderr
    written = b"".join(path.read_bytes() for path in tmp_path.rglob("*") if path.is_file())
    for secret in (canary, literal):
        assert secret not in stdout + stderr
        assert secret.encode() not in written
