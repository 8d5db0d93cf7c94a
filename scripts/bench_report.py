"""How long the report of a large run takes, and how large it is.

    python scripts/bench_report.py [--items 1000000] [--folder /tmp]

Writes a synthetic journal of N Results (90 % ok at once, 5 % a 429 then ok, 3 % three 503s,
2 % a 404; finished over an hour), then PREFIX-report.html from it as the command line does,
and prints the journal's size, the report's size and the seconds each step took.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from batchsync.core.records import dumps, public_record
from batchsync.core.result import AttemptRecord, Result
from batchsync.output.resultset import StoredResults
from batchsync.store.journal import Journal, JournalReader, remove


def synthetic(index: int, picks: random.Random, start: float, span: float) -> Result:
    url = f"https://api.example.com/v2/products/{index}?api_key=***"
    finished = start + span * index / 1_000_000 + picks.random()
    draw = picks.random()
    if draw < 0.90:
        took = picks.lognormvariate(-2.5, 0.6)
        log: tuple[AttemptRecord, ...] = (AttemptRecord(1, 200, None, took),)
        return Result(
            index,
            url,
            True,
            status_code=200,
            attempts=1,
            elapsed=took,
            attempt_log=log,
            data={"id": index, "price": 9.5},
            finished=finished,
        )
    if draw < 0.95:
        log = (AttemptRecord(1, 429, "status", 0.02, 1.0), AttemptRecord(2, 200, None, 0.08))
        return Result(
            index,
            url,
            True,
            status_code=200,
            attempts=2,
            elapsed=1.1,
            attempt_log=log,
            data={"id": index},
            finished=finished,
        )
    if draw < 0.98:
        log = (
            AttemptRecord(1, 503, "status", 0.05, 0.6),
            AttemptRecord(2, 503, "status", 0.05, 1.2),
            AttemptRecord(3, 503, "status", 0.05),
        )
        return Result(
            index,
            url,
            False,
            status_code=503,
            attempts=3,
            error_kind="status",
            error="HTTP 503 after 3 attempts",
            elapsed=1.95,
            attempt_log=log,
            finished=finished,
        )
    log = (AttemptRecord(1, 404, "status", 0.03),)
    return Result(
        index,
        url,
        False,
        status_code=404,
        attempts=1,
        error_kind="status",
        error="HTTP 404",
        elapsed=0.03,
        attempt_log=log,
        finished=finished,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--folder", default="/tmp")
    args = parser.parse_args()
    prefix = Path(args.folder) / "bench-report"
    journal_path = Path(f"{prefix}-journal.sqlite3")
    remove(journal_path)
    picks = random.Random(7)
    began = time.perf_counter()
    journal = Journal(
        journal_path, lambda r, item: (dumps(public_record(r)), None if r.ok else "{}"), {}
    )
    start = time.time() - 3600
    for index in range(args.items):
        journal.add(synthetic(index, picks, start, 3600.0), None)
    journal.close()
    wrote = time.perf_counter() - began
    began = time.perf_counter()
    reader = JournalReader(journal_path)
    try:
        stored = StoredResults(reader, journal_path)
        summarized = time.perf_counter() - began
        began = time.perf_counter()
        path = stored.report(Path(f"{prefix}-report.html"), title="batchsync report")
    finally:
        reader.close()
    reported = time.perf_counter() - began
    print(
        f"{args.items} items; journal {journal_path.stat().st_size / 2**20:.1f} MiB "
        f"in {wrote:.1f} s"
    )
    print(
        f"summary {summarized:.1f} s; report {path} {path.stat().st_size / 2**20:.2f} MiB "
        f"in {reported:.1f} s"
    )
    remove(journal_path)


if __name__ == "__main__":
    main()
