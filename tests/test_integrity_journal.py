"""No result is ever lost: whatever the journal cannot store fails the run loudly.

Lone surrogates, ids JSON cannot hold, a full disk, a second run on the same prefix, a
foreign or older journal, an unwritable folder, a writer slower than the results.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import batchsync.store.journal.writer as journal_module
from batchsync import Batch
from batchsync.core.history import Pass
from batchsync.core.records import dumps
from batchsync.core.result import Result
from batchsync.run.batch import Item
from batchsync.store.journal import Journal, JournalReader
from batchsync.store.journal.schema import SCHEMA

from .mockserver import MockServerProcess

IDENTITY = {"entries": "3", "sha256": "abc"}


def encode(result: Result, item: object) -> tuple[str, str | None]:
    return json.dumps(result.to_dict()), None


def run_cli(
    *args: str, cwd: Path, prefix: tuple[str, ...] = (), **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "batchsync", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False, **kwargs,
    )  # fmt: skip


def key() -> str:
    return uuid.uuid4().hex[:10]


def lines_of(path: Path) -> list[dict[str, Any]]:
    # Strict UTF-8: a lone surrogate written raw would not even decode.
    return [json.loads(line) for line in path.read_bytes().decode("utf-8").splitlines()]


# --- lone surrogates ---------------------------------------------------------------------


def test_dumps_escapes_what_utf8_cannot_encode_and_keeps_the_rest() -> None:
    value = {"name": "\ud800", "city": "Zürich"}
    text = dumps(value)
    text.encode("utf-8")  # would raise UnicodeEncodeError on the raw surrogate
    assert json.loads(text) == value
    assert dumps({"city": "Zürich"}) == '{"city":"Zürich"}'


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_dumps_writes_strict_json_for_nan_and_infinity() -> None:
    value = {"id": float("nan"), "data": [1.5, float("inf"), {"low": -float("inf")}]}
    assert strict_json(dumps(value)) == {"id": None, "data": [1.5, None, {"low": None}]}
    assert strict_json(dumps({"name": "\ud800", "x": float("nan")})) == {
        "name": "\ud800",
        "x": None,
    }


@pytest.mark.integration
def test_output_files_hold_strict_json_for_a_nan_id(
    server: MockServerProcess, tmp_path: Path
) -> None:
    lines = [f"{server.url}/ok/{key()}", f'{{"url": "{server.url}/404/{key()}", "id": NaN}}']
    (tmp_path / "urls.txt").write_text("\n".join(lines) + "\n")
    done = run_cli("urls.txt", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    results = [
        strict_json(line) for line in (tmp_path / "urls-results.jsonl").read_text().splitlines()
    ]
    assert [r["index"] for r in results] == [0, 1]
    failed = (tmp_path / "urls-failed.jsonl").read_text().splitlines()
    assert [strict_json(line)["id"] for line in failed] == [None]


@pytest.mark.integration
def test_surrogates_in_bodies_and_ids_keep_every_result(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    lines = [
        f"{server.url}/surrogate",
        # the ids as JSON escapes, as another program would write them
        f'{{"url": "{server.url}/ok/{marker}-id", "id": "\\ud800"}}',
        f'{{"url": "{server.url}/404/{marker}", "id": "\\udfff"}}',
        *(f"{server.url}/ok/{marker}-{n}" for n in range(5)),
    ]
    (tmp_path / "urls.txt").write_text("\n".join(lines) + "\n")
    done = run_cli("urls.txt", "-c", "4", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # the 404, and nothing else
    assert "8 items: 7 ok, 1 failed" in done.stderr
    results = lines_of(tmp_path / "urls-results.jsonl")
    assert [r["index"] for r in results] == list(range(8))
    assert results[0]["data"] == {"name": "\ud800"}
    assert results[1]["id"] == "\ud800" and results[1]["ok"]
    assert lines_of(tmp_path / "urls-failed.jsonl") == [json.loads(lines[2])]


@pytest.mark.integration
def test_a_batch_journals_an_id_with_a_lone_surrogate(
    server: MockServerProcess, tmp_path: Path
) -> None:
    items: list[Item] = [
        f"{server.url}/ok/{key()}",
        {"url": f"{server.url}/ok/{key()}", "id": "\ud800"},
    ]
    journal = tmp_path / "run.sqlite3"
    Batch(items, journal=journal).run()
    again = Batch(items, journal=journal)
    assert again.pending == 0
    assert again.results[1].id == "\ud800"


# --- the writer fails loudly, never quietly -----------------------------------------------


def test_any_writer_failure_fails_later_adds_and_close(tmp_path: Path) -> None:
    def broken(result: Result, item: object) -> tuple[str, str | None]:
        raise RuntimeError("cannot encode this")

    journal = Journal(tmp_path / "j.sqlite3", broken, IDENTITY)
    journal.add(Result(0, "u0", True), None)
    journal._writer.join(timeout=10)
    with pytest.raises(OSError, match="cannot be written: cannot encode this"):
        journal.add(Result(1, "u1", True), None)
    with pytest.raises(OSError, match="cannot be written: cannot encode this"):
        journal.close()


def test_the_queue_is_bounded_so_workers_wait_for_a_slow_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "QUEUE_ROWS", 50, raising=False)

    def slow(result: Result, item: object) -> tuple[str, str | None]:
        time.sleep(0.001)  # a writer slower than the results
        return encode(result, item)

    journal = Journal(tmp_path / "j.sqlite3", slow, IDENTITY)
    peak = 0

    def add_every_fourth(start: int) -> None:
        nonlocal peak
        for index in range(start, 800, 4):
            journal.add(Result(index, f"u{index}", True), None)
            peak = max(peak, journal._queue.qsize())

    threads = [threading.Thread(target=add_every_fourth, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    journal.close()
    assert peak <= 50
    reader = JournalReader(tmp_path / "j.sqlite3")
    assert sum(reader.outstanding(800, Pass())) == 800
    reader.close()


def test_a_dead_writer_does_not_hold_workers_on_a_full_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "QUEUE_ROWS", 5, raising=False)

    def dies(result: Result, item: object) -> tuple[str, str | None]:
        time.sleep(0.2)  # long enough for the queue to fill up first
        raise MemoryError

    journal = Journal(tmp_path / "j.sqlite3", dies, IDENTITY)
    raised: list[BaseException] = []

    def add_many() -> None:
        try:
            for index in range(200):
                journal.add(Result(index, f"u{index}", True), None)
        except OSError as exc:
            raised.append(exc)

    worker = threading.Thread(target=add_many, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "a worker is stuck on the full queue of a dead writer"
    assert raised and "cannot be written: MemoryError" in str(raised[0])
    with pytest.raises(OSError, match="cannot be written"):
        journal.close()


def ignore_sigxfsz_and_limit_files(size: int) -> Any:
    """A child whose files cannot grow past ``size`` bytes: writes fail as on a full disk."""

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    return limit


@pytest.mark.integration
def test_a_journal_that_cannot_be_written_exits_3_and_replaces_no_output(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    (tmp_path / "urls.txt").write_text(
        "".join(f"{server.url}/ok/{marker}-{n}?delay=0.01\n" for n in range(300))
    )
    for name in ("urls-results.jsonl", "urls-failed.jsonl"):
        (tmp_path / name).write_text("earlier run\n")
    done = run_cli(
        "urls.txt", "-c", "4", "--fresh", cwd=tmp_path,
        preexec_fn=ignore_sigxfsz_and_limit_files(128 * 1024),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("Error: the journal urls-journal.sqlite3 cannot be written: ")
    assert "rerun with --resume" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    for name in ("urls-results.jsonl", "urls-failed.jsonl"):
        assert (tmp_path / name).read_text() == "earlier run\n"


@pytest.mark.integration
def test_output_files_that_cannot_be_written_exit_3_and_replace_neither(
    server: MockServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "urls.txt").write_text(f"{server.url}/ok/{key()}\n")
    (tmp_path / "urls-results.jsonl").mkdir()  # cannot be replaced by a file
    (tmp_path / "urls-failed.jsonl").write_text("earlier run\n")
    done = run_cli("urls.txt", "--fresh", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("Error: ") and "rerun with --resume" in done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "urls-failed.jsonl").read_text() == "earlier run\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.integration
def test_a_run_whose_journal_misses_results_exits_3(
    server: MockServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "urls.txt").write_text("".join(f"{server.url}/ok/{key()}\n" for _ in range(3)))
    (tmp_path / "urls-results.jsonl").write_text("earlier run\n")
    # A fetch that delivers nothing (a bug, a lost result): the outputs must not claim success.
    script = (
        "import sys, batchsync.run.plan as plan\n"
        "from batchsync.run.assembly import Ran\n"
        "plan.fetch = lambda *args, **kwargs: Ran(False, False, {}, 0)\n"
        "from batchsync.cli import main\n"
        "main(sys.argv[1:])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, "urls.txt", "--fresh"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "holds 0 results for 3 items" in done.stderr
    assert (tmp_path / "urls-results.jsonl").read_text() == "earlier run\n"


# --- ids a journal cannot store -------------------------------------------------------------


@pytest.mark.parametrize("bad_id", [datetime.date(2024, 1, 2), float("nan")])
def test_a_batch_refuses_an_id_json_cannot_store(tmp_path: Path, bad_id: object) -> None:
    items: list[Item] = ["http://127.0.0.1:9/a", {"url": "http://127.0.0.1:9/b", "id": bad_id}]
    with pytest.raises(ValueError, match="item 1: its id"):
        Batch(items, journal=tmp_path / "run.sqlite3")
    Batch(items)  # without a journal, nothing has to store it


# --- one run per journal ----------------------------------------------------------------------


class HeldServer:
    """Answers each GET with ``{}`` only once released, and counts them by path: a run holds
    its journal for as long as the test wants, however slow the machine."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.counts: Counter[str] = Counter()
        lock = threading.Lock()
        held = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with lock:
                    held.counts[self.path] += 1
                held.released.wait(120)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def sent(self, paths: list[str]) -> list[int]:
        return [self.counts[path] for path in paths]

    def close(self) -> None:
        self.released.set()
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def held() -> Iterator[HeldServer]:
    server = HeldServer()
    yield server
    server.close()


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.02)


