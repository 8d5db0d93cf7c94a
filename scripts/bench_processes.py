"""Every core: ``python -m batchsync --processes 2`` against ``--processes 1``, in one run.

    python scripts/bench_processes.py          # or as a section of `make bench`
    python scripts/bench.py --only processes   # this section alone, rewritten in place

The command line at ``-c 256`` over the same input, each run a fresh command (its start-up,
journal and output files included), interleaved so that a load spike touches both alike,
against the asyncio server answering after 50 ms (where one process is bound by its core:
the GIL) and against the same server answering at once. Targets: 2 processes at least 1.4x
one process at 50 ms on a 2-core machine; no slower against the fast server.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

HEADING = "## Every core: --processes"
CONCURRENCY = 256
PROCESSES = (1, 2)
TARGET = 1.4


def one_run(folder: Path, processes: int) -> dict[str, float]:
    """One command over ``folder``'s urls.txt: its wall seconds and the rate it reported."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", "-c", str(CONCURRENCY),
         "--processes", str(processes), "--fresh", "--no-progress", "--no-report"],
        cwd=folder, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"--processes {processes} failed: {done.stderr[-400:]}")
    rate = re.search(r"in [\d.]+ s, (\d+)/s", done.stderr)
    return {"wall": wall, "rate": float(rate.group(1)) if rate else 0.0}


def measure(delay: float, count: int, repeats: int) -> dict[int, dict[str, float]]:
    """The median wall seconds and rate of each process count against a server answering
    after ``delay``."""
    from bench import start_asyncio_server

    server = start_asyncio_server(delay)
    try:
        with tempfile.TemporaryDirectory(prefix="batchsync-processes-") as tmp:
            folder = Path(tmp)
            lines = "".join(f"{server.url}/item/{n}\n" for n in range(count))
            (folder / "urls.txt").write_text(lines)
            runs: dict[int, list[dict[str, float]]] = {n: [] for n in PROCESSES}
            for _ in range(repeats):
                for processes in PROCESSES:
                    runs[processes].append(one_run(folder, processes))
    finally:
        server.stop()
    return {
        n: {key: statistics.median(run[key] for run in case) for key in ("wall", "rate")}
        for n, case in runs.items()
    }


def section(quick: bool = False) -> list[str]:
    """The benchmark's lines for docs/benchmarks.md."""
    repeats = 1 if quick else 3
    count = 8_000 if quick else 20_000
    slow = measure(0.05, count, repeats)
    fast = measure(0.0, count, repeats)
    lines = [
        HEADING,
        "",
        f"`python -m batchsync` over {count:,} URLs at `-c {CONCURRENCY}`, `--processes 1` "
        "against `--processes 2`, each a fresh command (start-up, journal and output files "
        f"included), interleaved, the median of {repeats} (`scripts/bench_processes.py`), on "
        f"{os.cpu_count()} cores shared with the server. Targets: at 50 ms, 2 processes at "
        f"least {TARGET}x one; against the fast server, no slower.",
        "",
        "| server | processes | seconds | requests/s (the run's own) | ratio to 1 process |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, medians in (("asyncio, 50 ms", slow), ("asyncio, at once", fast)):
        base = medians[1]["wall"]
        lines.extend(
            f"| {name} | {n} | {case['wall']:.1f} | {case['rate']:.0f} | "
            f"{base / case['wall']:.2f} |"
            for n, case in medians.items()
        )
    return lines


if __name__ == "__main__":
    print("\n".join(section("--quick" in sys.argv)))
