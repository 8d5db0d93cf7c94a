"""Shared limits in a real Redis, and batches on a real Dask cluster, judged by the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from batchsync import Backoff, fetch_all

from .mockserver import MockServerProcess, busiest_second, in_flight_peak
from .services import redis_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def namespace() -> str:
    return uuid.uuid4().hex[:10]


def start_cli(folder: Path, urls: list[str], *options: str) -> subprocess.Popen[str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "urls.txt").write_text("\n".join(urls) + "\n")
    return subprocess.Popen(
        [sys.executable, "-m", "batchsync", "urls.txt", *options],
        cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_three_processes_share_one_quota(
    server: MockServerProcess, redis_url: str, tmp_path: Path
) -> None:
    marker, quota = uuid.uuid4().hex[:8], namespace()
    options = ("--concurrency", "8", "--per-host", "5", "--rate", "40",
               "--redis", redis_url, "--namespace", quota)  # fmt: skip
    runs = [
        start_cli(
            tmp_path / f"p{n}",
            [f"{server.url}/ok/{marker}-{n}-{i}?delay=0.2" for i in range(60)],
            *options,
        )
        for n in range(3)
    ]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    entries = server.log(marker)
    assert len(entries) == 180
    assert in_flight_peak(entries) <= 5
    assert busiest_second([e["t"] for e in entries]) <= 40 + 8


def test_a_429_seen_by_one_process_holds_the_others(
    server: MockServerProcess, redis_url: str, tmp_path: Path
) -> None:
    marker, quota = uuid.uuid4().hex[:8], namespace()
    options = ("--concurrency", "3", "--redis", redis_url, "--namespace", quota)
    account = f"{server.url}/account/{marker}"
    runs = [
        start_cli(
            tmp_path / f"p{n}",
            [f"{account}/{n}-{i}?retry_after=1.5&delay=0.05" for i in range(15)],
            *options,
        )
        for n in range(3)
    ]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
    entries = server.log(marker)
    # (every request of the account in its first 1.5 s is refused: the first answered starts
    # the hold every process keeps)
    refused = min((e for e in entries if e["status"] == 429), key=lambda e: e["end"])
    inside = [e for e in entries if refused["end"] + 0.15 < e["t"] < refused["end"] + 1.4]
    assert inside == []
    assert len({e["target"].split("/")[3].split("-")[0] for e in entries}) == 3


def test_slots_of_a_killed_process_come_back_within_the_lease(
    server: MockServerProcess, redis_url: str, tmp_path: Path
) -> None:
    marker, quota = uuid.uuid4().hex[:8], namespace()
    shared = ("--per-host", "2", "--redis", redis_url, "--namespace", quota,
              "--lease-ttl", "2", "--timeout", "60")  # fmt: skip
    holder = start_cli(
        tmp_path / "holder", [f"{server.url}/ok/{marker}-held-{i}?delay=30" for i in range(4)],
        *shared,
    )  # fmt: skip
    give_up = time.monotonic() + 30
    while len(server.log(f"{marker}-held")) < 2:
        assert time.monotonic() < give_up
        time.sleep(0.05)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    killed_at = time.time()
    other = start_cli(tmp_path / "other", [f"{server.url}/ok/{marker}-next"], *shared)
    _, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    (first,) = server.log(f"{marker}-next")
    waited = first["t"] - killed_at
    assert 0.5 < waited < 3.5  # the dead holder's leases expire within the 2 s TTL


def test_an_unreachable_redis_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/x\n")
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", "--redis", "redis://127.0.0.1:1/0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith("Error: cannot reach Redis at redis://127.0.0.1:1/0")
    assert done.stderr.count("\n") == 1


def test_the_library_shares_limits_through_redis(server: MockServerProcess, redis_url: str) -> None:
    marker, quota = uuid.uuid4().hex[:8], namespace()
    urls = [f"{server.url}/ok/{marker}-{i}?delay=0.1" for i in range(30)]
    results: list[Any] = []
    threads = [
        threading.Thread(
            target=lambda part=part: results.extend(
                fetch_all(part, concurrency=6, per_host=3, limits=redis_url, namespace=quota)
            )
        )
        for part in (urls[:15], urls[15:])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 30 and all(r.ok for r in results)
    assert in_flight_peak(server.log(marker)) <= 3


def test_a_dask_run_survives_a_lost_worker(server: MockServerProcess, cluster: Any) -> None:
    from batchsync.run.cluster import fetch_on_cluster

    marker = uuid.uuid4().hex[:8]
    urls = [f"{server.url}/ok/{marker}-{i}?delay=0.01" for i in range(5000)]
    pids = list(cluster.run(os.getpid).values())
    victim = pids[0]

    def kill_one_worker() -> None:
        while len(server.log(marker)) < 1000:
            time.sleep(0.05)
        os.kill(victim, signal.SIGKILL)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    rs = fetch_on_cluster(urls, cluster, partition_size=250, concurrency=8)
    killer.join(timeout=1)
    assert not killer.is_alive(), "the worker was not killed mid-run"
    assert len(rs) == 5000
    assert [r.url for r in rs] == urls
    assert [r.index for r in rs] == list(range(5000))
    assert all(r.ok for r in rs)


def test_run_all_on_a_cluster_calls_each_item_once_with_its_limits(
    server: MockServerProcess, cluster: Any, tmp_path: Path
) -> None:
    """The callable is pickled to the workers; retries and the journal work as at home."""
    from batchsync.run.cluster import run_on_cluster

    marker = uuid.uuid4().hex[:8]
    base = server.url  # (what the function closes over is pickled to the workers)

    def get(n: int) -> Any:
        response = requests.get(f"{base}/503-then-ok/{marker}-{n % 3}/{n}?after=1", timeout=5)
        response.raise_for_status()
        return response.json()["ok"]

    journal = tmp_path / "calls.sqlite3"
    rs = run_on_cluster(get, range(60), cluster, partition_size=10, journal=journal,
                        backoff=Backoff(base=0.01, jitter=0.0))  # fmt: skip
    assert [(r.index, r.ok, r.data) for r in rs] == [(n, True, True) for n in range(60)]
    assert sum(r.attempts for r in rs) == 63  # each family's first request was a 503, retried
    again = run_on_cluster(get, range(60), cluster, partition_size=10, journal=journal)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in rs]
    assert len(server.log(marker)) == 63  # the journal answered the second run


def test_the_cli_runs_on_a_dask_cluster_with_a_journal(
    server: MockServerProcess, cluster: Any, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex[:8]
    address = cluster.scheduler.address
    urls = [f"{server.url}/ok/{marker}-{i}" for i in range(300)] + [f"{server.url}/404/{marker}"]
    run = start_cli(tmp_path, urls, "--dask", address, "--partition-size", "50")
    _, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    results = [json.loads(line) for line in (tmp_path / "urls-results.jsonl").open()]
    assert [r["url"] for r in results] == urls
    assert [r["ok"] for r in results].count(False) == 1
    assert json.loads((tmp_path / "urls-failed.jsonl").read_text()) == {"url": urls[-1]}
    again = start_cli(tmp_path, urls, "--dask", address, "--resume")
    again.communicate(timeout=120)
    assert len(server.log(marker)) == 301  # the resumed run had nothing left to fetch


def test_a_partition_leaves_metrics_and_traces_to_its_client(
    server: MockServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's run is observed by the client that collects its Results (the CLI's progress
    and metrics); a worker's own global tracer must not add a second set of spans."""
    from batchsync.run import assembly
    from batchsync.run.cluster import run_partition

    asked: list[object] = []

    def observers_for(*args: object) -> list[object]:
        asked.append(args)
        return []

    monkeypatch.setattr(assembly, "observers_for", observers_for)
    results = run_partition([(5, f"{server.url}/ok/partition")], {}, None)
    assert [(r.index, r.ok) for r in results] == [(5, True)]
    assert asked == []


