"""``make bench``: batchsync against the alternatives, measured in one run on this machine.

    python scripts/bench.py               # the full run (about 15 minutes on 2 cores)
    python scripts/bench.py --quick       # one repeat, concurrency 32 and 64 only
    python scripts/bench.py --only llm    # the "LLM batch" section alone (about 3 minutes)
    python scripts/bench.py --only quiet  # the limiter's CPU while it holds workers (1 minute)
    python scripts/bench.py --only processes  # --processes 2 against 1 (about 3 minutes)
    python scripts/bench.py --only defaults   # the defaults against a hand-written pool (25 min)

Every method runs in its own process (``scripts/bench_client.py``), interleaved and repeated,
against (a) a fast local keep-alive server (nginx when installed, else the bundled asyncio
server) and (b) a server that answers after 50 ms (``scripts/bench_server.py``). Reported per
method and concurrency: median requests/s, CPU ms per request, efficiency against the ideal
N / 50 ms, connections the server saw opened, peak RSS, and the ratio to the hand-rolled
baseline of the same run. A peer that is not installed is skipped with a note. Then the CLI's
peak RSS for 10^4..10^6 items, and batchsync's speed targets checked against these medians.
Then an LLM batch against RPM and TPM limits (``scripts/bench_llm.py``), and the cost of the
announced limits over a long run (``scripts/bench_quota.py``), and the CPU a limit costs while
it holds most workers waiting (``scripts/bench_quiet.py``), and the command line from two
processes against one (``scripts/bench_processes.py``), and the defaults against a hand-written
pool on the fault server (``scripts/bench_defaults.py``). Writes
docs/benchmarks.md and docs/benchmarks.png; ``--only llm`` rewrites only that section.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_defaults  # noqa: E402
import bench_llm  # noqa: E402
import bench_processes  # noqa: E402
import bench_quiet  # noqa: E402
import bench_quota  # noqa: E402
from bench_durability import peak_rss  # noqa: E402

from tests.mockserver import start_mock_server  # noqa: E402

CLIENT = ROOT / "scripts" / "bench_client.py"
PEERS = {"requests-futures": "requests_futures", "httpx": "httpx", "aiohttp": "aiohttp"}
METHODS = ["baseline", "requests-futures", "httpx", "urllib3", "aiohttp", "batchsync",
           "batchsync-cli"]  # fmt: skip
LATENCY = 0.05

NGINX_CONF = """
worker_processes 1;
error_log {dir}/error.log;
pid {dir}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  keepalive_timeout 300s;
  server {{
    listen 127.0.0.1:{port};
    location = /nginx_status {{ stub_status; }}
    location / {{ default_type application/json; return 200 '{{"ok":true}}'; }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Server:
    """A running benchmark server and how to read the connections it has accepted."""

    name: str
    url: str
    process: subprocess.Popen[bytes] | None
    nginx_dir: Path | None = None

    def connections(self) -> int:
        """Connections accepted so far, this request's own included."""
        if self.nginx_dir is not None:
            with urllib.request.urlopen(f"{self.url}/nginx_status", timeout=10) as reply:
                return int(reply.read().decode().splitlines()[2].split()[0])
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as reply:
            return int(json.load(reply)["connections"])

    def stop(self) -> None:
        if self.nginx_dir is not None:
            subprocess.run(
                ["nginx", "-p", str(self.nginx_dir), "-c", str(self.nginx_dir / "nginx.conf"),
                 "-s", "stop"], check=False, capture_output=True,
            )  # fmt: skip
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)


def start_asyncio_server(delay: float) -> Server:
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "bench_server.py"), "--delay", str(delay)],
        stdout=subprocess.PIPE,
    )
    assert process.stdout is not None
    url = process.stdout.readline().decode().split()[-1]
    return Server(f"asyncio server, {delay * 1000:.0f} ms", url, process)


