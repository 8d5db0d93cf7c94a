"""INPUT that is not a regular file (a pipe, /dev/stdin, a named FIFO) and INPUT that changes
while the run goes: read once, or refused by name; never an empty run that says it is done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from .mockserver import MockServerProcess
from .test_cli import batchsync, key, read_jsonl

pytestmark = pytest.mark.integration


def five(server: MockServerProcess) -> list[str]:
    return [f"{server.url}/ok/{key()}" for _ in range(5)]


def shell(script: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash (for process substitution), ``$PY`` the test's Python."""
    env = {**os.environ, "PY": sys.executable, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=env, check=False,
    )  # fmt: skip


def test_a_process_substitution_is_read_once(server: MockServerProcess, tmp_path: Path) -> None:
    urls = five(server)
    (tmp_path / "five.txt").write_text("\n".join(urls) + "\n")
    done = shell('"$PY" -m batchsync <(cat five.txt)', tmp_path)
    assert done.returncode == 0, done.stderr
    assert "5 items: 5 ok" in done.stderr
    # Named like stdin's: a /dev/fd number says nothing of what the run was.
    assert [r["url"] for r in read_jsonl(tmp_path / "batch-results.jsonl")] == urls


def test_dev_stdin_is_read_once(server: MockServerProcess, tmp_path: Path) -> None:
    urls = five(server)
    done = batchsync("/dev/stdin", cwd=tmp_path, stdin="\n".join(urls) + "\n")
    assert done.returncode == 0, done.stderr
    assert "5 items: 5 ok" in done.stderr
    assert [r["url"] for r in read_jsonl(tmp_path / "batch-results.jsonl")] == urls


def test_a_table_from_a_pipe_is_read_once(server: MockServerProcess, tmp_path: Path) -> None:
    names = [key() for _ in range(5)]
    table = "name\n" + "".join(f"{name}\n" for name in names)
    template = f"{server.url}/ok/{{name}}"
    by_csv = batchsync(
        "/dev/stdin", "--url", template, "--input-format", "csv", "-o", "csv", cwd=tmp_path,
        stdin=table,
    )  # fmt: skip
    assert by_csv.returncode == 0, by_csv.stderr
    records = "".join(f'{{"name": "{name}"}}\n' for name in names)
    by_jsonl = batchsync(
        "/dev/stdin", "--url", template, "-o", "jsonl", cwd=tmp_path, stdin=records
    )
    assert by_jsonl.returncode == 0, by_jsonl.stderr
    for prefix in ("csv", "jsonl"):
        results = read_jsonl(tmp_path / f"{prefix}-results.jsonl")
        assert [r["url"] for r in results] == [f"{server.url}/ok/{name}" for name in names]


def test_a_named_fifo_is_read_like_a_pipe(server: MockServerProcess, tmp_path: Path) -> None:
    urls = five(server)
    fifo = tmp_path / "items.fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with fifo.open("w") as writer:  # (waits for the run to open it)
            writer.write("\n".join(urls) + "\n")

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        done = batchsync(str(fifo), "-o", "fifo", cwd=tmp_path, timeout=30)
    finally:  # (a run that never opened the FIFO leaves the feeder waiting: let it go)
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        feeder.join(timeout=5)
    assert done.returncode == 0, done.stderr
    assert [r["url"] for r in read_jsonl(tmp_path / "fifo-results.jsonl")] == urls


