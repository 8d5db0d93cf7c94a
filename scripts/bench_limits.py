"""Flow control as the server sees it: the CLI's --rate, and --adaptive against a limited server.

    python scripts/bench_limits.py

1. ``--rate 50 -c 10`` over 300 items: the most requests the server saw in any 1-s window, and
   the average rate.
2. 240 items, ``-c 16``, against a server that takes 4 requests at a time (0.1 s of work each,
   429 beyond that): the 429s the server sent and the run's time, without and with
   ``--adaptive`` (ideal: 240 x 0.1 s / 4 = 6 s).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.mockserver import busiest_second, start_mock_server


def run_cli(folder: Path, urls: list[str], *options: str) -> float:
    (folder / "urls.txt").write_text("\n".join(urls) + "\n", encoding="utf-8")
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", "-q", "--fresh", *options],
        cwd=folder, check=False,
    )  # fmt: skip
    return time.monotonic() - started


def main() -> None:
    server = start_mock_server()
    try:
        with tempfile.TemporaryDirectory(prefix="batchsync-limits-") as tmp:
            folder = Path(tmp)
            marker = uuid.uuid4().hex[:8]
            run_cli(folder, [f"{server.url}/ok/{marker}-{n}" for n in range(300)],
                    "--rate", "50", "-c", "10")  # fmt: skip
            arrivals = sorted(e["t"] for e in server.log(marker))
            average = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
            print(f"--rate 50 -c 10, 300 requests: busiest 1-s window {busiest_second(arrivals)}"
                  f" requests (limit 50 + burst 10), average {average:.1f}/s")  # fmt: skip
            for options in ([], ["--adaptive"]):
                family = uuid.uuid4().hex[:8]
                urls = [
                    f"{server.url}/limited/{family}/{n}?max_inflight=4&work=0.1&family={family}"
                    for n in range(240)
                ]
                seconds = run_cli(folder, urls, "-c", "16", "--attempts", "50", "--breaker",
                                  "off", "--budget", "300", *options)  # fmt: skip
                refused = sum(1 for e in server.log(family) if e["status"] == 429)
                label = " ".join(options) or "without --adaptive"
                print(f"limited server, -c 16, {label}: {refused} x 429, {seconds:.1f} s")
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


if __name__ == "__main__":
    main()
