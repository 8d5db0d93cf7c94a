"""Results as they come, from a plain script: ``fetch_iter`` yields each Result the moment it is
journaled, so each answer is written out at once; leaving the loop stops the run, and the same
call later goes on with what is left.

    python examples/stream_results.py      # against the bundled mock API: no network
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import batchsync

ROOT = Path(__file__).resolve().parent.parent


def save(urls: list[str], journal: Path, answers: Path, stop_after: int | None = None) -> int:
    """Write each Result to ``answers`` as it comes (those the journal holds come first, so the
    file is whole at the end); leave after ``stop_after`` of them. How many were written."""
    written = 0
    with answers.open("w") as out:
        for result in batchsync.fetch_iter(urls, journal=journal, concurrency=5, progress=False):
            out.write(json.dumps({"index": result.index, "ok": result.ok}) + "\n")
            written += 1
            if written == stop_after:
                break  # (a stop: the run ends, what finished is journaled)
    return written


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from tests.mockserver import start_mock_server

    server = start_mock_server()
    urls = [f"{server.url}/ok/product-{n}?delay=0.02" for n in range(50)]
    with tempfile.TemporaryDirectory() as folder:
        journal, answers = Path(folder) / "products.sqlite3", Path(folder) / "products.jsonl"
        first = save(urls, journal, answers, stop_after=10)
        # The same call again: it sends only what the journal has no Result for.
        second = save(urls, journal, answers)
        indexes = [json.loads(line)["index"] for line in answers.read_text().splitlines()]
    server.process.terminate()
    print(f"{len(urls)} items: {first} written before the stop, {second} on the second call; "
          f"each once: {sorted(indexes) == list(range(len(urls)))}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