def start_fast_server(folder: Path) -> tuple[Server, str]:
    """nginx when it is installed; else the asyncio server with no delay (and a note)."""
    if shutil.which("nginx") is None:
        note = "nginx is not installed: the fast server is the bundled asyncio server (uvloop)"
        return start_asyncio_server(0.0), note
    port = free_port()
    conf = folder / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=folder, port=port))
    subprocess.run(["nginx", "-p", str(folder), "-c", str(conf)], check=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"{url}/nginx_status", timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return Server("nginx (1 worker), keep-alive", url, None, nginx_dir=folder), ""


@dataclass
class Runs:
    """What repeated runs of one method at one concurrency measured."""

    rates: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)
    rss: list[float] = field(default_factory=list)


def run_client(
    method: str, server: Server, concurrency: int, count: int, folder: Path
) -> dict[str, float]:
    if method != "batchsync-cli":
        done = subprocess.run(
            [sys.executable, str(CLIENT), method, server.url, str(concurrency), str(count)],
            capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]
    urls = folder / "urls.txt"
    urls.write_text("".join(f"{server.url}/item/{n}\n" for n in range(count)))
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "batchsync", str(urls), "-c", str(concurrency), "-q",
         "-o", str(folder / "out"), "--fresh"], cwd=folder,  # (each measure a run of its own)
    )  # fmt: skip
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"the CLI run failed with {status}")
    return {"ok": count, "seconds": seconds, "cpu": usage.ru_utime + usage.ru_stime,
            "rss_mib": usage.ru_maxrss / 1024}  # fmt: skip


def measure(
    server: Server,
    methods: list[str],
    levels: list[int],
    *,
    count_for: dict[int, int],
    repeats: int,
    folder: Path,
) -> dict[tuple[str, int], Runs]:
    results: dict[tuple[str, int], Runs] = {}
    for repeat in range(repeats):
        for concurrency in levels:
            order = list(methods)
            random.Random(repeat * 1000 + concurrency).shuffle(order)
            for method in order:
                count = count_for[concurrency]
                before = server.connections()
                report = run_client(method, server, concurrency, count, folder)
                opened = server.connections() - before - 1  # less the status request's own
                runs = results.setdefault((method, concurrency), Runs())
                runs.rates.append(count / report["seconds"])
                runs.cpu_ms.append(report["cpu"] * 1000 / count)
                runs.connections.append(opened)
                runs.rss.append(report["rss_mib"])
                rate = count / report["seconds"]
                print(f"  {server.name[:14]:14} c={concurrency:<3} {method:17} "
                      f"{rate:7.0f} req/s  {opened:4d} conns", flush=True)  # fmt: skip
    return results


def table(
    results: dict[tuple[str, int], Runs], methods: list[str], levels: list[int], ideal: bool
) -> list[str]:
    head = "| method | concurrency | req/s (median) | ratio to baseline | CPU ms/req |"
    head += " efficiency vs N/L |" if ideal else ""
    head += " connections | peak RSS MiB |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for concurrency in levels:
        base = statistics.median(results[("baseline", concurrency)].rates)
        for method in methods:
            runs = results[(method, concurrency)]
            rate = statistics.median(runs.rates)
            row = (f"| {method} | {concurrency} | {rate:.0f} | {rate / base:.2f} | "
                   f"{statistics.median(runs.cpu_ms):.2f} |")  # fmt: skip
            if ideal:
                row += f" {rate / (concurrency / LATENCY):.0%} |"
            row += f" {max(runs.connections)} | {max(runs.rss):.0f} |"
            lines.append(row)
    return lines