def test_a_token_window_is_shared_through_redis_by_weight(redis_url: str) -> None:
    """Two processes' windows are one log: what one takes, the other waits for (its pace,
    then its room); what one never sent, the other may take; an entry leaves one period after
    its attempt ended, not before."""
    from batchsync.contrib import shared_limits
    from batchsync.limits.rates import Window
    from batchsync.limits.window import INFINITE

    quota = namespace()
    window = Window(100, 1)  # 100 tokens in any second, one each 10 ms
    first, second = (shared_limits(redis_url, quota, 10.0) for _ in range(2))
    one, other = first.window("tokens"), second.window("tokens")
    taken, wait = one.take(40, window, threading.Event(), 5.0)
    assert taken is not None and wait == 0
    refused, wait = other.take(40, window, threading.Event(), 5.0)  # paced behind the first's 40
    assert refused is None and wait == pytest.approx(0.4, abs=0.2)
    time.sleep(0.45)
    refused, wait = other.take(80, window, threading.Event(), 5.0)  # 120 > 100, the 40 in flight
    assert refused is None and wait == INFINITE
    one.cancel(taken)  # never sent: its room is back
    again, wait = other.take(80, window, threading.Event(), 5.0)
    assert again is not None and wait == 0
    other.finish(again, 90)  # the answer said 90: the log holds 90 for a second from now
    time.sleep(0.8)
    refused, wait = one.take(60, window, threading.Event(), 5.0)
    assert refused is None and wait == pytest.approx(0.2, abs=0.15)


