"""Every command-line option that takes a value, fed its type's boundaries and garbage (issue
34): the exit status is 0, 1 or 2, never a traceback; a refusal (2) is one ``Error:`` line
(click's ``Usage:``/``Try`` lines around it are fine) that shows no secret, and nothing is
written. Options whose value names a number, an address, a URL or a command refuse what
cannot be one before anything starts.

The matrix runs in this process (a process each would take minutes) on a one-line input
whose URL is a closed port on 127.0.0.1: nothing leaves the machine, nothing waits long."""

from __future__ import annotations

import contextlib
import io
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from batchsync import fetch_all
from batchsync.cli.command import _metrics_server, command

CLOSED = "http://127.0.0.1:1/x"
# An input line that is an item (its url) and a table row ({id}) alike.
INPUT = f'{{"url": "{CLOSED}", "id": 1}}\n'
BASE = ("--attempts", "1", "--timeout", "2", "--budget", "1", "--no-progress", "--no-report")

VALUES = {
    "empty": "",
    "blank": " ",
    "word": "abc",
    "minus-one": "-1",
    "zero": "0",
    "400-digits": "9" * 400,
    "1e400": "1e400",
    "1e308": "1e308",
    "1e-400": "1e-400",
    "nan": "nan",
    "inf": "inf",
    "-inf": "-inf",
    "99999": "99999",
    "nul": "a\x00b",
    "newline": "a\nb",
    "surrogate": "\udcff",  # (what an argv byte that is not UTF-8 becomes)
}
# Values that no option reading a number may take.
NOT_A_NUMBER = {"empty", "blank", "word", "1e400", "1e-400", "nan", "inf", "-inf", "nul"}
NOT_A_NUMBER |= {"newline", "surrogate"}
NOT_A_NAME = {"empty", "blank", "nul", "newline", "surrogate"}

# What an option needs beside it for its value to be read at all (not refused for lacking
# the option it goes with).
COMPANIONS = {
    "--method": ("--url", "http://127.0.0.1:1/{id}"),
    "--body-template": ("--url", "http://127.0.0.1:1/{id}"),
    "--id-field": ("--url", "http://127.0.0.1:1/{id}"),
    "--input-format": ("--url", "http://127.0.0.1:1/{id}"),
    "--items": ("--paginate", "link"),
    "--max-pages": ("--paginate", "link"),
    "--cursor-param": ("--paginate", "json:next"),
    "--auth-header": ("--auth-command", "echo Bearer t"),
}

# The options that take their value only after an = (given bare, they stand for a default).
EQUALS_ONLY = ("--retry-failed", "--batch-api")

# Values of the option's own that sit on its boundaries.
OWN = {
    "--metrics-port": {"65536": "65536", "host-zero": "127.0.0.1:0", "colon": ":"},
    "--breaker": {"nan-reset": "0.5:10:5:nan", "inf-reset": "0.5:10:5:inf", "window-0": "0.5:0"},
    "--retry-failed": {"comma": ",", "blank-kinds": " , "},
    "--retry-statuses": {"none": "none", "comma": ","},
    "--output": {"folder": "out/", "here": ".", "blank-name": "out/ "},
    "--dask": {"scheme-only": "tcp://", "no-host": "tcp://:8786", "port-0": "scheduler:0"},
}

# Values each option must refuse (exit 2); the rest may run. Numbers' types are read off
# the options themselves (see ``_refused``).
REFUSED: dict[str, set[str]] = {
    "--metrics-port": {*VALUES, *OWN["--metrics-port"]},
    "--dask": {*VALUES, *OWN["--dask"]},
    "--redis": set(VALUES),
    "--auth-command": set(VALUES),  # (garbage as a command fails: exit 2, before sending)
    "--retry-failed": {*VALUES, *OWN["--retry-failed"]},
    "--batch-api": set(VALUES),
    "--retry-statuses": {*VALUES, "comma"},
    "--output": {"empty", "blank", "nul", "newline", "blank-name"},
    "--hedge-after": set(VALUES) - {"99999"},
    "--auth-header": NOT_A_NAME,
    "--secret-header": NOT_A_NAME,
    "--header": set(VALUES),
    "--breaker": {*VALUES, *OWN["--breaker"]},
}


def _long_name(option: click.Option) -> str:
    return max(option.opts, key=len)


def _valued_options() -> list[click.Option]:
    return [
        param
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag and not param.count
    ]


def _cases() -> Iterator[Any]:
    for option in _valued_options():
        name = _long_name(option)
        for label, value in {**VALUES, **OWN.get(name, {})}.items():
            yield pytest.param(name, label, value, id=f"{name}={label}")


