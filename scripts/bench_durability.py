"""Durability costs: the CLI's peak RSS against the number of items, and the journal's overhead.

    python scripts/bench_durability.py                  # 10^4, 10^5 and 10^6 items
    python scripts/bench_durability.py --sizes 10000    # a quick look

Peak RSS: each size runs ``python -m batchsync`` as a child process on a generated input
where 1 item in 100 is a real request to the bundled mock server and the rest fail fast as
``invalid_request``, and again where every item fails at once (the journal's worst case:
results come faster than SQLite commits them); the child's peak RSS comes from ``wait4``.
Journal overhead: the same batch of real requests through ``Batch`` with and without
``journal=``, interleaved, median of the repeats (bound by the mock server), and the journal
on its own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batchsync import Batch
from batchsync.cli.runner import encode
from batchsync.core.result import Result
from batchsync.store.journal import Journal
from tests.mockserver import start_mock_server

REAL_EVERY = 100


def write_input(path: Path, size: int, base: str, real_every: int | None) -> None:
    with path.open("w", encoding="utf-8") as out:
        for n in range(size):
            real = real_every is not None and n % real_every == 0
            out.write(f"{base}/ok/{n}\n" if real else f"ftp://files.test/{n}\n")


def peak_rss(
    size: int, base: str, folder: Path, real_every: int | None = REAL_EVERY
) -> tuple[float, float]:
    """(peak RSS in MiB, seconds) of one CLI run over ``size`` items, one in ``real_every``
    a real request (None: every item fails at once)."""
    name = f"{size}-{real_every or 'none'}"
    urls = folder / f"items-{name}.txt"
    write_input(urls, size, base, real_every)
    command = [sys.executable, "-m", "batchsync", str(urls), "-o", str(folder / f"out-{name}"),
               "-q", "-c", "16", "--fresh"]  # fmt: skip
    started = time.monotonic()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.monotonic() - started
    if os.waitstatus_to_exitcode(status) not in (0, 1):
        sys.exit(f"the run over {size} items failed: {status}")
    return usage.ru_maxrss / 1024, elapsed


def journal_rates(base: str, folder: Path, items: int, repeats: int) -> tuple[float, float]:
    """Median items/s without and with the journal, runs interleaved."""
    urls = [f"{base}/ok/{n}" for n in range(items)]
    plain: list[float] = []
    journaled: list[float] = []
    for repeat in range(repeats):
        for rates, journal in ((plain, None), (journaled, folder / f"j{repeat}.sqlite3")):
            started = time.monotonic()
            results = Batch(urls, concurrency=16, journal=journal).run()
            rates.append(len(results) / (time.monotonic() - started))
    return statistics.median(plain), statistics.median(journaled)


def journal_alone(folder: Path, count: int) -> float:
    """Results/s the journal takes in (queue, encode, group commit) with no network at all."""
    results = [
        Result(n, f"http://h.test/{n}", True, status_code=200, attempts=1, data={"n": n})
        for n in range(count)
    ]
    journal = Journal(folder / "alone.sqlite3", encode, {"entries": str(count)})
    started = time.monotonic()
    for result in results:
        journal.add(result, None)
    journal.close()
    return count / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--journal-items", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    server = start_mock_server()
    try:
        with tempfile.TemporaryDirectory(prefix="batchsync-bench-") as tmp:
            folder = Path(tmp)
            print("| items | real requests | peak RSS (MiB) | seconds |")
            print("| ---: | ---: | ---: | ---: |")
            for size in args.sizes:
                for real_every in (REAL_EVERY, None):
                    rss, seconds = peak_rss(size, server.url, folder, real_every)
                    real = size // real_every if real_every else 0
                    print(f"| {size:,} | {real:,} | {rss:.0f} | {seconds:.1f} |")
            plain, journaled = journal_rates(server.url, folder, args.journal_items, args.repeats)
            print()
            print(f"journal overhead, {args.journal_items} requests, concurrency 16, "
                  f"median of {args.repeats}:")  # fmt: skip
            print(f"  without journal: {plain:.0f} items/s")
            print(f"  with journal:    {journaled:.0f} items/s ({journaled / plain:.1%})")
            alone = journal_alone(folder, 100_000)
            print(f"  the journal alone takes in {alone:,.0f} results/s")
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


if __name__ == "__main__":
    main()