def test_a_settled_output_sets_the_shared_log_and_the_pace_to_what_was_made(
    redis_url: str,
) -> None:
    """An output side's entry (``output_token_rate``) is settled at what its answer made,
    less as well as more, and gives the pace it took for the rest back to every process."""
    from batchsync.contrib import shared_limits
    from batchsync.limits.rates import Window
    from batchsync.limits.window import INFINITE

    quota, window = namespace(), Window(100, 60)  # 100 in any minute: 0.6 s a token
    one, other = (shared_limits(redis_url, quota, 10.0).window("output") for _ in range(2))
    taken, _ = one.take(50, window, threading.Event(), 120.0)
    assert taken is not None
    refused, wait = other.take(90, window, threading.Event(), 120.0)  # paced 30 s behind, no room
    assert refused is None and wait == INFINITE
    refused, wait = other.take(20, window, threading.Event(), 120.0)
    assert refused is None and wait == pytest.approx(30, abs=1)
    one.finish(taken, 10, exact=True)  # made 10: 40 of room and 24 s of pace back
    one.finish(taken, 50, exact=True)  # (ended already: nothing changes)
    refused, wait = other.take(90, window, threading.Event(), 120.0)  # 10 + 90 fit, in 6 s
    assert refused is None and wait == pytest.approx(6, abs=1)


def test_a_short_take_beside_a_long_attempt_in_flight_shortens_no_key(redis_url: str) -> None:
    """A 300 s attempt in flight, then a take of an attempt with 1 s left beside it: every key
    of the shared log still lives as long as the first needs (each take used to set the keys'
    expiry from its own allowance, so 63 s later the log had forgotten the attempt still in
    flight and two were let through where the count allowed one)."""
    import redis

    from batchsync.contrib import shared_limits
    from batchsync.limits.rates import Window

    quota, window = namespace(), Window(1000, 10)  # (paced one each 10 ms)
    log = shared_limits(redis_url, quota, 10.0).window("requests")
    long, _ = log.take(1, window, threading.Event(), 300.0)
    time.sleep(0.05)
    short, _ = log.take(1, window, threading.Event(), 1.0)
    assert long is not None and short is not None
    client = redis.Redis.from_url(redis_url)

    def lives() -> dict[object, int]:
        return {key: client.ttl(key) for key in client.keys(f"batchsync:{quota}:requests:*")}

    assert len(lives()) == 3 and min(lives().values()) >= 300 + 10, lives()
    log.finish(short, None)  # (the ended entries' key is made, for a period and more)
    ended = f"batchsync:{quota}:requests:ended".encode()
    after = lives()
    assert after.pop(ended) >= 10 and min(after.values()) >= 300 + 10, lives()


def _profiling(dask_worker: Any) -> bool:
    return "profile" in dask_worker.periodic_callbacks


def test_the_clusters_batchsync_makes_do_not_profile_their_workers(cluster: Any) -> None:
    # (python/cpython#106883: the profiler's sampling can deadlock a busy worker on 3.11)
    assert not any(cluster.run(_profiling).values())


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="only 3.11's workers are stopped")
def test_a_run_on_a_cluster_stops_the_profiler_of_its_3_11_workers() -> None:
    distributed = pytest.importorskip("distributed")
    import dask

    from batchsync.run.cluster import run_on_cluster

    with (
        dask.config.set({"distributed.worker.profile.enabled": True}),  # (a user's cluster)
        distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as local,
        distributed.Client(local) as client,
    ):
        assert all(client.run(_profiling).values())
        assert [r.data for r in run_on_cluster(abs, [-1, 2], client)] == [1, 2]
        assert not any(client.run(_profiling).values())