def targets(
    fast: dict[tuple[str, int], Runs],
    slow: dict[tuple[str, int], Runs],
    memory: list[tuple[int, float, float]],
    failing: list[tuple[int, float, float]],
) -> list[str]:
    """The speed targets batchsync is held to, each checked against this run's medians."""

    def rate(results: dict[tuple[str, int], Runs], method: str, concurrency: int) -> float | None:
        runs = results.get((method, concurrency))
        return statistics.median(runs.rates) if runs else None

    checks: list[tuple[str, str, bool | None]] = []
    ours, base = rate(fast, "batchsync", 32), rate(fast, "baseline", 32)
    if ours and base:
        checks.append(("fast server, c=32: ≥ 2.5x the baseline", f"{ours / base:.2f}x",
                       ours / base >= 2.5))  # fmt: skip
    ours = rate(slow, "batchsync", 64)
    if ours:
        share = ours / (64 / LATENCY)
        checks.append(("50 ms server, c=64: ≥ 85 % of N/L", f"{share:.0%}", share >= 0.85))
    for name, results in (("fast server", fast), ("50 ms server", slow)):
        ours, peer = rate(results, "batchsync", 256), rate(results, "urllib3", 256)
        if ours and peer:
            checks.append((f"{name}, c=256: ahead of urllib3 threads",
                           f"{ours:.0f} vs {peer:.0f} req/s", ours > peer))  # fmt: skip
    most = max(
        (max(runs.connections) / concurrency
         for results in (fast, slow) for (method, concurrency), runs in results.items()
         if method.startswith("batchsync")),
        default=0.0,
    )  # fmt: skip
    checks.append(("connections opened ≤ concurrency", f"at most {most:.0%} of it", most <= 1))
    for what, runs in (
        ("CLI peak RSS flat in the number of items", memory),
        ("... when every item fails at once (the journal's worst case)", failing),
    ):
        if runs:
            peaks = [rss for _, rss, _ in runs]
            flat = max(peaks) <= 1.25 * min(peaks)
            shown = " / ".join(f"{rss:.0f}" for rss in peaks)
            checks.append((what, f"{shown} MiB", flat))
    lines = ["| target | measured | met |", "| --- | --- | --- |"]
    lines += [f"| {what} | {value} | {'yes' if met else 'no'} |" for what, value, met in checks]
    return lines


def plot(
    fast: dict[tuple[str, int], Runs], slow: dict[tuple[str, int], Runs],
    methods: list[str], levels: list[int], path: Path,
) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for axis, results, title in ((axes[0], fast, "fast server"), (axes[1], slow, "50 ms server")):
        for method in methods:
            rates = [statistics.median(results[(method, c)].rates) for c in levels]
            axis.plot(levels, rates, marker="o", label=method,
                      linewidth=2.5 if method.startswith("batchsync") else 1.2)  # fmt: skip
        if results is slow:
            axis.plot(levels, [c / LATENCY for c in levels], "k--", label="ideal N / 50 ms")
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(c) for c in levels])
        axis.set_xlabel("concurrency")
        axis.set_ylabel("requests/s (median)")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def available_methods() -> tuple[list[str], list[str]]:
    methods, notes = [], []
    for method in METHODS:
        module = PEERS.get(method)
        if module is not None:
            probe = subprocess.run(
                [sys.executable, "-c", f"import {module}"], capture_output=True, check=False
            )
            if probe.returncode != 0:
                notes.append(f"{method} is not installed: skipped")
                continue
        methods.append(method)
    return methods, notes