def _refused(name: str, label: str) -> bool:
    """Whether ``name`` must refuse the value ``label`` stands for."""
    option = next(o for o in _valued_options() if _long_name(o) == name)
    kind = option.type
    numeric = isinstance(kind, click.types.FloatParamType | click.types.IntParamType)
    if numeric and label in NOT_A_NUMBER:
        return True
    if isinstance(kind, click.types.FloatParamType) and label in ("400-digits", "1e308"):
        return True  # (infinity; more seconds than a thread can wait)
    if isinstance(kind, click.IntRange | click.FloatRange) and label in ("minus-one", "zero"):
        number, least = float(VALUES[label]), kind.min
        return least is not None and (number < least or (kind.min_open and number == least))
    return label in REFUSED.get(name, set())


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """The batchsync logger as it was (each run adds its handler)."""
    logger = logging.getLogger("batchsync")
    handlers, level = list(logger.handlers), logger.level
    try:
        yield
    finally:
        logger.handlers[:], logger.level = handlers, level


def run(folder: Path, *args: str) -> tuple[int, str]:
    """The command line run in this process in ``folder``: its exit status and standard error
    (-1 and the traceback when it raised)."""
    from batchsync.cli import main

    err = io.StringIO()
    try:
        with (
            _logging_kept(),
            contextlib.redirect_stderr(err),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            main(["in.txt", "-o", "out/run", *BASE, *args])
    except SystemExit as exc:  # (main always exits with a number)
        return exc.code if isinstance(exc.code, int) else -2, err.getvalue()
    except BaseException:
        return -1, "Traceback (in process)\n" + traceback.format_exc()
    return -3, err.getvalue()


def error_lines(stderr: str) -> list[str]:
    """What stderr says beside click's Usage and Try lines."""
    return [
        line
        for line in stderr.splitlines()
        if line.strip() and not line.startswith(("Usage:", "Try "))
    ]


def written(folder: Path) -> list[str]:
    """Every file in ``folder`` but the input (folders may be made)."""
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.is_file() and path.name != "in.txt"
    )


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "in.txt").write_text(INPUT)
    monkeypatch.chdir(tmp_path)  # (-o values are relative to it)
    return tmp_path


@pytest.mark.parametrize(("name", "label", "value"), list(_cases()))
def test_a_bad_option_value_is_one_line_and_nothing_written(
    folder: Path, name: str, label: str, value: str
) -> None:
    word = [f"{name}={value}"] if name in EQUALS_ONLY else [name, value]
    code, stderr = run(folder, *COMPANIONS.get(name, ()), *word)
    assert code in (0, 1, 2), stderr
    assert "Traceback" not in stderr
    if _refused(name, label):
        assert code == 2, stderr
    if code == 2:
        lines = error_lines(stderr)
        assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
        assert written(folder) == [], stderr


def test_every_option_that_takes_a_value_is_in_the_matrix() -> None:
    """A new option is fed the same values: the matrix is read off the command."""
    names = {_long_name(option) for option in _valued_options()}
    assert {"--metrics-port", "--output", "--retry-failed", "--redis", "--dask"} <= names
    assert set(COMPANIONS) | set(OWN) | set(REFUSED) <= names


SECRET = "s3kr1t"


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(("-H", f"X-Key: {SECRET[:3]}\n{SECRET[3:]}"), id="header-value-newline"),
        pytest.param(("-H", f"X-Key: {SECRET}\x00"), id="header-value-nul"),
        pytest.param(("-H", f"a\x00b: {SECRET}"), id="header-name-nul"),
        pytest.param(("-H", SECRET), id="header-no-colon"),
        pytest.param(("--auth-command", f"echo {SECRET}; exit 3"), id="auth-command-fails"),
        pytest.param(("--auth-command", f"{SECRET}\x00"), id="auth-command-nul"),
        pytest.param(("--redis", f"redis://:{SECRET}@127.0.0.1:1/0"), id="redis-closed"),
        pytest.param(("--redis", f"http://u:{SECRET}@127.0.0.1:1/"), id="redis-scheme"),
        pytest.param(("--redis", f"redis://:{SECRET}@[::1/0"), id="redis-unreadable"),
        pytest.param(
            ("--redis", f"redis://:{SECRET[:3]}\n{SECRET[3:]}@127.0.0.1:1/0"), id="redis-newline"
        ),
    ],
)
def test_a_refused_value_that_may_be_a_secret_is_not_shown(
    folder: Path, args: tuple[str, str]
) -> None:
    code, stderr = run(folder, *args)
    assert code == 2, stderr
    assert len(error_lines(stderr)) == 1, stderr
    assert SECRET[:3] not in stderr and SECRET[3:] not in stderr


