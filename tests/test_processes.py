"""``--processes N|auto`` (``processes=``): worker processes on one machine, each a fixed share
of every limit, one journal written by this process, nothing lost when a worker is killed."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests

from batchsync import fetch_all, run_all
from batchsync.jobs.flags import processes_text
from batchsync.jobs.options import CallOptions, FetchOptions
from batchsync.limits.rates import Rate, parse_rate
from batchsync.limits.shares import process_count, split, split_rate, split_token_rate
from batchsync.limits.tokenrate import TokenRate
from batchsync.run.processes import process_options

from .mockserver import MockServerProcess, busiest_second, in_flight_peak
from .test_durability import run_cli, write_urls

# --- the shares: pure ---


@pytest.mark.parametrize(
    ("total", "parts", "shares"),
    [(256, 3, [86, 85, 85]), (256, 2, [128, 128]), (10, 4, [3, 3, 2, 2]), (1, 1, [1])],
)
def test_a_whole_limit_is_cut_into_shares_that_sum_to_it(
    total: int, parts: int, shares: list[int]
) -> None:
    assert split(total, parts) == shares
    assert sum(split(total, parts)) == total


def test_a_rate_is_cut_into_whole_counts_of_its_period_or_equal_fractions() -> None:
    assert split_rate(parse_rate("100/s"), 3) == [Rate(34, 1), Rate(33, 1), Rate(33, 1)]
    assert split_rate(parse_rate("500/min"), 2) == [Rate(250, 60)] * 2
    # Not whole: equal fractions of at least one each, summing to it.
    assert sum(share.count for share in split_rate(parse_rate("2.5/s"), 2)) == 2.5


def test_a_token_budget_keeps_its_side_in_each_share() -> None:
    shares = split_token_rate(TokenRate.of("90000/min", "output"), 2)
    assert [(share.rate, share.side) for share in shares] == [(Rate(45000, 60), "output")] * 2


def test_the_process_count_is_what_every_limit_can_give_one_of_to_each() -> None:
    assert process_count(4, limits=[256], cpus=2) == 4
    assert process_count("auto", limits=[256], cpus=3) == 3
    # Each process needs a slot of its own: fewer processes, never a share of none.
    assert process_count(4, limits=[2], cpus=8) == 2
    assert process_count(4, limits=[256, 3], cpus=8) == 3
    # A rate of 1/s over two processes would let each send its first at once: two in a second.
    assert process_count(2, limits=[256, 1.0], cpus=2) == 1
    assert process_count(4, limits=[256, 2.5], cpus=8) == 2
    with pytest.raises(ValueError, match="at least 1"):
        process_count(0, limits=[4], cpus=2)


def test_a_small_rate_runs_in_one_process_and_is_never_overdrawn() -> None:
    assert len(process_options(FetchOptions(processes=2, rate="1/s"))) == 1
    shares = process_options(FetchOptions(processes=2, rate="2.5/s"))
    assert [parse_rate(share.rate).count for share in shares if share.rate] == [1.25, 1.25]
    with pytest.raises(ValueError, match="one each"):
        split_rate(Rate(1, 1), 2)


def test_each_process_gets_a_share_of_every_limit_and_together_they_hold_it() -> None:
    options = FetchOptions(
        processes=3, concurrency=256, rate="100/s", per_host=10, token_rate="9000/min"
    )
    shares = process_options(options)
    assert [s.concurrency for s in shares] == [86, 85, 85]
    assert [s.per_host for s in shares] == [4, 3, 3]
    assert sum(parse_rate(s.rate).count for s in shares if s.rate is not None) == 100
    assert sum(s.token_rate.rate.count for s in shares if s.token_rate is not None) == 9000
    assert all(s.processes == 1 for s in shares)


def test_a_shared_backend_holds_the_limits_whole_and_only_the_threads_are_cut() -> None:
    options = FetchOptions(
        processes=2, concurrency=10, rate="100/s", per_host=1, limits="redis://127.0.0.1:1/0"
    )
    shares = process_options(options)
    assert [(s.concurrency, s.rate, s.per_host) for s in shares] == [(5, "100/s", 1)] * 2


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"on_result": print}, "on_result"),
        ({"rate": "auto"}, "rate='auto'"),
        ({"max_cost": 1, "prices": {"models": {"m": {"input": 1, "output": 1}}}}, "max_cost"),
        ({"session": lambda: requests.Session()}, "session"),  # noqa: PLW0108
    ],
)
def test_what_processes_cannot_hold_is_refused_before_anything_is_sent(
    given: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        fetch_all(["http://127.0.0.1:9/never"], processes=2, **given)


def test_a_function_no_worker_process_can_import_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot be sent to the worker processes"):
        run_all(lambda item: item, [1, 2], processes=2)


def test_one_process_is_todays_path() -> None:
    options = CallOptions(processes=1)
    assert process_options(options) == [options]


# --- the library ---


def doubled(item: int) -> int:
    """Called in a worker process (imported there by name)."""
    return item * 2 + os.getpid() * 0


def pid_of(item: int) -> int:
    return os.getpid()


@pytest.mark.integration
def test_run_all_calls_each_item_once_in_worker_processes_in_input_order() -> None:
    results = run_all(pid_of, list(range(400)), processes=2, concurrency=8)
    assert [r.index for r in results] == list(range(400))
    assert all(r.ok for r in results)
    pids = Counter(r.data for r in results)
    assert os.getpid() not in pids
    assert len(pids) == 2  # (sent from two processes, neither this one)
    assert [r.data for r in run_all(doubled, [1, 2, 3], processes=2)] == [2, 4, 6]


@pytest.mark.integration
def test_fetch_all_from_worker_processes_is_fetch_all(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex[:8]
    urls = [f"{server.url}/ok/{marker}-{n}" for n in range(300)]
    results = fetch_all(urls, processes=2, concurrency=8, journal=tmp_path / "j.sqlite3")
    assert [r.url for r in results] == urls
    assert all(r.ok for r in results)
    counts = server.stats()["counts"]
    assert [counts.get(f"/ok/{marker}-{n}", 0) for n in range(300)] == [1] * 300


# --- the command line ---


def cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def served(server: MockServerProcess, targets: list[str]) -> list[int]:
    counts: dict[str, int] = server.stats()["counts"]
    return [counts.get(target, 0) for target in targets]


def wait_until(condition: Any, timeout: float = 60) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.02)


def workers_of(pid: int) -> list[int]:
    """The worker processes of ``pid``: its children (from /proc, each thread's) started by
    multiprocessing's spawn (not its resource tracker)."""
    workers: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                command = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:  # (ended meanwhile)
                continue
            if b"spawn_main" in command:
                workers.append(int(child))
    return workers


def results_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def resume_line(stderr: str) -> list[str]:
    """The command the interrupted run said resumes it."""
    said = stderr.split("resume with: ", 1)[1].splitlines()[0]
    words = shlex.split(said)
    assert words[:3] == ["python", "-m", "batchsync"], said
    return words[3:]


@pytest.mark.integration
def test_the_cli_sends_from_two_processes_each_item_once_under_every_limit(
    server: MockServerProcess, tmp_path: Path
) -> None:
    targets = write_urls(tmp_path, server, 2000, delay=0.01)
    marker = targets[0].split("/")[2].split("-")[0]
    process = cli(
        "urls.txt", "--processes", "2", "-c", "16", "--per-host", "6", "--rate", "400",
        "--no-progress", "-v", cwd=tmp_path,
    )  # fmt: skip
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    assert "from 2 worker processes" in stderr
    assert served(server, targets) == [1] * 2000
    results = results_of(tmp_path / "urls-results.jsonl")
    assert [r["index"] for r in results] == list(range(2000))
    assert all(r["ok"] for r in results)
    assert "2000 items: 2000 ok, 0 failed; 2000 requests (1.00 per item)" in stderr
    assert (tmp_path / "urls-report.html").exists()
    entries = server.log(marker)
    assert in_flight_peak(entries) <= 6  # (3 + 3)
    assert busiest_second([e["t"] for e in entries]) <= 400  # (200 + 200)


@pytest.mark.integration
def test_a_killed_worker_process_loses_nothing(server: MockServerProcess, tmp_path: Path) -> None:
    targets = write_urls(tmp_path, server, 1000, delay=0.05)
    process = cli("urls.txt", "--processes", "2", "-c", "16", "--no-progress", cwd=tmp_path)
    wait_until(lambda: len(workers_of(process.pid)) == 2 and sum(served(server, targets)) >= 200)
    os.kill(workers_of(process.pid)[0], signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    # The other takes over what the killed one had no result for; the run ends whole.
    assert process.returncode == 0, stderr
    assert "ended with exit code -9" in stderr
    counts = served(server, targets)
    assert min(counts) == 1
    # Sent twice: at most what the killed worker held (twice its concurrency).
    assert sum(count - 1 for count in counts) <= 16
    results = results_of(tmp_path / "urls-results.jsonl")
    assert [r["index"] for r in results] == list(range(1000))
    assert all(r["ok"] for r in results)
    again = run_cli("urls.txt", "--processes", "2", "--resume", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert served(server, targets) == counts  # (nothing left to send)


@pytest.mark.integration
def test_every_worker_killed_ends_the_run_and_resume_finishes_it_once(
    server: MockServerProcess, tmp_path: Path
) -> None:
    targets = write_urls(tmp_path, server, 1000, delay=0.05)
    process = cli("urls.txt", "--processes", "2", "-c", "16", "--no-progress", cwd=tmp_path)
    wait_until(lambda: len(workers_of(process.pid)) == 2 and sum(served(server, targets)) >= 200)
    for worker in workers_of(process.pid):
        os.kill(worker, signal.SIGKILL)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 3, stderr
    assert "every worker process ended before the run did" in stderr
    again = run_cli("urls.txt", "--processes", "2", "--resume", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    counts = served(server, targets)
    assert min(counts) == 1
    assert sum(count - 1 for count in counts) <= 2 * 16  # (what both workers held)
    results = results_of(tmp_path / "urls-results.jsonl")
    assert [r["index"] for r in results] == list(range(1000))
    assert all(r["ok"] for r in results)


@pytest.mark.integration
def test_ctrl_c_stops_every_worker_and_the_resume_line_finishes_the_run(
    server: MockServerProcess, tmp_path: Path
) -> None:
    targets = write_urls(tmp_path, server, 1000, delay=0.05)
    args = ("urls.txt", "--processes", "2", "-c", "8", "-o", "run", "--no-progress")
    process = cli(*args, cwd=tmp_path)
    wait_until(lambda: len(workers_of(process.pid)) == 2 and sum(served(server, targets)) >= 100)
    os.killpg(process.pid, signal.SIGINT)  # (as a terminal's Ctrl-C: the workers get it too)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    stopped_at = sum(served(server, targets))
    assert stopped_at < 1000
    resumed = run_cli(*resume_line(stderr), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    counts = served(server, targets)
    assert min(counts) == 1
    assert sum(count - 1 for count in counts) <= 2 * 8  # (in flight at the stop, at most)
    results = results_of(tmp_path / "run-results.jsonl")
    assert [r["index"] for r in results] == list(range(1000))
    assert all(r["ok"] for r in results)


def test_the_cli_refuses_processes_beside_a_cluster(tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/x\n")
    refused = run_cli("urls.txt", "--processes", "2", "--rate", "auto", cwd=tmp_path)
    assert refused.returncode == 2
    assert "rate='auto'" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_the_cli_takes_processes_auto(tmp_path: Path) -> None:
    """--processes auto is read as its parser reads it, not as a number (its default, 1, is
    one): the run's next check, --rate auto beside it, is what refuses it."""
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/x\n")
    refused = run_cli("urls.txt", "--processes", "auto", "--rate", "auto", cwd=tmp_path)
    assert refused.returncode == 2
    assert "rate='auto'" in refused.stderr, refused.stderr


def test_a_count_of_processes_reads_as_a_count_of_workers_does() -> None:
    """--processes reads a count as -c does (int's reading); what int() refuses, a digit such
    as "²" among them, gets the option's own line (on the code before, "²" passed isdigit and
    the line was int()'s "invalid literal for int() with base 10")."""
    assert [processes_text(text) for text in ("2", " 3 ", "+2", "auto")] == [2, 3, 2, "auto"]
    for text in ("²", "0", "-1", "2.5", "x"):
        with pytest.raises(ValueError, match="expected a number of processes of at least 1"):
            processes_text(text)
