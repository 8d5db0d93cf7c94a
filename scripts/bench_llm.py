"""The "LLM batch" section of ``make bench``: a batch of chat requests of mixed length against
the mock LLM API (``batchsync/mock/llm.py``) limited to RPM 600 and TPM 60 000, sent by
batchsync (CLI and library) and by the usual asyncio script (``scripts/llm_peer.py``).

    python scripts/bench.py --only llm      # this section alone, into docs/benchmarks.md
    python scripts/bench_llm.py             # the same, printed only

The mock's minute is shortened to WINDOW seconds with the same counts (600 requests and
60 000 tokens a window), and every rate given to a client is scaled the same way, so a run
takes seconds where the real limits would take minutes. Each method runs in its own process
against a key of its own, interleaved and repeated. Measured from the mock's own counts:
the tokens admitted per window after the first one (until the last request admitted) over
the TPM limit, and the 429s it answered, in all and after the first window.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.mockserver import MockServerProcess, start_mock_server  # noqa: E402

ROWS = 2000
RPM = 600
TPM = 60_000
WINDOW = 6.0  # seconds in the mock's "minute": 10 times faster than the real thing
LATENCY = 0.1  # seconds per answer (a second, scaled the same)
CONCURRENCY = 32
ATTEMPTS = 5  # the cookbook script's
METHODS = ["batchsync-cli", "batchsync", "peer", "peer-75%"]
HEADROOM = 0.75  # what the cookbook tells its users to give the script ("50% or 75%")
HEADING = "## LLM batch"


def per_minute(count: float) -> str:
    """A count a window as the rate a client is given: per real minute, scaled."""
    return f"{round(count * 60 / WINDOW)}/min"


def per_second(count: float) -> str:
    """A count a window as batchsync is given it: the limit itself, a second's share (no
    second over it keeps every window of whole seconds to the count)."""
    return f"{count / WINDOW:g}/s"


def write_rows(path: Path, count: int) -> int:
    """The cookbook's input: a chat request body a line with its ``metadata``; prompts of
    10 to 160 tokens (a third with a system prompt) and max_tokens of 16 to 128. Returns what
    the mock will count for them all (prompt + max_tokens)."""
    chance = random.Random(28)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "sigma"]
    total = 0
    with path.open("w", encoding="utf-8") as out:
        for number in range(count):
            size = chance.randint(40, 640)  # characters: 10 to 160 tokens
            text = " ".join(chance.choice(words) for _ in range(size // 6))[:size]
            messages = [{"role": "user", "content": text}]
            if number % 3 == 0:
                messages.insert(0, {"role": "system", "content": "Answer in one line."})
            budget = chance.choice([16, 32, 64, 128])
            row = {
                "model": "gpt-mock",
                "messages": messages,
                "max_tokens": budget,
                "metadata": {"row_id": number},
            }
            out.write(json.dumps(row) + "\n")
            total += 2 + sum(4 + -(-len(m["content"]) // 4) for m in messages) + budget
    return total


def flags(options: dict[str, str]) -> list[str]:
    return [part for pair in options.items() for part in pair]


def command(method: str, url: str, rows: Path, folder: Path) -> list[str]:
    if method == "batchsync-cli":
        options = {"--url": url, "--method": "POST", "--rate": per_second(RPM),
                   "--token-rate": per_second(TPM), "-c": str(CONCURRENCY),
                   "--attempts": str(ATTEMPTS), "-o": str(folder / "cli-out")}  # fmt: skip
        batchsync = [sys.executable, "-m", "batchsync", str(rows), *flags(options)]
        return [*batchsync, "--row-as-body", "-q", "--fresh"]
    if method == "batchsync":
        return [sys.executable, str(Path(__file__).resolve()), "library", str(rows), url]
    share = HEADROOM if method == "peer-75%" else 1.0
    options = {"--url": url, "--rpm": f"{RPM * share:g}", "--tpm": f"{TPM * share:g}",
               "--window": f"{WINDOW:g}",
               "-o": str(folder / f"peer-{uuid.uuid4().hex[:6]}.jsonl")}  # fmt: skip
    return [sys.executable, str(ROOT / "scripts" / "llm_peer.py"), str(rows), *flags(options)]


def run_library(rows: Path, url: str) -> None:
    """The library form in this (child) process: fetch_all over the rows, metadata as ids."""
    from batchsync import fetch_all

    items = []
    for line in rows.read_text(encoding="utf-8").splitlines():
        body = json.loads(line)
        metadata = body.pop("metadata", None)
        items.append({"url": url, "method": "POST", "json": body, "id": metadata})
    limits: dict[str, Any] = {
        "rate": per_second(RPM),
        "token_rate": per_second(TPM),
    }
    results = fetch_all(items, concurrency=CONCURRENCY, attempts=ATTEMPTS, progress=False, **limits)
    print(json.dumps({"ok": sum(1 for r in results if r.ok), "items": len(results)}))


@dataclass
class Measure:
    """One run of one method, as the mock counted it."""

    seconds: float
    answered: int
    utilization: float | None  # tokens a window after the first, over the TPM
    refused: int
    refused_later: int  # after the first window


def measure(log: list[list[Any]], seconds: float) -> Measure:
    """What the mock's log says of a run. The share of the TPM is taken over the whole
    windows between the end of the first one and the last request admitted: a sliding window
    holds each of them to the TPM, so 100 % is the most a client can get."""
    admitted = [(t, tokens) for t, kind, tokens in log if kind == "admitted"]
    refused = [t for t, kind, _ in log if kind == "rejected"]
    last = max((t for t, _ in admitted), default=0.0)
    whole = int((last - WINDOW) // WINDOW)
    steady = sum(tokens for t, tokens in admitted if WINDOW <= t < WINDOW * (whole + 1))
    utilization = steady / (TPM * whole) if whole > 0 else None
    return Measure(seconds, len(admitted), utilization, len(refused),
                   sum(1 for t in refused if t >= WINDOW))  # fmt: skip


@dataclass
class Runs:
    measures: list[Measure] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def run_once(method: str, server: MockServerProcess, rows: Path, folder: Path) -> Measure | str:
    """One run in its own process against a fresh key; what it measured, or why it failed."""
    key = f"{method.rstrip('%')}-{uuid.uuid4().hex[:8]}"
    limits = f"rpm={RPM},tpm={TPM},window={WINDOW:g},latency={LATENCY:g}"
    url = f"{server.url}/llm/{key}/{limits}/v1/chat/completions"
    started = time.monotonic()
    done = subprocess.run(
        command(method, url, rows, folder),
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    seconds = time.monotonic() - started
    try:
        log = server.get(f"/llm/{key}/stats?log=1")["log"]
    except OSError:  # (no request reached the mock: the run failed before sending)
        lines = (done.stderr or done.stdout).strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"
    return measure(log, seconds)


def run_all_methods(repeats: int, methods: list[str]) -> tuple[dict[str, Runs], int]:
    results = {method: Runs() for method in methods}
    server = start_mock_server()
    try:
        with tempfile.TemporaryDirectory(prefix="batchsync-llm-") as tmp:
            folder = Path(tmp)
            rows = folder / "rows.jsonl"
            tokens = write_rows(rows, ROWS)
            for repeat in range(repeats):
                order = list(methods)
                random.Random(repeat).shuffle(order)
                for method in order:
                    outcome = run_once(method, server, rows, folder)
                    if isinstance(outcome, str):
                        results[method].failures.append(outcome)
                        print(f"  llm {method:14} failed: {outcome}", flush=True)
                        continue
                    results[method].measures.append(outcome)
                    shown = f"{outcome.utilization:.0%}" if outcome.utilization else "-"
                    print(
                        f"  llm {method:14} {outcome.seconds:5.1f} s  {shown:>4} of TPM  "
                        f"{outcome.refused} x 429 ({outcome.refused_later} later)",
                        flush=True,
                    )
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)
    return results, tokens


def table(results: dict[str, Runs]) -> list[str]:
    lines = [
        "| method | answered | seconds | tokens a window after the first / TPM | 429s | "
        "429s after the first window |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, runs in results.items():
        if not runs.measures:
            reason = runs.failures[0] if runs.failures else "not run"
            lines.append(f"| {method} | not run: {reason.replace('|', '/')} | | | | |")
            continue
        shares = [m.utilization for m in runs.measures if m.utilization is not None]
        share = f"{statistics.median(shares):.0%}" if shares else "-"
        lines.append(
            f"| {method} | {min(m.answered for m in runs.measures)} | "
            f"{statistics.median(m.seconds for m in runs.measures):.1f} | {share} | "
            f"{' / '.join(str(m.refused) for m in runs.measures)} | "
            f"{' / '.join(str(m.refused_later) for m in runs.measures)} |"
        )
    return lines


def section(repeats: int, methods: list[str] = METHODS) -> list[str]:
    """The section's Markdown, measured now."""
    results, tokens = run_all_methods(repeats, methods)
    return [
        f"{HEADING}: {ROWS:,} chat requests against RPM {RPM}, TPM {TPM:,}",
        "",
        f"The mock LLM API (`batchsync/mock/llm.py`) counts {RPM} requests and {TPM:,} tokens a "
        f"sliding window of {WINDOW:g} s, a minute shortened {60 / WINDOW:g} times with the "
        "same counts (every rate below is scaled the same way), and answers after "
        f"{LATENCY * 1000:.0f} ms. It counts a request as OpenAI does, when it admits it: the "
        f"prompt plus `max_tokens`; the {ROWS:,} rows (prompts of 10 to 160 tokens, "
        f"`max_tokens` 16 to 128, the cookbook's JSONL with `metadata`) count {tokens:,} "
        f"tokens, {tokens / TPM:.1f} windows' worth. `batchsync-cli` is `python -m batchsync "
        f"rows.jsonl --url …/v1/chat/completions --method POST --row-as-body --rate "
        f"{per_second(RPM)} --token-rate {per_second(TPM)} -c {CONCURRENCY} "
        f"--attempts {ATTEMPTS} -q` (the limits themselves, a second's share of each window's "
        "count); `batchsync` is `fetch_all` with the "
        "same rates (`rate=`, `token_rate=`), the metadata as each item's id; `peer` is "
        "`scripts/llm_peer.py`, "
        "the asyncio script written as the OpenAI cookbook's parallel processor is (request "
        "and token buckets of a minute's worth refilled continuously, 5 attempts, a 15 s "
        f"pause after a 429, here {15 * WINDOW / 60:g} s as the minute is shortened), given "
        f"the limits themselves; `peer-75%` is the same given {HEADROOM:.0%} of them, the "
        "headroom the cookbook advises. From the mock's counts: the tokens admitted a window "
        "over the TPM, in the whole windows between the end of the first one and the last "
        "request admitted (the sliding window holds each to the TPM: 100 % is the most; median "
        f"of the runs), and the 429s of each run ({repeats} run(s) each, interleaved).",
        "",
        *table(results),
        "",
    ]


def replace_section(text: str, lines: list[str], heading: str = HEADING) -> str:
    """``text`` (a Markdown document) with its section under ``heading`` (the LLM one)
    replaced by ``lines``, or them added at the end."""
    document = text.rstrip("\n").split("\n")
    starts = [n for n, line in enumerate(document) if line.startswith(heading)]
    if not starts:
        return "\n".join([*document, "", *lines])
    start = starts[0]
    ends = [n for n in range(start + 1, len(document)) if document[n].startswith("## ")]
    end = ends[0] if ends else len(document)
    return "\n".join([*document[:start], *lines, *document[end:]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--methods", default=",".join(METHODS), help="a comma-separated list")
    commands = parser.add_subparsers(dest="command")
    child = commands.add_parser("library", help="(one run of the library form, in a child)")
    child.add_argument("rows", type=Path)
    child.add_argument("url")
    args = parser.parse_args()
    if args.command == "library":
        run_library(args.rows, args.url)
        return
    print("\n".join(section(args.repeats, args.methods.split(","))))


if __name__ == "__main__":
    main()
