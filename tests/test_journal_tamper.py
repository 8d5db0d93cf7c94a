"""A journal is a file anyone with the owner's rights can edit: each row is checked before a
run trusts it (issue 26). A next page keeps the item's origin, an index lies within the
input, a record is one line; otherwise the run is refused (exit 2, nothing sent) or, for a
next page, the item starts over from its first page."""

from __future__ import annotations

import contextlib
import json
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchsync import Batch
from batchsync.journal import JournalUnusable

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args], check=False, cwd=cwd, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip


def tamper(journal: Path, statement: str, *args: object) -> None:
    with contextlib.closing(sqlite3.connect(journal)) as db, db:
        assert db.execute(statement, args).rowcount == 1


@contextlib.contextmanager
def listener() -> Iterator[socket.socket]:
    """A port on 127.0.0.1 that takes connections and answers none."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


def connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_a_next_page_moved_to_another_origin_is_not_taken_up(
    server: MockServerProcess, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{server.url}/pages/page?total=10&size=3&fail=3&fail_times=1&tag={tag}"
    (tmp_path / "in.txt").write_text(url + "\n")
    options = ["in.txt", "--paginate", "page:page", "--items", "items", "-o", "out", "-q",
               "-H", "X-Secret: cnry-header", "--timeout", "2"]  # fmt: skip
    first = run_cli(*options, "--attempts", "1", cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    journal = tmp_path / "out-journal.sqlite3"
    with listener() as elsewhere:
        port = elsewhere.getsockname()[1]
        moved = f"http://127.0.0.1:{port}/pages/page?total=10&size=3&page=3&tag={tag}"
        tamper(journal, "UPDATE results SET resume = json_set(resume, '$.url', ?)", moved)
        again = run_cli(*options, "--resume", cwd=tmp_path)
        assert not connected(elsewhere)  # (the item's -H header never went there)
    assert again.returncode == 0, again.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "out-results.jsonl").open()]
    assert [item["n"] for item in record["data"]] == list(range(10))  # (from its first page)


@pytest.fixture
def finished(server: MockServerProcess, tmp_path: Path) -> Path:
    """A finished run of three items; its journal."""
    urls = [f"{server.url}/ok/{uuid.uuid4().hex[:8]}" for _ in range(3)]
    (tmp_path / "in.txt").write_text("\n".join(urls) + "\n")
    done = run_cli("in.txt", "-o", "out", "-q", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "out-journal.sqlite3"


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ("UPDATE results SET idx = -1 WHERE idx = 2", "item -1 is not in the input"),
        ("UPDATE results SET idx = 7 WHERE idx = 2", "item 7 is not in the input"),
        (
            "UPDATE results SET record = replace(record, ',', ',' || char(10)) WHERE idx = 1",
            "the record of item 1 is not one line",
        ),
        (  # (rows swapped: each record says which item it is)
            "UPDATE results SET record = json_set(record, '$.index', 0) WHERE idx = 1",
            "the record of item 1 is not that item's",
        ),
    ],
)
def test_a_tampered_row_is_refused_before_anything_is_sent(
    finished: Path, statement: str, problem: str
) -> None:
    tamper(finished, statement)
    before = {p.name: p.read_bytes() for p in finished.parent.iterdir()}
    done = run_cli("in.txt", "-o", "out", "--resume", cwd=finished.parent)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: ") and len(done.stderr.splitlines()) == 1
    assert problem in done.stderr
    assert {p.name: p.read_bytes() for p in finished.parent.iterdir()} == before


def test_a_batch_refuses_a_row_out_of_range(server: MockServerProcess, tmp_path: Path) -> None:
    urls = [f"{server.url}/ok/{uuid.uuid4().hex[:8]}" for _ in range(2)]
    journal = tmp_path / "j.sqlite3"
    Batch(urls, journal=journal, progress=False).run()
    tamper(journal, "UPDATE results SET idx = -1 WHERE idx = 1")
    with pytest.raises(JournalUnusable, match="item -1 is not in the input"):
        Batch(urls, journal=journal, progress=False)


def test_a_batch_does_not_take_up_a_moved_next_page(
    server: MockServerProcess, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = f"{server.url}/pages/page?total=10&size=3&fail=3&fail_times=1&tag={tag}"
    journal = tmp_path / "j.sqlite3"

    def batch(attempts: int) -> Batch:
        return Batch(
            [url], journal=journal, attempts=attempts, headers={"X-Secret": "cnry"},
            paginate="page:page", page_items="items", timeout=2, progress=False,
        )  # fmt: skip

    assert not batch(1).run()[0].ok
    with listener() as elsewhere:
        moved = f"http://127.0.0.1:{elsewhere.getsockname()[1]}/pages/page?page=3&tag={tag}"
        tamper(journal, "UPDATE results SET resume = json_set(resume, '$.url', ?)", moved)
        again = batch(3).run()
        assert not connected(elsewhere)
    assert [item["n"] for item in again[0].data] == list(range(10))