@pytest.mark.parametrize("value", ["0", "99999", "65536", "127.0.0.1:0", "abc", "1.5", "::"])
def test_a_metrics_port_out_of_range_is_refused_when_parsed(folder: Path, value: str) -> None:
    """Before the run: no output folder made, no server started (99999 was an OverflowError
    from bind, 0 a port nobody was told of)."""
    code, stderr = run(folder, "--metrics-port", value)
    assert code == 2, stderr
    assert error_lines(stderr) == [
        "Error: Invalid value for '--metrics-port': expected [HOST:]PORT, PORT a number from 1 "
        "to 65535"
    ]
    assert not (folder / "out").exists()


def test_what_binding_the_metrics_port_raises_is_a_usage_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")

    def overflows(port: int, **kwargs: object) -> None:
        raise OverflowError("bind(): port must be 0-65535.")

    monkeypatch.setattr(prometheus_client, "start_http_server", overflows)
    refused = pytest.raises(click.UsageError, match=r"^cannot serve metrics on 9100: bind\(\)")
    with refused, _metrics_server("9100"):
        pass


@pytest.mark.parametrize("value", ["", " ", "out/ ", "a\nb", "a\x00b"])
def test_an_output_prefix_that_names_no_file_is_refused(folder: Path, value: str) -> None:
    """-o '' wrote files named -results.jsonl; nothing is written now."""
    code, stderr = run(folder, "-o", value)
    assert code == 2, stderr
    assert error_lines(stderr) == [
        "Error: Invalid value for '-o' / '--output': expected a prefix such as out/urls, or a "
        "folder such as out/ (not empty or blank, no control character)"
    ]
    assert written(folder) == []


@pytest.mark.parametrize(
    ("value", "prefix"), [("out/", "out/in"), ("out/.", "out/in"), (".", "in")]
)
def test_an_output_folder_holds_the_files_under_the_default_name(
    folder: Path, value: str, prefix: str
) -> None:
    code, stderr = run(folder, "-o", value)
    assert code == 1, stderr
    assert f"results: {prefix}-results.jsonl" in stderr
    assert (folder / f"{prefix}-results.jsonl").exists()
    assert not list(folder.rglob("-*"))


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_retry_failed_with_an_empty_list_of_kinds_is_refused(folder: Path, value: str) -> None:
    """--retry-failed= (an unset shell variable's kinds) was taken for every failure."""
    assert run(folder)[0] == 1
    before = (folder / "out/run-results.jsonl").read_bytes()
    code, stderr = run(folder, f"--retry-failed={value}")
    assert code == 2, stderr
    assert error_lines(stderr) == [
        "Error: Invalid value for '--retry-failed': names no error kind: give =KIND,... or "
        "--retry-failed alone for every failure"
    ]
    assert (folder / "out/run-results.jsonl").read_bytes() == before
    assert run(folder, "--retry-failed")[0] == 1  # (bare: every failure, sent again)


@pytest.mark.parametrize("value", ["", " ", "tcp://", "tcp://:8786", "scheduler:0", "abc"])
def test_a_dask_address_that_cannot_be_one_is_refused_before_a_client_is_made(
    folder: Path, value: str
) -> None:
    """(A client made for tcp:// started work and hung 20 s in its finalizer.)"""
    code, stderr = run(folder, "--dask", value)
    assert code == 2, stderr
    assert error_lines(stderr)[0].startswith("Error: Invalid value for '--dask': expected")


@pytest.mark.parametrize(
    "name", ["--timeout", "--budget", "--deadline", "--lease-ttl", "--hedge-after"]
)
@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "9" * 400, "1e308", "1e10"])
def test_seconds_are_finite_and_fit_a_timer(folder: Path, name: str, value: str) -> None:
    """click's FloatRange lets nan through (it fails every comparison) and, without a
    maximum, infinity; 1e308 s overflowed every attempt's timer (an OverflowError Result; a
    traceback from a hedge's wait)."""
    code, stderr = run(folder, name, value)
    assert code == 2, stderr
    (line,) = error_lines(stderr)
    assert line.startswith(f"Error: Invalid value for '{name}': "), stderr


@pytest.mark.parametrize(
    "setting",
    [
        {"timeout": 1e308},
        {"budget": 1e10},
        {"deadline": float("inf")},
        {"hedge_after": 1e10},
        {"lease_ttl": float("nan")},
    ],
    ids=str,
)
def test_the_library_takes_seconds_that_fit_a_timer_only(setting: dict[str, float]) -> None:
    """Before, ``timeout=1e308`` ended every item as an OverflowError from its timer."""
    with pytest.raises(ValueError, match=next(iter(setting))):
        fetch_all(["http://127.0.0.1:9/"], **setting)  # type: ignore[arg-type]
