"""What dedup saves and what hedging does to the tail, measured against the mock server.

    python scripts/bench_policies.py

1. Dedup: 100 URLs, each 5 times with its copies side by side (all in flight together),
   concurrency 20, 0.2 s responses: requests the server saw, with dedup on and off.
2. Hedging: 400 items, concurrency 20, against a server where every 20th response (5 %)
   takes 2 s: p50 / p99 / max item latency without hedging, with ``hedge_after=0.2`` and with
   ``hedge_after="p95"``, and the extra requests the hedges cost.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batchsync import fetch_all
from batchsync.core.result import percentile
from tests.mockserver import start_mock_server


def main() -> None:
    server = start_mock_server()
    try:
        for dedup in (True, False):
            marker = uuid.uuid4().hex[:8]
            items = [
                f"{server.url}/ok/{marker}-{n}?delay=0.2" for n in range(100) for _ in range(5)
            ]
            fetch_all(items, concurrency=20, dedup=dedup)
            print(
                f"dedup {'on ' if dedup else 'off'}: 500 items, {len(server.log(marker))} requests"
            )
        for hedge_after in (None, 0.2, "p95"):
            marker = uuid.uuid4().hex[:8]
            rs = fetch_all(
                [f"{server.url}/jitter/{marker}/{n}?every=20" for n in range(400)],
                concurrency=20, hedge_after=hedge_after,
            )  # fmt: skip
            latencies = sorted(r.elapsed for r in rs)
            print(
                f"hedge_after={hedge_after!s:<4}: p50 {percentile(latencies, 0.5):.3f} s, "
                f"p99 {percentile(latencies, 0.99):.3f} s, max {latencies[-1]:.3f} s, "
                f"{len(server.log(marker)) - 400} extra requests"
            )
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


if __name__ == "__main__":
    main()
