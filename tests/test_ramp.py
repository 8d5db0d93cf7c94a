"""Workers follow the work on every entry point (issue 45, item 4): a first run, a resume after
an interrupt, a retry pass and ``Batch.run()`` again start threads only while their items can
move. A worker waiting in line at a rate starts no other; before, each worker started the
next as it claimed an item, so a run whose items waited at a limit grew to the concurrency (a
resume at ``-c 10000`` reached 9 139 threads, its attempts timed out and the breaker opened).
And enough of them: a rate against slow answers, or hosts' slots with the items grouped by
host, keep as many workers as the limits let work.
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
from collections.abc import Callable
from pathlib import Path

import pytest

from batchsync import Batch, fetch_all, run_all

from .mockserver import MockServerProcess, start_mock_server

pytestmark = pytest.mark.integration

COUNT, RATE, DELAY = 1_500, 400, 0.1
# The most threads a run may have: the workers the rate keeps busy (RATE x DELAY in flight, a
# few in line) and the run's own (the main thread, the watchdog, the journal's writer).
MOST_THREADS = int(RATE * DELAY) + 40


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
    args: list[str], cwd: Path, *, interrupt_when: Callable[[], bool] | None = None
) -> tuple[int, str, int]:
    """The CLI run with ``args``: its exit code, stderr and peak thread count; interrupted
    (SIGINT) once ``interrupt_when`` says so."""
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    threads = PeakThreads(process.pid)
    if interrupt_when is not None:
        deadline = time.monotonic() + 60
        while not interrupt_when() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr, threads.stop()


def test_a_run_its_resume_and_its_retry_pass_keep_to_the_workers_their_items_can_use(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """Every tenth URL fails at once (a 503), the rest are answered after DELAY, at RATE a
    second and ``-c 10000`` (no breaker: an open circuit holds its host's items together,
    each on a worker, as a cooldown does)."""
    marker = uuid.uuid4().hex[:8]
    urls = [
        f"{server.url}/503/{marker}-{n}" if n % 10 == 0
        else f"{server.url}/slow/{marker}-{n}?delay={DELAY}"
        for n in range(COUNT)
    ]  # fmt: skip
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    options = ["-c", "10000", "--rate", str(RATE), "--attempts", "1", "--breaker", "off"]
    options.append("--no-progress")
    # Interrupted once some items were sent (not by the clock: a loaded machine may take a
    # while to start Python, and a run stopped before it sends has no resume line to print).
    code, stderr, first = run_watched(
        ["urls.txt", *options], tmp_path, interrupt_when=lambda: len(server.log(marker)) >= 300
    )
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
    batch = Batch(urls, journal=tmp_path / "j.sqlite3", concurrency=10_000, rate=RATE)
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


def test_a_rate_against_slow_calls_keeps_as_many_calls_going_as_it_allows() -> None:
    """200 a second against calls of 0.5 s: about 100 at once (the workers that waited in
    line for the pace once started none, and the pool grew by one a round trip)."""
    in_flight, peak = [0], [0]
    lock = threading.Lock()

    def call(item: int) -> int:
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.5)
        with lock:
            in_flight[0] -= 1
        return item

    results = run_all(call, range(600), concurrency=256, rate="200/s")
    assert len(results.ok) == 600
    assert peak[0] >= 60, peak[0]


def test_slots_of_hosts_whose_items_come_grouped_are_used_together(tmp_path: Path) -> None:
    """``per_host=1`` over two hosts, every item of the first before the second's: both hosts
    busy at once (a worker waiting for the first's slot once started none, so the second's
    items waited for the first's to be claimed)."""
    first, second = start_mock_server(), start_mock_server()
    try:
        marker = uuid.uuid4().hex[:8]
        urls = [f"{first.url}/slow/{marker}-a{n}?delay=0.1" for n in range(15)]
        urls += [f"{second.url}/slow/{marker}-b{n}?delay=0.1" for n in range(15)]
        results = fetch_all(urls, concurrency=256, per_host=1)
        assert len(results.ok) == len(urls)
        a, b = first.log(marker), second.log(marker)
        assert min(entry["t"] for entry in b) < sorted(entry["end"] for entry in a)[4]
    finally:
        for server in (first, second):
            server.process.terminate()
            server.process.wait(timeout=10)
