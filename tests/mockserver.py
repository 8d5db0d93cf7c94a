"""The project's own mock server, started as a real process on a free port."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def mock_server_command(port: int) -> list[str]:
    """The command that starts the mock server on ``port`` (0: a free one); run it from ROOT,
    so that this tree's batchsync is the one started."""
    return [sys.executable, "-m", "batchsync.mock", "--port", str(port)]


@dataclass
class MockServerProcess:
    """A running ``python -m batchsync.mock`` and a window on what it saw."""

    url: str
    process: subprocess.Popen[str]

    def get(self, path: str) -> dict[str, Any]:
        # urllib, not requests: the stats must not ride on the pools under test.
        with urllib.request.urlopen(self.url + path, timeout=10) as response:
            payload: dict[str, Any] = json.load(response)
            return payload

    def stats(self) -> dict[str, Any]:
        return self.get("/stats")

    def reset(self) -> None:
        self.get("/stats/reset")

    def count(self, target: str) -> int:
        counts: dict[str, int] = self.stats()["counts"]
        return counts.get(target, 0)

    def log(self, marker: str) -> list[dict[str, Any]]:
        """The requests whose target contains ``marker``, by arrival."""
        entries: list[dict[str, Any]] = self.get("/stats?log=1")["log"]
        return sorted((e for e in entries if marker in e["target"]), key=lambda e: e["t"])


def busiest_second(times: list[float]) -> int:
    """The most arrivals in any window of one second."""
    times = sorted(times)
    most, start = 0, 0
    for end, moment in enumerate(times):
        while moment - times[start] >= 1.0:
            start += 1
        most = max(most, end - start + 1)
    return most


def in_flight_peak(entries: list[dict[str, Any]]) -> int:
    """The most requests the server was handling at once, from their arrival and end times."""
    events = sorted([(e["t"], 1) for e in entries] + [(e["end"], -1) for e in entries])
    peak = current = 0
    for _, change in events:
        current += change
        peak = max(peak, current)
    return peak


def start_mock_server() -> MockServerProcess:
    process = subprocess.Popen(mock_server_command(0), stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"mock server did not start: {line!r}")
    return MockServerProcess(line.split()[-1], process)
