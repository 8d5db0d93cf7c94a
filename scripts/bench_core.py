"""The core's resource figures: connections for 20 000 keep-alive requests, and peak RSS when
refusing 256 MiB bodies.

    python scripts/bench_core.py

Each figure comes from its own child process, so that one run's memory does not hide another's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mockserver import start_mock_server  # noqa: E402

PROBE = """
import json, resource, sys, time
from batchsync import fetch_all
urls = json.loads(sys.stdin.read())
started = time.monotonic()
rs = fetch_all(urls, concurrency=32, attempts=1)
print(json.dumps({"seconds": time.monotonic() - started, "ok": len(rs.ok),
                  "kinds": sorted({str(r.error_kind) for r in rs}),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def probe(urls: list[str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], input=json.dumps(urls), capture_output=True, text=True,
        check=True, timeout=600,
    )  # fmt: skip
    report: dict[str, object] = json.loads(done.stdout)
    return report


def main() -> None:
    server = start_mock_server()
    try:
        server.reset()
        report = probe([f"{server.url}/ok/{n}" for n in range(20_000)])
        stats = server.stats()
        print(f"20 000 requests, concurrency 32: {report['ok']} ok, {stats['connections']} "
              f"connections opened, peak RSS {report['peak_rss_mib']:.0f} MiB")  # fmt: skip
        for query in ("mb=256", "mb=256&chunked=1", "mb=256&gzip=1"):
            report = probe([f"{server.url}/huge?{query}"])
            print(f"256 MiB body ({query}): {report['kinds']}, "
                  f"peak RSS {report['peak_rss_mib']:.0f} MiB")  # fmt: skip
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


if __name__ == "__main__":
    main()