@pytest.mark.integration
def test_a_second_run_on_the_same_prefix_exits_2_and_leaves_the_first_alone(
    held: HeldServer, tmp_path: Path
) -> None:
    paths = [f"/ok/{n}" for n in range(5)]
    (tmp_path / "urls.txt").write_text("".join(held.url + path + "\n" for path in paths))
    first = subprocess.Popen(
        [sys.executable, "-m", "batchsync", "urls.txt", "-c", "5", "--timeout", "60",
         "--no-progress"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: sum(held.sent(paths)) == 5)  # the first run is under way
        second = run_cli("urls.txt", "-c", "5", cwd=tmp_path)
        assert second.returncode == 2, second.stderr
        assert second.stderr == "Error: the output prefix urls is in use by another run\n"
        held.released.set()
        _, stderr = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, stderr
    assert held.sent(paths) == [1] * 5  # the second sent nothing
    assert len(lines_of(tmp_path / "urls-results.jsonl")) == 5


@pytest.mark.integration
def test_a_batch_refuses_a_journal_in_use(held: HeldServer, tmp_path: Path) -> None:
    paths = [f"/ok/{n}" for n in range(4)]
    items = [held.url + path for path in paths]
    journal = tmp_path / "run.sqlite3"
    first = Batch(items, concurrency=4, timeout=60, journal=journal)
    running = threading.Thread(target=first.run)
    running.start()
    try:
        wait_until(lambda: sum(held.sent(paths)) == 4)  # the first run is under way
        with pytest.raises(ValueError, match="in use by another run"):
            Batch(items, journal=journal)
    finally:
        held.released.set()
        running.join(timeout=60)
    assert len(first.results) == 4
    assert held.sent(paths) == [1] * 4
    assert Batch(items, journal=journal).pending == 0  # free again once the run ended


# --- journals that are not ours, folders we cannot write ----------------------------------


def foreign_file(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE notes (body TEXT)")
    db.execute("INSERT INTO notes VALUES ('someone else''s data')")
    db.commit()
    db.close()


def older_journal(path: Path, urls: bytes) -> None:
    """A journal as batchsync wrote it before the schema row: same identity as ``urls``."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    identity = {"entries": str(len(urls.splitlines())), "sha256": hashlib.sha256(urls).hexdigest()}
    db.executemany("INSERT INTO meta VALUES (?, ?)", identity.items())
    db.commit()
    db.close()


ALIEN = "only a batchsync journal is replaced: move it away, or give another path"
OLDER = "run with --fresh to start over"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("garbage", "cannot be read as a batchsync journal (file is not a database): " + ALIEN),
        ("foreign", "is not a batchsync journal: " + ALIEN),
        ("older", "was made by an older batchsync (or is not a batchsync journal): " + OLDER),
    ],
)
def test_resume_refuses_a_journal_that_is_not_ours_and_leaves_it_untouched(
    fresh_server: MockServerProcess, tmp_path: Path, kind: str, message: str
) -> None:
    urls = f"{fresh_server.url}/ok/{key()}\n".encode()
    (tmp_path / "urls.txt").write_bytes(urls)
    path = tmp_path / "urls-journal.sqlite3"
    if kind == "garbage":
        path.write_bytes(b"not a database at all\n" * 300)
    elif kind == "foreign":
        foreign_file(path)
    else:
        older_journal(path, urls)
    before = path.read_bytes()
    done = run_cli("urls.txt", "--resume", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (f"Error: urls-journal.sqlite3 {message}\n")
    assert path.read_bytes() == before
    assert fresh_server.stats()["requests"] == 0
    assert not (tmp_path / "urls-results.jsonl").exists()
    # --fresh replaces a journal of another batchsync, never a file that is no journal.
    fresh = run_cli("urls.txt", "--fresh", cwd=tmp_path)
    if kind == "older":
        assert fresh.returncode == 0, fresh.stderr
    else:
        assert fresh.returncode == 2 and ALIEN in fresh.stderr, fresh.stderr
        assert path.read_bytes() == before
        assert fresh_server.stats()["requests"] == 0


def without_root_powers() -> tuple[str, ...]:
    """A command prefix under which folder permissions apply, even to root."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permissions would not apply")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


@pytest.mark.integration
def test_an_output_folder_that_cannot_be_written_exits_2_before_anything_is_sent(
    fresh_server: MockServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "urls.txt").write_text(f"{fresh_server.url}/ok/{key()}\n")
    folder = tmp_path / "out"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        done = run_cli("urls.txt", "-o", "out/run", cwd=tmp_path, prefix=without_root_powers())
    finally:
        folder.chmod(0o755)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "Error: cannot write in the output folder out: Permission denied\n"
    assert fresh_server.stats()["requests"] == 0
    assert list(folder.iterdir()) == []


@pytest.mark.integration
def test_an_input_whose_name_is_not_utf8_is_journaled_and_resumed(
    server: MockServerProcess, tmp_path: Path
) -> None:
    name = os.fsdecode(b"urls-\xff.txt")  # a name Linux allows; Python holds \xff as a surrogate
    (tmp_path / name).write_text(f"{server.url}/ok/{key()}\n")
    done = run_cli(name, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(lines_of(tmp_path / (os.fsdecode(b"urls-\xff") + "-results.jsonl"))) == 1
    again = run_cli(name, "--resume", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "--fresh: replaced" not in again.stderr
