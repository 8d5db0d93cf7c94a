"""Do the defaults pay for themselves? The command line with its defaults against a hand-written
thread pool and against ``--breaker off --cooldown off``, on the bundled fault server.

    python scripts/bench_defaults.py            # the three scenarios, medians of 3 (25 min)
    python scripts/bench_defaults.py --items 500 --repeats 1   # a quick look

Scenarios, every item on one host, concurrency 10 (the default):

* fault mix: 2 000 URLs, 0.2 s answers, 5.5 % always 503, 5.5 % 404, 3 % a 429 with
  Retry-After 1 s the first time; then ``--retry-failed`` of the failures;
* scattered 429s: 2 000 URLs, 0.2 s answers, 10 % a 429 with Retry-After 1 s the first time;
* host down: 20 URLs to a host that answers every request with 503 after 0.2 s (once: an
  open circuit holds each item until its budget cannot cover the break, about a minute).

The hand-written pool is what a user writes without batchsync: a ``ThreadPoolExecutor`` of
``requests`` sessions, 3 attempts, exponential backoff from 0.5 s, Retry-After as a floor.
Reported: wall time, outcome (ok, failed), requests the server saw, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mockserver import MockServerProcess, start_mock_server  # noqa: E402

CONCURRENCY = 10
DELAY = 0.2


@dataclass(frozen=True)
class Outcome:
    seconds: float
    ok: int
    failed: int
    requests: int


def fault_mix(base: str, items: int, marker: str) -> list[str]:
    """Per 200 items: 11 always 503, 11 404, 6 a 429 once, the rest 200, spread evenly."""
    urls = []
    for n in range(items):
        slot = n % 200
        name = f"{marker}-{n}"
        if slot % 18 == 5:
            urls.append(f"{base}/503/{name}?delay={DELAY}")
        elif slot % 18 == 11:
            urls.append(f"{base}/404/{name}?delay={DELAY}")
        elif slot % 33 == 1 and slot < 199:
            urls.append(f"{base}/429-once/{name}?retry_after=1&delay={DELAY}")
        else:
            urls.append(f"{base}/ok/{name}?delay={DELAY}")
    return urls


def scattered_429s(base: str, items: int, marker: str) -> list[str]:
    return [
        f"{base}/429-once/{marker}-{n}?retry_after=1&delay={DELAY}"
        if n % 10 == 3
        else f"{base}/ok/{marker}-{n}?delay={DELAY}"
        for n in range(items)
    ]


def down(base: str, items: int, marker: str) -> list[str]:
    """A host that answers every request with 503: few items, for each costs its budget."""
    return [f"{base}/503/{marker}-{n}?delay={DELAY}" for n in range(items // 100)]


def hand_written(urls: list[str]) -> tuple[int, int]:
    """The script a user would write instead: 3 attempts on a 429, a 5xx or no answer, the
    backoff of the defaults (0.5 s doubling, up to half again at random), Retry-After a floor."""
    local = threading.local()

    def get(url: str) -> bool:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        for attempt in range(1, 4):
            try:
                answer = session.get(url, timeout=10)
            except requests.RequestException:
                answer = None
            if answer is not None and answer.status_code != 429 and answer.status_code < 500:
                return answer.ok
            if attempt < 3:
                hint = answer.headers.get("Retry-After") if answer is not None else None
                backoff = 0.5 * 2 ** (attempt - 1) * (1 + 0.5 * random.random())
                time.sleep(max(backoff, float(hint) if hint else 0.0))
        return False

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        oks = list(pool.map(get, urls))
    return sum(oks), len(oks) - sum(oks)


def command_line(urls: list[str], options: list[str], folder: Path) -> tuple[int, int]:
    """The CLI as a user runs it: a file in, results out (``--retry-failed`` reads them)."""
    listing = folder / "urls.txt"
    listing.write_text("\n".join(urls) + "\n", encoding="utf-8")
    command = [sys.executable, "-m", "batchsync", str(listing), "-o", str(folder / "run")]
    subprocess.run([*command, "--no-progress", "-q", *options], check=False)
    results = (folder / "run-results.jsonl").read_text(encoding="utf-8").splitlines()
    oks = sum(json.loads(line)["ok"] for line in results)
    return oks, len(results) - oks


def measured(server: MockServerProcess, marker: str, run: Callable[[], tuple[int, int]]) -> Outcome:
    """One run, timed, with the requests the server saw of ``marker`` during it."""
    before = len(server.log(marker))
    began = time.perf_counter()
    ok, failed = run()
    seconds = time.perf_counter() - began
    return Outcome(seconds, ok, failed, len(server.log(marker)) - before)


def runs_of(server: MockServerProcess, urls: Callable[[str], list[str]]) -> dict[str, Outcome]:
    """One repeat of a scenario: the pool, the defaults and both off, then a retry pass of
    each command line's failures."""
    marker = uuid.uuid4().hex[:10]
    outcomes = {"hand-written pool": measured(server, marker, partial(hand_written, urls(marker)))}
    for name, options in (("defaults", []), ("--breaker off --cooldown off", OFF)):
        marker = uuid.uuid4().hex[:10]
        with tempfile.TemporaryDirectory() as folder:
            listing = urls(marker)
            first = partial(command_line, listing, options, Path(folder))
            outcomes[name] = measured(server, marker, first)
            again = partial(command_line, listing, [*options, "--retry-failed"], Path(folder))
            outcomes[f"{name}, --retry-failed"] = measured(server, marker, again)
    return outcomes


