"""``make demo`` as a newcomer runs it: the bundled list and table against the mock server, the
docs' samples of its output, and the command it says to try next.

The demo runs once, against a mock server of this module's own (``--server``), into a folder
of its own (``--out``), with ``--check-docs``: the samples in docs/getting-started.md must be
its output, seconds, rates and the order of different items' log lines aside (scripts/demo.py
says how it normalises them). When the demo's output changes on purpose, ``python
scripts/demo.py --write-docs`` writes the samples again.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .mockserver import ROOT, MockServerProcess, start_mock_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def demo_server() -> Iterator[MockServerProcess]:
    """A server for the demo alone: its 429 answers once per path, its quota is per family."""
    server = start_mock_server()
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


@pytest.fixture(scope="module")
def demo(
    demo_server: MockServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> subprocess.CompletedProcess[str]:
    out = tmp_path_factory.mktemp("demo") / "demo-out"
    return subprocess.run(
        [sys.executable, "scripts/demo.py", "--server", demo_server.url, "--out", str(out),
         "--check-docs"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_demo_shows_each_outcome_and_the_failed_file(
    demo: subprocess.CompletedProcess[str],
) -> None:
    out = demo.stdout
    assert "7 items: 4 ok, 3 failed (invalid_body 1, status 2); 10 requests" in out
    assert "HTTP 503 after 3 attempts" in out
    assert "body is not JSON" in out
    assert "retry " in out and "HTTP 429" in out
    failed_section = out.split("batch-failed.jsonl   #", 1)[1].split("\n\n")[0].splitlines()[1:]
    assert [line.split("/")[3] for line in failed_section] == ["404", "503", "broken-json"]
    # the second run: a row per customer, every page of each, under the announced quota
    orders = out.split("# A CSV of customers", 1)[1]
    assert "6 items: 6 ok, 0 failed; 13 requests" in orders and "quota " in orders
    rows = [line.split() for line in orders.splitlines() if line.startswith("c-")]
    assert [(row[0], row[2], row[3]) for row in rows] == [
        ("c-1001", "3", "5"), ("c-1002", "1", "2"), ("c-1003", "4", "7"),
        ("c-1004", "2", "4"), ("c-1005", "1", "0"), ("c-1006", "2", "3"),
    ]  # fmt: skip


def test_the_docs_samples_are_the_demos_output(demo: subprocess.CompletedProcess[str]) -> None:
    assert (
        demo.returncode == 0
        and "docs/getting-started.md: the samples are this run's" in demo.stderr
    ), (
        f"{demo.stderr}\nthe samples in docs/getting-started.md differ from the demo's output "
        "(above): `python scripts/demo.py --write-docs` writes them again"
    )


def test_the_command_the_demo_ends_with_runs_as_printed(
    demo: subprocess.CompletedProcess[str], demo_server: MockServerProcess
) -> None:
    """The demo's last words: the mock server (here still running) and a command to type, with
    the demo's own Python, not whichever ``python`` comes first on the PATH."""
    hint = demo.stdout.rstrip().split("\n\n")[-1].splitlines()
    mock, typed = shlex.split(hint[-3].removeprefix("#")), shlex.split(hint[-1].removeprefix("$"))
    assert is_this_python(mock[0]) and is_this_python(typed[0])
    assert mock[1:] == ["-m", "batchsync.mock", "--port", demo_server.url.rsplit(":", 1)[1]]
    assert typed[1:3] == ["-m", "batchsync"] and "--retry-failed" in typed
    again = subprocess.run(typed, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 1, again.stderr  # (1: some failed, as the mock server has them)
    assert "7 items: 4 ok, 3 failed (invalid_body 1, status 2)" in again.stderr


def is_this_python(shown: str) -> bool:
    """The demo shows its Python relative to the repository when it is inside (.venv/bin/python)."""
    return (ROOT / shown).resolve() == Path(sys.executable).resolve()
