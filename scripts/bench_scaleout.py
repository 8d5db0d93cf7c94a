"""Scaling out, measured: three CLI processes sharing one quota in Redis, and a Dask cluster.

    python scripts/bench_scaleout.py        # needs redis-server on the PATH and the dask extra

1. Three ``python -m batchsync`` processes, each with ``--concurrency 8 --per-host 5
   --rate 40`` and 100 requests of 0.2 s (then of 0.02 s), sharing one namespace: the most
   requests the server handled at once, and the most that arrived in any 1-s window.
2. 20 000 requests to a server that answers in 20 ms (``scripts/bench_server.py``) through
   ``batchsync.run.cluster.fetch_on_cluster`` on a LocalCluster with 1 and with 2 worker
   processes (1 thread each, concurrency 16 per partition, so 800 requests/s per worker at
   best): requests/s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mockserver import (  # noqa: E402
    MockServerProcess,
    busiest_second,
    in_flight_peak,
    start_mock_server,
)
from tests.services import free_port  # noqa: E402


def three_processes(server: MockServerProcess, redis_url: str, folder: Path, delay: float) -> str:
    marker = uuid.uuid4().hex[:8]
    runs = []
    for n in range(3):
        (folder / f"{marker}-{n}").mkdir()
        urls = "".join(f"{server.url}/ok/{marker}-{n}-{i}?delay={delay}\n" for i in range(100))
        (folder / f"{marker}-{n}" / "urls.txt").write_text(urls)
        runs.append(subprocess.Popen(
            [sys.executable, "-m", "batchsync", "urls.txt", "-q", "--concurrency", "8",
             "--per-host", "5", "--rate", "40", "--redis", redis_url, "--namespace", marker],
            cwd=folder / f"{marker}-{n}",
        ))  # fmt: skip
    for run in runs:
        run.wait()
    entries = server.log(marker)
    return (
        f"three processes, --concurrency 8 --per-host 5 --rate 40, 300 requests of {delay} s: "
        f"at most {in_flight_peak(entries)} in flight at once (limit 5), busiest 1-s window "
        f"{busiest_second([e['t'] for e in entries])} requests (limit 40 + burst 8)"
    )


def dask_rate(base: str, workers: int) -> str:
    import dask
    import distributed

    from batchsync.contrib.dask import PROFILER_OFF
    from batchsync.run.cluster import fetch_on_cluster

    with dask.config.set(PROFILER_OFF):  # (cpython#106883: see contrib/dask.py)
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
    client = distributed.Client(cluster)
    try:
        marker = uuid.uuid4().hex[:8]
        urls = [f"{base}/item/{marker}-{i}" for i in range(20_000)]
        started = time.monotonic()
        results = fetch_on_cluster(urls, client, partition_size=1000, concurrency=16)
        seconds = time.monotonic() - started
        assert all(r.ok for r in results)
        rate = 20_000 / seconds
        return f"dask, {workers} worker(s): 20 000 requests in {seconds:.1f} s, {rate:.0f}/s"
    finally:
        client.close()
        cluster.close()


def main() -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed")
    port = free_port()
    redis = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
        stdout=subprocess.DEVNULL,
    )
    server = start_mock_server()
    latency = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "bench_server.py"), "--delay", "0.02"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert latency.stdout is not None
    base = latency.stdout.readline().split()[-1]
    try:
        time.sleep(0.5)
        with tempfile.TemporaryDirectory() as tmp:
            for delay in (0.2, 0.02):  # slots bind first, then the rate does
                print(three_processes(server, f"redis://127.0.0.1:{port}/0", Path(tmp), delay))
        for workers in (1, 2):
            print(dask_rate(base, workers))
    finally:
        server.process.terminate()
        latency.terminate()
        redis.terminate()
        os.waitpid(redis.pid, 0)


if __name__ == "__main__":
    main()