def versions() -> str:
    probe = (
        "import importlib.metadata as m\n"
        "for n in ['requests','urllib3','requests-futures','httpx','aiohttp','batchsync']:\n"
        "    try: print(f'{n} {m.version(n)}')\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    return ", ".join(done.stdout.split("\n")[:-1])


@contextmanager
def servers(folder: Path) -> Iterator[tuple[Server, Server, str]]:
    fast, note = start_fast_server(folder)
    slow = start_asyncio_server(LATENCY)
    try:
        yield fast, slow, note
    finally:
        fast.stop()
        slow.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument(
        "--only",
        choices=["llm", "quiet", "processes", "defaults"],
        help="run this section alone and rewrite it",
    )
    args = parser.parse_args()
    llm_repeats = 1 if args.quick else 2
    if args.only is not None:
        if args.only == "llm":
            lines, heading = bench_llm.section(llm_repeats), bench_llm.HEADING
        elif args.only == "quiet":
            lines, heading = bench_quiet.section(args.quick), bench_quiet.HEADING
        elif args.only == "defaults":
            lines, heading = bench_defaults.section(args.quick), bench_defaults.HEADING
        else:
            lines, heading = bench_processes.section(args.quick), bench_processes.HEADING
        text = args.out.read_text(encoding="utf-8") if args.out.exists() else "# Benchmarks\n"
        args.out.write_text(bench_llm.replace_section(text, lines, heading))
        print(f"wrote the {args.only} section of {args.out}")
        return
    levels = [32, 64] if args.quick else [8, 32, 64, 256]
    repeats = 1 if args.quick else args.repeats
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    methods, notes = available_methods()
    fast_counts = dict.fromkeys(levels, 3000 if args.quick else 8000)
    slow_counts = {c: min(15_000, int(c / LATENCY * 3)) for c in levels}
    with tempfile.TemporaryDirectory(prefix="batchsync-bench-") as tmp:
        folder = Path(tmp)
        with servers(folder) as (fast_server, slow_server, note):
            if note:
                notes.append(note)
            print(f"fast server: {fast_server.name}; slow server: {slow_server.name}")
            fast = measure(
                fast_server, methods, levels, count_for=fast_counts, repeats=repeats, folder=folder
            )
            slow = measure(
                slow_server, methods, levels, count_for=slow_counts, repeats=repeats, folder=folder
            )
        mock = start_mock_server()
        try:
            memory = [(size, *peak_rss(size, mock.url, folder)) for size in sizes]
            failing = [(size, *peak_rss(size, mock.url, folder, None)) for size in sizes]
        finally:
            mock.process.terminate()
            mock.process.wait(timeout=10)
    llm = bench_llm.section(llm_repeats)
    quota = bench_quota.section(args.quick)
    quiet = bench_quiet.section(args.quick)
    processes = bench_processes.section(args.quick)
    defaults = bench_defaults.section(args.quick)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    picture = args.out.with_suffix(".png")
    plot(fast, slow, methods, levels, picture)
    goals = targets(fast, slow, memory, failing)
    print("\n".join(goals))
    lines = [
        "# Benchmarks",
        "",
        f"Written by `make bench` (`python scripts/bench.py{' --quick' if args.quick else ''}`) "
        f"on {time.strftime('%Y-%m-%d')}: {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {versions()}. Every method runs in its own process, "
        f"interleaved, {repeats} time(s) per cell; medians are shown, and ratios are to the "
        "hand-rolled baseline (ThreadPoolExecutor + one requests.Session per thread) measured "
        "in the same run. Client and server share the machine's cores. `batchsync` is "
        "`fetch_all`; `batchsync-cli` is `python -m batchsync` with its journal, output files "
        "and process start-up included.",
        "",
        *(f"* {note}" for note in notes),
        "",
        "## Targets",
        "",
        "batchsync is `fetch_all` with all its machinery on (results, retry bookkeeping, "
        "limits); medians of this run.",
        "",
        *goals,
        "",
        f"![requests/s against concurrency]({picture.name})",
        "",
        f"## Fast server ({fast_server.name}), {fast_counts[levels[0]]} requests a run",
        "",
        *table(fast, methods, levels, ideal=False),
        "",
        f"## 50 ms server ({slow_server.name}), {'/'.join(map(str, slow_counts.values()))} "
        "requests a run",
        "",
        *table(slow, methods, levels, ideal=True),
        "",
        "## Memory: CLI peak RSS against the number of items",
        "",
        "1 item in 100 is a real request to the mock server, the rest fail fast as "
        "`invalid_request` (`scripts/bench_durability.py`).",
        "",
        "| items | peak RSS MiB | seconds |",
        "| ---: | ---: | ---: |",
        *(f"| {size:,} | {rss:.0f} | {seconds:.1f} |" for size, rss, seconds in memory),
        "",
        "Every item failing at once (no request sent): results come faster than the journal "
        "commits them, and workers wait for it rather than queue without bound.",
        "",
        "| items | peak RSS MiB | seconds |",
        "| ---: | ---: | ---: |",
        *(f"| {size:,} | {rss:.0f} | {seconds:.1f} |" for size, rss, seconds in failing),
        "",
        *llm,
        "",
        *quota,
        "",
        *quiet,
        "",
        *processes,
        "",
        *defaults,
    ]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out} and {picture}")


if __name__ == "__main__":
    main()
