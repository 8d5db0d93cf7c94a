"""Package calls per item on the fast lane: calls into functions of ``batchsync/``, every thread.

    python scripts/bench_calls.py [--top N]

Runs ``fetch_all`` over 200 and then 1 200 distinct plain GET URLs to the fast local server
(nginx when installed, as ``bench_instructions.py``) at concurrency 4, with a profile function
on every thread (``threading.setprofile`` and the main thread's), and prints the difference
per extra item: start-up and the run's own set-up taken out. ``--top N`` lists the N
functions called most per item.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

import batchsync

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench import start_fast_server  # noqa: E402  (puts ROOT first: batchsync is imported)

PACKAGE = str(Path(batchsync.__file__).parent)

SMALL, LARGE = 200, 1200
_INNER = ("<genexpr>", "<listcomp>", "<setcomp>", "<dictcomp>")


def counted_run(url: str, count: int) -> Counter[tuple[str, str]]:
    """Calls into the package per function while ``fetch_all`` fetches ``count`` URLs."""
    calls: Counter[tuple[str, str]] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            code = frame.f_code
            calls[(Path(code.co_filename).name, code.co_qualname)] += 1

    urls = [f"{url}/item/{n}" for n in range(count)]
    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        done = batchsync.fetch_all(urls, concurrency=4)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert len(done.ok) == count, done.summary()
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=0)
    top = parser.parse_args().top
    with tempfile.TemporaryDirectory(prefix="batchsync-calls-") as tmp:
        server, _ = start_fast_server(Path(tmp))
        try:
            counted_run(server.url, 20)  # (imports and first-use caches out of the way)
            small = counted_run(server.url, SMALL)
            large = counted_run(server.url, LARGE)
        finally:
            server.stop()
    extra = LARGE - SMALL
    large.subtract(small)
    inner = sum(n for (_, name), n in large.items() if name.endswith(_INNER))
    print(f"batchsync from {PACKAGE}")
    print(
        f"package calls per item: {large.total() / extra:.1f} "
        f"({inner / extra:.1f} of them comprehensions and generator expressions)"
    )
    for (module, name), count in large.most_common(top):
        print(f"{count / extra:7.2f}  {module}:{name}")


if __name__ == "__main__":
    main()
