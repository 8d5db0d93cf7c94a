"""How ``lanes="auto"`` splits a run between the batch endpoint and the live lane under a
deadline, against the bundled mock: the wall time, the rows each lane answered (by the Results
and by the mock's own counts) and the rows answered by both (must be none).

    python scripts/bench_lanes.py [--rows 2000] [--pace 3] [--deadlines 10,14,20,40]

Each mock batch is ``validating``, ``in_progress`` (its rows done one by one) and
``finalizing`` for ``--pace`` seconds each; a cancel takes one more.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batchsync import Batch  # noqa: E402
from tests.mockserver import MockServerProcess, start_mock_server  # noqa: E402

LIVE = "rpm=1000000,tpm=1000000000,latency=0.05"
BODY = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}


def counted(server: MockServerProcess, key: str) -> tuple[dict[str, Any], int]:
    """The mock's batch counts and live requests for KEY (none: no call of that kind)."""
    try:
        batch = server.get(f"/llm/{key}/batch-stats")
    except OSError:  # (404: no batch call)
        batch = {"rows_answered": 0, "both_lanes": []}
    return batch, int(server.get(f"/llm/{key}/stats")["requests"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--pace", type=float, default=3.0)
    parser.add_argument("--deadlines", default="10,14,20,40")
    given = parser.parse_args()
    server = start_mock_server()
    rows = [{"text": f"question {n}"} for n in range(given.rows)]
    print("deadline  took   batch   live  failed  mock: batch  live  both")
    try:
        for deadline in (float(text) for text in given.deadlines.split(",")):
            key = uuid.uuid4().hex[:10]
            url = f"{server.url}/llm/{key}/pace={given.pace},{LIVE}/v1/chat/completions"
            began = time.monotonic()
            results = Batch(
                rows, url=url, body=BODY, batch_api="auto", lanes="auto", deadline=deadline,
                poll=0.1, batch_rows=given.rows // 4 or 1, concurrency=50, live_latency=0.2,
                headers={"Authorization": "Bearer mock"}, progress=False,
            ).run()  # fmt: skip
            took = time.monotonic() - began
            lanes = [r.attempt_log[-1].lane or "live" for r in results if r.ok]
            batch, live = counted(server, key)
            print(
                f"{deadline:8.0f} {took:5.1f} {lanes.count('batch'):7d} {lanes.count('live'):6d} "
                f"{sum(not r.ok for r in results):7d} {batch['rows_answered']:12d} {live:5d} "
                f"{len(batch['both_lanes']):5d}"
            )
    finally:
        server.process.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
