"""Threads follow the work (issue 34, row 1): a run starts a worker as it reads an item, never
``concurrency`` of them up front, and ``concurrency`` has an upper bound said in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pydantic
import pytest

from batchsync import Batch, fetch_all, run_all
from batchsync.core import engine
from batchsync.jobs.options import MAX_CONCURRENCY

from .mockserver import MockServerProcess


class CountingPool(ThreadPoolExecutor):
    submitted = 0

    def submit(self, *args: Any, **kwargs: Any) -> Future[Any]:
        type(self).submitted += 1
        return super().submit(*args, **kwargs)


@pytest.mark.parametrize("items", [0, 1, 5])
def test_a_run_starts_no_worker_beyond_the_items_it_read(
    items: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a run submitted ``concurrency`` workers whatever its input."""
    monkeypatch.setattr(engine, "ThreadPoolExecutor", CountingPool)
    monkeypatch.setattr(CountingPool, "submitted", 0)
    results = run_all(str, range(items), concurrency=MAX_CONCURRENCY)
    assert len(results) == items
    assert CountingPool.submitted <= items + 1


def test_the_pool_fills_up_to_the_concurrency_as_items_wait() -> None:
    """Workers still reach ``concurrency`` when every item is in flight at once."""
    concurrency = 16
    barrier = threading.Barrier(concurrency, timeout=30)

    def call(item: int) -> int:
        barrier.wait()  # passes only when `concurrency` items are in progress together
        return item

    results = run_all(call, range(concurrency * 3), concurrency=concurrency)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]


def test_one_url_at_the_largest_concurrency_is_one_request(server: MockServerProcess) -> None:
    path = f"/ok/{uuid.uuid4().hex}"
    results = fetch_all([server.url + path], concurrency=MAX_CONCURRENCY)
    assert results[0].ok and server.count(path) == 1


@pytest.mark.parametrize("make", [fetch_all, Batch])
def test_a_concurrency_past_the_bound_is_a_value_error(make: object) -> None:
    with pytest.raises(ValueError, match="concurrency") as raised:
        if make is Batch:
            Batch(["http://127.0.0.1:9/"], concurrency=MAX_CONCURRENCY + 1)
        else:
            fetch_all(["http://127.0.0.1:9/"], concurrency=MAX_CONCURRENCY + 1)
    assert isinstance(raised.value, ValueError | pydantic.ValidationError)


def test_run_all_refuses_a_concurrency_past_the_bound() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        run_all(str, [1], concurrency=MAX_CONCURRENCY + 1)


def peak_rss_kib(args: list[str], cwd: Path) -> tuple[int, str]:
    """The command's exit status and its own peak RSS (KiB), from the kernel's accounting."""
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsync", *args], cwd=cwd, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    assert process.stderr is not None
    stderr = process.stderr.read()
    process.stderr.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, stderr
    return usage.ru_maxrss, stderr


def test_memory_stays_flat_in_the_concurrency_for_one_line(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A one-line input at the largest concurrency peaks at what it does at 1 (before, the
    10 000 workers submitted up front cost some 9 MB more, 2.7 GB at 100 million)."""
    (tmp_path / "in.txt").write_text(f"{server.url}/ok/{uuid.uuid4().hex}\n")
    peaks = {}
    for concurrency in (1, MAX_CONCURRENCY):
        common = ["in.txt", "--no-progress", "--no-report", "--fresh", "-o", "out"]
        peaks[concurrency], _ = peak_rss_kib([*common, "-c", str(concurrency)], tmp_path)
    assert peaks[MAX_CONCURRENCY] - peaks[1] < 4 * 1024, peaks


def test_the_command_line_says_the_bound_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("http://127.0.0.1:9/\n")
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "in.txt", "-c", str(MAX_CONCURRENCY + 1)],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    assert str(MAX_CONCURRENCY) in error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