OFF = ["--breaker", "off", "--cooldown", "off"]
SCENARIOS = {"fault mix": fault_mix, "scattered 429s": scattered_429s, "host down": down}


def median_of(runs: list[dict[str, Outcome]], name: str) -> Outcome:
    picked = sorted((run[name] for run in runs), key=lambda o: o.seconds)
    middle = picked[len(picked) // 2]
    return Outcome(statistics.median(o.seconds for o in picked), middle.ok, middle.failed,
                   middle.requests)  # fmt: skip


def table(items: int, repeats: int, only: list[str]) -> Iterator[str]:
    """The markdown lines, one table per scenario, each given as soon as it is measured."""
    server = start_mock_server()
    try:
        for title in only:
            make = SCENARIOS[title]
            times = 1 if make is down else repeats
            runs = [runs_of(server, partial(make, server.url, items)) for _ in range(times)]
            pool = median_of(runs, "hand-written pool").seconds
            off = median_of(runs, "--breaker off --cooldown off").seconds
            yield f"**{title}** ({len(make('', items, ''))} items, medians of {times})"
            yield ""
            yield "| run | wall s | ok | failed | requests | to the pool | to both off |"
            yield "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
            for name in runs[0]:
                o = median_of(runs, name)
                first = "retry-failed" not in name
                to_pool = f"{o.seconds / pool:.2f}" if first else ""
                to_off = f"{o.seconds / off:.2f}" if first and "pool" not in name else ""
                yield (f"| {name} | {o.seconds:.1f} | {o.ok} | {o.failed} | {o.requests} | "
                       f"{to_pool} | {to_off} |")  # fmt: skip
            yield ""
    finally:
        server.process.terminate()


HEADING = "## Defaults against a hand-written pool"


def section(quick: bool = False) -> list[str]:
    """The benchmarks page's section: every scenario, 2 000 items, medians of 3 (a quick run:
    1 000 items, once)."""
    items, repeats = (1000, 1) if quick else (2000, 3)
    return [
        HEADING,
        "",
        "The command line with its defaults (breaker and per-host cooldown on) against the script "
        "a user writes instead: a `ThreadPoolExecutor` of 10 `requests` sessions with the same "
        "retries (3 attempts on a 429, a 5xx or no answer; 0.5 s doubling, up to half again at "
        "random; Retry-After a floor), and against `--breaker off --cooldown off`; all on one "
        "host of the bundled fault server, 0.2 s answers (`scripts/bench_defaults.py`). Then "
        "`--retry-failed` of each run's failures. *Requests* are counted by the server.",
        "",
        *table(items, repeats, list(SCENARIOS)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=list(SCENARIOS), action="append")
    args = parser.parse_args()
    for line in table(args.items, args.repeats, args.only or list(SCENARIOS)):
        print(line, flush=True)


if __name__ == "__main__":
    main()
