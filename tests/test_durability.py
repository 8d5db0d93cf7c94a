"""Nothing lost, nothing fetched twice: SIGKILL, SIGINT/SIGTERM and --resume, CLI and library."""

from __future__ import annotations

import _thread
import itertools
import json
import logging
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batchsync import Batch, JournalFailed, Result
from batchsync.core.history import Pass
from batchsync.store.journal import JournalReader

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration


def start_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def write_urls(folder: Path, server: MockServerProcess, count: int, delay: float) -> list[str]:
    """``count`` unique URLs answering after ``delay``; returns their server-side targets."""
    key = uuid.uuid4().hex[:8]
    targets = [f"/ok/{key}-{n}?delay={delay}" for n in range(count)]
    (folder / "urls.txt").write_text("".join(f"{server.url}{t}\n" for t in targets))
    return targets


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.02)


def read_until(process: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    """What ``process`` wrote on stderr up to the line holding ``text``."""
    assert process.stderr is not None
    give_up = time.monotonic() + timeout
    lines: list[str] = []
    while not lines or text not in lines[-1]:
        left = give_up - time.monotonic()
        assert left > 0 and select.select([process.stderr], [], [], left)[0], "".join(lines)
        line = process.stderr.readline()
        assert line, "".join(lines)  # the process ended first
        lines.append(line)
    return "".join(lines)


def served(server: MockServerProcess, targets: list[str]) -> list[int]:
    counts: dict[str, int] = server.stats()["counts"]
    return [counts.get(target, 0) for target in targets]


def results_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sigkill_then_resume_refetches_at_most_what_was_in_flight(
    server: MockServerProcess, tmp_path: Path
) -> None:
    targets = write_urls(tmp_path, server, 300, delay=0.05)
    process = start_cli("urls.txt", "-c", "4", "--no-progress", cwd=tmp_path)
    wait_until(lambda: sum(served(server, targets)) >= 100)
    process.kill()
    process.wait(timeout=10)
    assert not (tmp_path / "urls-results.jsonl").exists()
    reader = JournalReader(tmp_path / "urls-journal.sqlite3")
    stored = reader.outstanding(300, Pass())
    reader.close()
    resumed = run_cli("urls.txt", "-c", "4", "--resume", "--no-progress", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    counts = served(server, targets)
    assert min(counts) == 1
    assert all(count == 1 for count, kept in zip(counts, stored, strict=True) if kept)
    # Fetched again: the round of 4 in flight at the kill and, at most, the round of 4 that
    # had just come back and was not committed yet (the writer commits each result as it
    # comes; a round takes the server 50 ms, however fast the machine; a writer a round
    # behind fails this).
    assert sum(count - 1 for count in counts) <= 4 + 4
    results = results_of(tmp_path / "urls-results.jsonl")
    assert [r["index"] for r in results] == list(range(300))
    assert all(r["ok"] for r in results)
    assert "--fresh: replaced" not in resumed.stderr


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM])
def test_first_signal_stops_cleanly_writes_outputs_and_resumes(
    server: MockServerProcess, tmp_path: Path, signal_number: int
) -> None:
    targets = write_urls(tmp_path, server, 120, delay=0.2)
    process = start_cli("urls.txt", "-c", "4", "-o", "run", "--no-progress", cwd=tmp_path)
    wait_until(lambda: sum(served(server, targets)) >= 12)
    sent_at = time.monotonic()
    process.send_signal(signal_number)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - sent_at < 5
    assert process.returncode == 130
    assert "Traceback" not in stderr
    done = results_of(tmp_path / "run-results.jsonl")
    assert 12 <= len(done) < 120
    assert f"Interrupted: {len(done)} of 120 done — resume with: " in stderr
    assert [r["index"] for r in done] == sorted(r["index"] for r in done)
    assert (tmp_path / "run-failed.jsonl").read_text() == ""
    command = stderr.split("resume with: ", 1)[1].splitlines()[0]
    assert command == "python -m batchsync urls.txt -c 4 -o run --no-progress --resume"
    resumed = run_cli(*shlex.split(command)[3:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert served(server, targets) == [1] * 120  # in-flight attempts finished before the stop
    assert [r["index"] for r in results_of(tmp_path / "run-results.jsonl")] == list(range(120))


def test_attempts_still_in_flight_after_the_grace_are_abandoned(
    server: MockServerProcess, tmp_path: Path
) -> None:
    slow = f"/ok/{uuid.uuid4().hex[:8]}?delay=20"
    (tmp_path / "urls.txt").write_text(f"{server.url}/ok/quick\n{server.url}{slow}\n")
    process = start_cli("urls.txt", "--timeout", "60", "--no-progress", cwd=tmp_path)
    wait_until(lambda: server.count(slow) == 1)
    sent_at = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert 2.5 < time.monotonic() - sent_at < 8  # the 3 s grace, then out
    assert process.returncode == 130
    assert "Interrupted: 1 of 2 done" in stderr
    assert len(results_of(tmp_path / "urls-results.jsonl")) == 1


def test_a_second_signal_quits_at_once(server: MockServerProcess, tmp_path: Path) -> None:
    slow = f"/ok/{uuid.uuid4().hex[:8]}?delay=20"
    (tmp_path / "urls.txt").write_text(f"{server.url}{slow}\n")
    process = start_cli("urls.txt", "--timeout", "60", "--no-progress", cwd=tmp_path)
    wait_until(lambda: server.count(slow) == 1)
    process.send_signal(signal.SIGINT)
    # Two signals in a row may reach the handler as one: wait until the first was taken.
    first = read_until(process, "Stopping: letting requests in flight finish")
    sent_at = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - sent_at < 1.5  # not the 3 s grace the first one gave
    assert process.returncode == 130
    assert "Traceback" not in first + stderr


def test_a_second_signal_inside_the_first_handler_quits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPython runs a handler again for a signal that lands while it runs: the one that lands
    just as the first says "Stopping" must find the run stopping, not be taken for a first."""
    from batchsync.cli import signals

    class Run:
        stopped = False

        def stop(self) -> None:
            self.stopped = True

    exits: list[int] = []
    written: list[bytes] = []
    with signals.stop_on_signals() as started:
        started(Run())
        handler = signal.getsignal(signal.SIGINT)
        assert callable(handler)

        def write(fd: int, data: bytes) -> int:
            written.append(data)
            if len(written) == 1:  # the second signal lands right after the first message
                handler(signal.SIGINT, None)
            return len(data)

        monkeypatch.setattr(os, "write", write)
        monkeypatch.setattr(os, "_exit", exits.append)
        handler(signal.SIGINT, None)
    assert exits == [130]
    assert written[1] == b"Interrupted: quitting now\n"


def test_resume_refuses_a_journal_made_for_other_input(
    server: MockServerProcess, tmp_path: Path
) -> None:
    write_urls(tmp_path, server, 3, delay=0)
    assert run_cli("urls.txt", cwd=tmp_path).returncode == 0
    before = (tmp_path / "urls-results.jsonl").read_text()
    targets = write_urls(tmp_path, server, 3, delay=0)
    refused = run_cli("urls.txt", "--resume", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.startswith("Error: urls-journal.sqlite3 was made for other input")
    assert refused.stderr.count("\n") == 1
    assert served(server, targets) == [0, 0, 0]
    assert (tmp_path / "urls-results.jsonl").read_text() == before


def test_a_run_without_resume_is_refused_and_fresh_replaces_the_journal(
    server: MockServerProcess, tmp_path: Path
) -> None:
    targets = write_urls(tmp_path, server, 3, delay=0)
    assert run_cli("urls.txt", cwd=tmp_path).returncode == 0
    refused = run_cli("urls.txt", cwd=tmp_path)
    assert refused.returncode == 2 and "3 of 3 items done, 0 failed" in refused.stderr
    assert served(server, targets) == [1, 1, 1]
    again = run_cli("urls.txt", "--fresh", cwd=tmp_path)
    assert again.returncode == 0
    assert "--fresh: replaced the journal of a run of" in again.stderr
    assert served(server, targets) == [2, 2, 2]


def test_resuming_a_finished_run_fetches_nothing(server: MockServerProcess, tmp_path: Path) -> None:
    targets = write_urls(tmp_path, server, 5, delay=0)
    (tmp_path / "urls.txt").write_text(
        (tmp_path / "urls.txt").read_text() + f"{server.url}/404/{uuid.uuid4().hex}\n"
    )
    first = run_cli("urls.txt", cwd=tmp_path)
    assert first.returncode == 1
    before = (tmp_path / "urls-results.jsonl").read_text()
    again = run_cli("urls.txt", "--resume", cwd=tmp_path)
    assert again.returncode == 1
    assert served(server, targets) == [1] * 5
    assert (tmp_path / "urls-results.jsonl").read_text() == before
    assert len((tmp_path / "urls-failed.jsonl").read_text().splitlines()) == 1


def interrupt_main_after(results: int) -> Callable[[Result], None]:
    """An ``on_result`` hook: KeyboardInterrupt in the main thread, as a kernel interrupt, once
    ``results`` have finished, mid-run however fast the machine (a watcher polling the server
    could see the run end first)."""
    finished = itertools.count(1)

    def hook(result: Result) -> None:
        if next(finished) == results:
            _thread.interrupt_main()

    return hook


def interrupt_main_when(condition: Callable[[], bool]) -> threading.Thread:
    """Raise KeyboardInterrupt in the main thread once ``condition`` holds: a kernel interrupt."""

    def watch() -> None:
        wait_until(condition)
        _thread.interrupt_main()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_batch_keeps_what_finished_on_interrupt_and_continues(
    server: MockServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    key = uuid.uuid4().hex[:8]
    targets = [f"/ok/{key}-{n}?delay=0.1" for n in range(60)]
    batch = Batch(
        [server.url + t for t in targets], concurrency=4, on_result=interrupt_main_after(10)
    )
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="batchsync"), pytest.raises(KeyboardInterrupt):
        batch.run()
    assert time.monotonic() - started < 10
    finished = batch.results
    # The interrupted run is summed up too, as a finished one is.
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch done")] == [
        f"batch done: {finished.summary()}"
    ]
    assert 10 <= len(finished) < 60
    assert batch.pending == 60 - len(finished)
    assert all(r.ok for r in finished)
    assert not [t for t in threading.enumerate() if t.name.startswith("batchsync_")]
    rs = batch.run()
    assert batch.pending == 0
    assert [r.index for r in rs] == list(range(60))
    assert [r.url for r in rs] == [server.url + t for t in targets]
    assert served(server, targets) == [1] * 60


def test_a_batch_whose_journal_fails_keeps_every_answer_it_got(
    server: MockServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A journal that cannot store a Result stops the run, but the answers that came back
    (requests sent, maybe not idempotent) stay in ``results``: the next run must not send
    them again."""
    from batchsync.run import batch as batch_module

    stored = itertools.count(1)
    encode = batch_module.encode_result

    def encode_until_the_disk_fills(result: Result, item: object) -> tuple[str, str | None]:
        if next(stored) >= 3:
            raise OSError("No space left on device")
        return encode(result, item)

    monkeypatch.setattr(batch_module, "encode_result", encode_until_the_disk_fills)
    key = uuid.uuid4().hex[:8]
    targets = [f"/ok/{key}-{n}?delay=0.05" for n in range(40)]
    batch = Batch([server.url + t for t in targets], concurrency=8, journal=tmp_path / "j")
    with pytest.raises(JournalFailed):
        batch.run()
    answered = [n for n, count in enumerate(served(server, targets)) if count]
    assert len(answered) >= 3
    assert [r.index for r in batch.results] == answered


def test_batch_with_a_journal_continues_in_a_new_batch(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:8]
    targets = [f"/ok/{key}-{n}?delay=0.1" for n in range(40)]
    items = [server.url + t for t in targets]
    journal = tmp_path / "run.sqlite3"
    first = Batch(items, concurrency=4, journal=journal, on_result=interrupt_main_after(8))
    with pytest.raises(KeyboardInterrupt):
        first.run()
    finished = len(first.results)
    second = Batch(items, concurrency=4, journal=journal)  # e.g. after a kernel restart
    assert len(second.results) == finished
    assert second.results[0].to_dict() == first.results[0].to_dict()  # times kept to the µs
    rs = second.run()
    assert len(rs) == 40 and all(r.ok for r in rs)
    assert served(server, targets) == [1] * 40
    with pytest.raises(ValueError, match="made for other items"):
        Batch([*items, server.url + "/ok/extra"], journal=journal)


def test_the_console_script_handles_sigint_in_a_process_group(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """Ctrl-C in a terminal reaches the whole process group; the run still ends cleanly."""
    targets = write_urls(tmp_path, server, 40, delay=0.2)
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsync", "urls.txt", "-c", "2", "--no-progress"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    wait_until(lambda: sum(served(server, targets)) >= 4)
    os.killpg(process.pid, signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "resume with: python -m batchsync urls.txt -c 2 --no-progress --resume" in stderr


def test_an_interrupt_cuts_slow_requests_and_leaves_no_thread_behind(
    server: MockServerProcess,
) -> None:
    slow = f"/ok/{uuid.uuid4().hex[:8]}?delay=30"
    quick = f"{server.url}/ok/{uuid.uuid4().hex[:8]}"
    batch = Batch([server.url + slow, quick], timeout=60, hedge_after=5)
    interrupt_main_when(lambda: server.count(slow) == 1)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        batch.run()
    assert time.monotonic() - started < 6  # the 3 s grace, then the request is cut
    assert [r.url for r in batch.results] == [quick]
    assert batch.pending == 1
    assert not [t.name for t in threading.enumerate() if t.name.startswith("batchsync")]
