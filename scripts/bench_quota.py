"""The cost of the announced limits over a long run: client CPU per request against a server
whose every answer carries OpenAI's ``x-ratelimit-*`` headers (a count far from spent), at
2 000, 20 000 and 100 000 requests, and with ``quota_headers=False`` beside it.

    python scripts/bench_quota.py [--quick]

The bookkeeping must cost the same at request 100 000 as at request 2 000 (within 20 %) and
stay within 1.3x of not reading the headers at all. The server runs in a process of its own;
the CPU is the client process's (every thread), measured around ``fetch_all`` only. Each size
is measured ``REPEATS`` times, headers on and off in turn, every size in each round, and their
median kept: one run's CPU moves by a fifth with the machine's other work, at any size.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPEATS = 3

SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = 0
    def do_GET(self):
        Handler.served += 1
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-ratelimit-limit-requests", "1000000000")
        self.send_header("x-ratelimit-remaining-requests", str(1000000000 - Handler.served))
        self.send_header("x-ratelimit-reset-requests", "6ms")
        self.send_header("x-ratelimit-limit-tokens", "1000000000")
        self.send_header("x-ratelimit-remaining-tokens", "999999000")
        self.send_header("x-ratelimit-reset-tokens", "1s")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_port, flush=True)
server.serve_forever()
"""

CLIENT = """
import json, sys, time
from batchsync import fetch_all
port, count, headers = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "on"
urls = [f"http://127.0.0.1:{port}/{n}" for n in range(count)]
started, cpu = time.monotonic(), time.process_time()
rs = fetch_all(urls, concurrency=16, attempts=1, quota_headers=headers)
print(json.dumps({"cpu_ms": (time.process_time() - cpu) * 1000 / count, "ok": len(rs.ok),
                  "seconds": time.monotonic() - started}))
"""

# The headers' own cost apart from a run's threads, in one thread on a clock that moves 1 ms an
# attempt (so that 100 000 attempts outlast the minute an ended attempt is kept): reading an
# answer's headers, and the quota gate's taking and answer of an attempt, 16 in flight.
PARTS = """
import json, sys, time
from urllib3 import HTTPHeaderDict
from batchsync.http.quota import answer_limits
from batchsync.limits.quota import AnnouncedCounts
count, clock = int(sys.argv[1]), [0.0]
def answer(served):
    return HTTPHeaderDict([("Content-Type", "application/json"), ("Content-Length", "12"),
        ("Date", "Mon, 07 Dec 2026 09:00:00 GMT"), ("Server", "bench"),
        ("x-ratelimit-limit-requests", "1000000000"),
        ("x-ratelimit-remaining-requests", str(1000000000 - served)),
        ("x-ratelimit-reset-requests", "6ms"), ("x-ratelimit-limit-tokens", "1000000000"),
        ("x-ratelimit-remaining-tokens", "999999000"), ("x-ratelimit-reset-tokens", "1s")])
answers = [answer(served) for served in range(count)]
started = time.process_time()
said = [answer_limits(headers, time.time)[1] for headers in answers]
read = time.process_time() - started
counts, flying = AnnouncedCounts(lambda: clock[0]), []
started = time.process_time()
for served in range(count):
    clock[0] += 0.001
    flying.append((counts.take("host", 0)[0], clock[0]))
    if len(flying) == 16:
        mark, sent = flying.pop(0)
        counts.ended("host", mark, said[served], sent, counted=False)
kept = time.process_time() - started
print(json.dumps({"read_us": read * 1e6 / count, "kept_us": kept * 1e6 / count}))
"""


def parts(count: int) -> dict[str, float]:
    """The headers' own cost an attempt, in microseconds, over ``count`` attempts."""
    done = subprocess.run(
        [sys.executable, "-c", PARTS, str(count)], cwd=ROOT, capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    figures: dict[str, float] = json.loads(done.stdout)
    return figures


def measure(port: int, count: int, headers: bool) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(port), str(count), "on" if headers else "off"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    figures: dict[str, float] = json.loads(done.stdout)
    if figures["ok"] != count:
        raise SystemExit(f"only {figures['ok']} of {count} requests succeeded")
    return figures


def medians(
    port: int, sizes: list[int], repeats: int
) -> list[tuple[int, dict[str, float], dict[str, float]]]:
    """Per size, the median CPU per request of ``repeats`` runs with the headers read and not:
    each round runs every size, headers on and off in turn, so that a machine slower for a
    while slows every size alike, not the one measured then."""
    on: dict[int, list[float]] = {size: [] for size in sizes}
    off: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats):
        for size in sizes:
            on[size].append(measure(port, size, True)["cpu_ms"])
            off[size].append(measure(port, size, False)["cpu_ms"])
    return [
        (size, {"cpu_ms": statistics.median(on[size])}, {"cpu_ms": statistics.median(off[size])})
        for size in sizes
    ]


def section(quick: bool = False) -> list[str]:
    """The benchmark's lines for docs/benchmarks.md."""
    sizes = [2_000, 20_000] if quick else [2_000, 20_000, 100_000]
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        rows = medians(port, sizes, REPEATS)
    finally:
        server.terminate()
        server.wait(timeout=10)
    first, last = rows[0][1]["cpu_ms"], rows[-1][1]["cpu_ms"]
    worst = max(on["cpu_ms"] / off["cpu_ms"] for _, on, off in rows)
    alone = [(size, parts(size)) for size in (sizes[0], sizes[-1])]
    return [
        "## Announced limits over a long run",
        "",
        "Client CPU per request against answers that all carry OpenAI's `x-ratelimit-*` "
        f"headers, `-c 16` (`scripts/bench_quota.py`; the median of {REPEATS} runs). Targets: "
        "flat from the first size to the "
        f"last within 20 % (here {last / first:.2f}x), within 1.3x of `quota_headers=False` "
        f"(here at most {worst:.2f}x).",
        "",
        "| requests | CPU ms/request, headers read | the same, `quota_headers=False` | ratio |",
        "| ---: | ---: | ---: | ---: |",
        *(
            f"| {size:,} | {on['cpu_ms']:.3f} | {off['cpu_ms']:.3f} | "
            f"{on['cpu_ms'] / off['cpu_ms']:.2f} |"
            for size, on, off in rows
        ),
        "",
        "The headers' own cost, one thread, in microseconds an attempt (reading an answer's "
        "headers; the quota gate's taking and answer of it, 16 in flight):",
        "",
        "| attempts | reading the headers | the gate's bookkeeping |",
        "| ---: | ---: | ---: |",
        *(f"| {size:,} | {cost['read_us']:.1f} | {cost['kept_us']:.1f} |" for size, cost in alone),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    print("\n".join(section(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
