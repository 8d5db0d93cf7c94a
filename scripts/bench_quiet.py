"""What waiting costs: client CPU per request when a limit holds most workers waiting.

    python scripts/bench_quiet.py          # or as a section of `make bench`

``fetch_all`` at concurrency 256 against the bundled mock server (another process), each run
in a fresh process: 400 requests under ``rate="100/s"``, 400 with ``per_host=8`` at 50 ms a
request, and the same 400 with neither. Reported: CPU ms per request (user + system, the
run alone, not the process start), and the rate the server saw. Targets: CPU per request
under the rate within 2x of the run without it; the rate reached within 3 %.
"""

from __future__ import annotations

import json
import resource
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mockserver import start_mock_server  # noqa: E402

COUNT, CONCURRENCY, REPEATS = 400, 256, 3
HEADING = "## Waiting quietly"
CASES: dict[str, dict[str, Any]] = {
    "no limit": {},
    'rate="100/s"': {"rate": "100/s"},
    "per_host=8, 50 ms": {"per_host": 8},
}


def child(url: str, options: dict[str, Any]) -> None:
    """One run, in this process: prints its CPU and wall seconds as JSON."""
    import time

    import batchsync

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    cpu_before, started = cpu(), time.monotonic()
    results = batchsync.fetch_all(
        [url.format(n=n) for n in range(COUNT)],
        concurrency=int(sys.argv[4]) if len(sys.argv) > 4 else CONCURRENCY,
        **options,
    )
    wall, spent = time.monotonic() - started, cpu() - cpu_before
    ok = sum(result.ok for result in results)
    print(json.dumps({"cpu": spent, "wall": wall, "ok": ok}))


def one_run(server_url: str, name: str) -> dict[str, float]:
    options = CASES[name]
    marker = uuid.uuid4().hex[:10]
    path = f"/slow/{marker}-{{n}}?delay=0.05" if "per_host" in options else f"/ok/{marker}-{{n}}"
    done = subprocess.run(
        [sys.executable, __file__, "--child", server_url + path, json.dumps(options)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    run = json.loads(done.stdout.strip().splitlines()[-1])
    assert run["ok"] == COUNT, run
    return {"cpu_ms": 1000 * run["cpu"] / COUNT, "wall": run["wall"], "marker": marker}


def measure(repeats: int = REPEATS) -> dict[str, dict[str, float]]:
    """Each case's median CPU ms a request and, for the rate, the rate the server saw."""
    server = start_mock_server()
    try:
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in CASES}
        for _ in range(repeats):
            for name in CASES:  # (interleaved: a load spike touches every case alike)
                run = one_run(server.url, name)
                if name.startswith("rate"):
                    arrivals = [entry["t"] for entry in server.log(str(run["marker"]))]
                    run["rate"] = (len(arrivals) - 1) / (max(arrivals) - min(arrivals))
                runs[name].append(run)
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)
    return {
        name: {
            key: statistics.median(run[key] for run in case)
            for key in ("cpu_ms", "wall", "rate")
            if key in case[0]
        }
        for name, case in runs.items()
    }


def section(quick: bool = False) -> list[str]:
    """The benchmark's lines for docs/benchmarks.md."""
    medians = measure(1 if quick else REPEATS)
    base = medians["no limit"]["cpu_ms"]
    rated = medians['rate="100/s"']
    return [
        f"{HEADING}: CPU while a limit holds workers",
        "",
        f"`fetch_all` of {COUNT} requests at concurrency {CONCURRENCY} to the mock server, "
        "each run in a fresh process (`scripts/bench_quiet.py`; the median of "
        f"{1 if quick else REPEATS}). Targets: CPU per request under `rate` within 2x of the "
        f"run without a limit (here {rated['cpu_ms'] / base:.2f}x), the rate reached within "
        f"3 % (here {rated['rate']:.1f}/s of 100/s).",
        "",
        "| run | CPU ms/request | ratio to no limit | seconds |",
        "| --- | ---: | ---: | ---: |",
        *(
            f"| {name} | {case['cpu_ms']:.2f} | {case['cpu_ms'] / base:.2f} | {case['wall']:.1f} |"
            for name, case in medians.items()
        ),
    ]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        print("\n".join(section()))