def test_lines_appended_while_the_run_goes_are_not_its_items(
    server: MockServerProcess, tmp_path: Path
) -> None:
    first = f"/ok/{key()}"
    urls = [f"{server.url}{first}?delay=1", *(f"{server.url}/ok/{key()}" for _ in range(3))]
    extra = [f"{server.url}/ok/{key()}" for _ in range(3)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")

    def append_once_it_runs() -> None:
        deadline = time.monotonic() + 30
        while server.count(f"{first}?delay=1") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        with (tmp_path / "urls.txt").open("a") as more:
            more.write("\n".join(extra) + "\n")

    appender = threading.Thread(target=append_once_it_runs, daemon=True)
    appender.start()
    done = batchsync("urls.txt", "-c", "1", cwd=tmp_path)
    appender.join(timeout=30)
    assert "Traceback" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert "4 items: 4 ok" in done.stderr
    assert [r["url"] for r in read_jsonl(tmp_path / "urls-results.jsonl")] == urls
    assert all(server.count(url.removeprefix(server.url)) == 0 for url in extra)


def test_lines_removed_while_the_run_goes_exit_2_naming_the_change(
    server: MockServerProcess, tmp_path: Path
) -> None:
    first = f"/ok/{key()}"
    # (more than the reader holds ahead of the run: the cut is seen)
    urls = [f"{server.url}{first}?delay=1", *(f"{server.url}/ok/{key()}" for _ in range(1999))]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")

    def cut_once_it_runs() -> None:
        deadline = time.monotonic() + 30
        while server.count(f"{first}?delay=1") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        (tmp_path / "urls.txt").write_text(urls[0] + "\n")

    cutter = threading.Thread(target=cut_once_it_runs, daemon=True)
    cutter.start()
    done = batchsync("urls.txt", "-c", "1", cwd=tmp_path)
    cutter.join(timeout=30)
    assert done.returncode == 2, done.stderr
    assert "urls.txt changed while the run went: it had 2000 items" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_lines_appended_during_a_retry_are_not_its_items(
    server: MockServerProcess, tmp_path: Path
) -> None:
    slow = [f"/ok/{key()}?delay=1" for _ in range(2)]
    urls = [*(server.url + path for path in slow), *(f"{server.url}/ok/{key()}" for _ in range(2))]
    extra = [f"{server.url}/ok/{key()}" for _ in range(3)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    first = batchsync("urls.txt", "--attempts", "1", "--timeout", "0.3", cwd=tmp_path)
    assert first.returncode == 1, first.stderr

    def append_once_it_retries() -> None:
        deadline = time.monotonic() + 30
        while server.count(slow[0]) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        with (tmp_path / "urls.txt").open("a") as more:
            more.write("\n".join(extra) + "\n")

    appender = threading.Thread(target=append_once_it_retries, daemon=True)
    appender.start()
    done = batchsync("urls.txt", "-c", "1", "--retry-failed", cwd=tmp_path)
    appender.join(timeout=30)
    assert "Traceback" not in done.stderr
    assert done.returncode == 0, done.stderr
    assert [r["url"] for r in read_jsonl(tmp_path / "urls-results.jsonl")] == urls
    assert all(server.count(url.removeprefix(server.url)) == 0 for url in extra)


def dead_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_temporary_files_a_killed_run_left_are_removed(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A run killed while it writes its outputs leaves its temporary files; the next run on
    the prefix removes them, and only them (a live writer's, another prefix's stay)."""
    (tmp_path / "urls.txt").write_text(f"{server.url}/ok/{key()}\n")
    dead, alive = dead_pid(), os.getpid()
    stale = [
        f".urls-{name}.{dead}.0a1b2c3d.tmp"
        for name in ("results.jsonl", "results.csv", "results.parquet", "failed.jsonl",
                     "report.html")
    ]  # fmt: skip
    kept = [
        f".urls-results.jsonl.{alive}.0a1b2c3d.tmp",  # (a process that is still running)
        f".other-results.jsonl.{dead}.0a1b2c3d.tmp",  # (another prefix)
        f".urls-results.jsonl.{dead}.tmp",  # (not a name atomic_files gives)
    ]
    for name in stale + kept:
        (tmp_path / name).write_text("partial")
    done = batchsync("urls.txt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.glob(".*.tmp")) == sorted(kept)


def test_the_resume_line_of_a_pipe_reads_the_same_input_on_stdin(
    server: MockServerProcess, tmp_path: Path
) -> None:
    urls = [f"{server.url}/ok/{key()}?delay=0.3" for _ in range(30)]
    (tmp_path / "slow.txt").write_text("\n".join(urls) + "\n")
    process = subprocess.Popen(
        ["bash", "-c", '"$PY" -m batchsync <(cat slow.txt) -c 1 --no-progress'],
        cwd=tmp_path, env={**os.environ, "PY": sys.executable},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while server.count(urls[2].removeprefix(server.url)) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(process.pid, signal.SIGINT)  # (to bash and batchsync, as Ctrl-C does)
    _, stderr = process.communicate(timeout=30)
    line = stderr.split("resume with: ", 1)[1].splitlines()[0]
    assert line == (
        "python -m batchsync - -c 1 --no-progress --resume (the same input on standard input)"
    )
    resumed = batchsync("-", "--resume", cwd=tmp_path, stdin="\n".join(urls) + "\n")
    assert resumed.returncode == 0, resumed.stderr
    assert [r["url"] for r in read_jsonl(tmp_path / "batch-results.jsonl")] == urls
