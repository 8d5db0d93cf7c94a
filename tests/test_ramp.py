"""Workers follow the work on every entry point (issue 45, item 4): a first run, a resume after
an interrupt, a retry pass and ``Batch.run()`` again start threads only while their items can
move. A worker held at a limit starts no other; before, each worker started the next as it
claimed an item, so a run whose items waited at a limit grew to the concurrency (a resume at
``-c 10000`` reached 9 139 threads, its attempts timed out and the breaker opened).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from batchsync import Batch

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration

COUNT, PER_HOST, DELAY = 2_000, 50, 0.1
# The most threads a run may have: workers for the host's slots and a few more, and its own
# (the main thread, the watchdog, the journal's writer, the signal watcher).
MOST_THREADS = PER_HOST + 30


class PeakThreads:
    """The most threads a process had, read from /proc every 20 ms while it runs."""

    def __init__(self, pid: int) -> None:
        self.peak = 0
        self._pid = pid
        self._done = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._done.wait(0.02):
            try:
                status = Path(f"/proc/{self._pid}/status").read_text()
            except OSError:
                return
            self.peak = max(self.peak, int(re.search(r"Threads:\s+(\d+)", status)[1]))  # type: ignore[index]

    def stop(self) -> int:
        self._done.set()
        self._watcher.join()
        return self.peak


def run_watched(
    args: list[str], cwd: Path, *, interrupt_after: float | None = None
) -> tuple[int, str, int]:
    """The CLI run with ``args``: its exit code, stderr and peak thread count."""
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    threads = PeakThreads(process.pid)
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr, threads.stop()


def test_a_run_its_resume_and_its_retry_pass_keep_to_the_workers_their_items_can_use(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """Every tenth URL fails at once (a 503), the rest are answered after DELAY; the host held
    to PER_HOST at a time, at ``-c 10000`` (no breaker: an open circuit holds its host's items
    together, each on a worker, as a cooldown does)."""
    marker = uuid.uuid4().hex[:8]
    urls = [
        f"{server.url}/503/{marker}-{n}" if n % 10 == 0
        else f"{server.url}/slow/{marker}-{n}?delay={DELAY}"
        for n in range(COUNT)
    ]  # fmt: skip
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    options = ["-c", "10000", "--per-host", str(PER_HOST), "--attempts", "1", "--breaker", "off"]
    options.append("--no-progress")
    code, stderr, first = run_watched(["urls.txt", *options], tmp_path, interrupt_after=1.5)
    assert code == 130, stderr
    resume_line = next(line for line in stderr.splitlines() if "--resume" in line)
    command = shlex.split(resume_line[resume_line.index("python") :])
    assert command[:3] == ["python", "-m", "batchsync"] and "--resume" in command
    code, stderr, resumed = run_watched([*command[3:], *options], tmp_path)
    assert code == 1, stderr  # (the 503s)
    results = [
        json.loads(line) for line in (tmp_path / "urls-results.jsonl").read_text().splitlines()
    ]
    assert [result["index"] for result in results] == list(range(COUNT))
    assert [not result["ok"] for result in results] == [n % 10 == 0 for n in range(COUNT)]
    code, stderr, retried = run_watched(
        ["urls.txt", "--retry-failed", "--resume", *options], tmp_path
    )
    assert code == 1 and " items: " in stderr, stderr
    assert max(first, resumed, retried) <= MOST_THREADS, (first, resumed, retried)


def test_batch_run_again_after_a_broken_off_stream_keeps_to_the_workers_its_items_can_use(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex[:8]
    urls = [f"{server.url}/slow/{marker}-{n}?delay={DELAY}" for n in range(600)]
    batch = Batch(urls, journal=tmp_path / "j.sqlite3", concurrency=10_000, per_host=PER_HOST)
    before = threading.active_count()
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], threading.active_count())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with batch.stream() as results:
            for n, _ in enumerate(results):
                if n == 100:
                    break
        again = batch.run()
    finally:
        done.set()
        watcher.join()
    assert len(again.ok) == len(urls)
    assert peak[0] - before <= MOST_THREADS, peak[0] - before
