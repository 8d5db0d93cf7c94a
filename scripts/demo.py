"""``make demo``: start the mock server, run batchsync on the bundled list and on the bundled
table of customers (templated, paginated, quota-aware), show what happened and what to try next.

    python scripts/demo.py                 # what `make demo` runs
    python scripts/demo.py --write-docs    # the same, then its output into the docs' samples
    python scripts/demo.py --check-docs    # the same, then the docs' samples checked against it

The samples are the blocks of docs/getting-started.md under a ``<!-- demo output: NAME -->``
line. What stays the same from run to run is checked as it is: the commands, which items fail
and how, the counts of items, requests and attempts, the kinds of wait. What cannot be the same
is normalised on both sides before they are compared (``comparable``): every figure in seconds
and every rate a second, and the order of the log lines of different items (concurrent items
answer in any order; an item's own lines keep theirs). Written samples show the Python as
``.venv/bin/python``, the outputs under ``demo-out`` and the mock API on port 8765.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import groupby
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "getting-started.md"
DEMO_OUT = ROOT / "demo-out"
SAMPLE_PORT = 8765
sys.path.insert(0, str(ROOT))

from tests.mockserver import start_mock_server  # noqa: E402


def shown(path: Path | str) -> str:
    """A path as a command typed in the repository's root would give it."""
    path = Path(path)
    return os.path.relpath(path, ROOT) if path.is_relative_to(ROOT) else str(path)


PYTHON = shown(sys.executable)


def run(command: list[str], comment: str) -> tuple[str, int]:
    """The transcript of one batchsync run (its log and summary in order with the rest), and
    its exit status."""
    done = subprocess.run(
        [sys.executable, *command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, check=False,
    )  # fmt: skip
    return f"{comment}\n$ {PYTHON} {shlex.join(command)}\n{done.stdout}", done.returncode


def results(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def listed(base: str, out: Path) -> tuple[str, int]:
    """The first run: seven requests, each with another fault, and the failed file."""
    template = (ROOT / "examples" / "demo-urls.txt").read_text(encoding="utf-8")
    urls = out / "urls.txt"
    urls.write_text(template.replace("{base}", base), encoding="utf-8")
    command = ["-m", "batchsync", shown(urls), "-o", shown(out / "batch"), "--no-progress", "-v"]
    comment = (
        f"# The mock API: {base}\n"
        "# A list of seven requests (examples/demo-urls.txt), each meeting another fault; -v logs\n"
        "# every retry and failure:"
    )
    text, status = run(command, comment)
    text += f"exit status: {status} (0 all ok, 1 some failed)\n\n"
    text += f"{'#':>2}  {'ok':<5} {'status':>6} {'tries':>5}  {'error kind':<13} url / error\n"
    for r in results(out / "batch-results.jsonl"):
        text += (
            f"{r['index']:>2}  {r['ok']!s:<5} {r['status_code'] or '-':>6} {r['attempts']:>5}  "
            f"{r['error_kind'] or '-':<13} {r['error'] or r['url']}\n"
        )
    failed = out / "batch-failed.jsonl"
    text += f"\n$ cat {shown(failed)}   # the failures, valid INPUT again\n"
    return text + failed.read_text(encoding="utf-8"), status


def orders(base: str, out: Path) -> tuple[str, int]:
    """The second run: a URL per row of a CSV, every page of each, under the API's quota."""
    # The mock API pages each customer's orders by Link headers, 2 a page, and allows 6
    # requests per 2-second window, saying so in X-RateLimit-* headers.
    template = (f"{base}/pages/link/customers/{{id}}/orders?since={{since}}&total={{orders}}"
                "&size=2&limit=6&window=2&family=demo")  # fmt: skip
    command = ["-m", "batchsync", "examples/customers.csv", "--url", template, "--paginate",
               "link", "--items", "items", "-c", "1", "-o", shown(out / "orders"),
               "--no-progress"]  # fmt: skip
    comment = (
        "# A CSV of customers: one templated URL per row, every page of each, under the quota\n"
        "# the API announces in its headers (6 requests per 2 s), one request at a time (-c 1):\n"
        "# each goes knowing what the last answer said is left, and none goes past the quota."
    )
    text, status = run(command, comment)
    text += f"exit status: {status}\n\n{'id':<8} {'ok':<5} {'pages':>5} {'orders':>6}  path\n"
    for r in results(out / "orders-results.jsonl"):
        path = str(r["url"]).removeprefix(base).split("?")[0]
        text += f"{r['id']!s:<8} {r['ok']!s:<5} {r['pages']:>5} {len(r['data']):>6}  {path}\n"
    return text, status


def next_steps(base: str, out: Path) -> str:
    """What to type next: the demo's Python, not the system's, which may lack batchsync's
    dependencies or pick up another batchsync."""
    port = base.rsplit(":", 1)[1]
    retry = ["-m", "batchsync", shown(out / "urls.txt"), "-o", shown(out / "batch"),
             "--retry-failed"]  # fmt: skip
    activate = Path(sys.executable).parent / "activate"
    or_activate = f"; or run\n# `. {shown(activate)}` first, then plain `python`"
    return (
        f"# Next, from this directory, with the demo's Python ({PYTHON}"
        f"{or_activate if activate.exists() else ''}). In another terminal, the mock API again:\n"
        f"#   {PYTHON} -m batchsync.mock --port {port}\n"
        "# then send the first run's failures again (the mock API fails them again):\n"
        f"$ {PYTHON} {shlex.join(retry)}\n"
    )


def sections(base: str, out: Path) -> Iterator[tuple[str, str]]:
    """The demo's output, section by section, as each is ready."""
    text, status = listed(base, out)
    yield "list", text
    if status not in (0, 1):
        raise SystemExit(status)
    text, status = orders(base, out)
    yield "orders", text
    if status:
        raise SystemExit(status)
    yield "next", next_steps(base, out)


@contextmanager
def mock_api(server: str | None) -> Iterator[str]:
    """The mock API's base URL: the one given, or one started for the demo."""
    if server:
        yield server.rstrip("/")
        return
    started = start_mock_server()
    try:
        yield started.url
    finally:
        started.process.terminate()
        started.process.wait(timeout=10)


def canonical(text: str, base: str, out: Path) -> str:
    """A sample as the docs show it, whichever Python, outputs and port made it."""
    port = base.rsplit(":", 1)[1]
    text = text.replace(shown(Path(sys.executable).parent) + "/", ".venv/bin/")
    text = text.replace(shown(out), "demo-out")
    return text.replace(f":{port}", f":{SAMPLE_PORT}").replace(
        f"--port {port}", f"--port {SAMPLE_PORT}"
    )


SECONDS = re.compile(r"\b\d+(\.\d+)? s\b")
PER_SECOND = re.compile(r"\b\d+(\.\d+)?/s\b")
LOG_LINE = re.compile(r"(retry|failed) ")
# The summary's waits: which gates held the run long enough to show (0.05 s) is timing too.
WAITED = re.compile(r"waited: [^;\n]*")


def comparable(sample: str) -> str:
    """A sample less what differs between runs: seconds, rates, which gates were waited at,
    the order of items' log lines."""
    masked = WAITED.sub("waited: …", SECONDS.sub("N s", sample))
    lines = PER_SECOND.sub("N/s", masked).splitlines()
    kept: list[str] = []
    for logged, group in groupby(lines, key=lambda line: bool(LOG_LINE.match(line))):
        same_kind = list(group)
        kept += sorted(same_kind, key=lambda line: line.split()[1]) if logged else same_kind
    return "\n".join(kept)


BLOCK = re.compile(r"(<!-- demo output: (\w+) -->\n```\n)(.*?)(```)", re.DOTALL)


def write_docs(samples: dict[str, str]) -> None:
    page = DOC.read_text(encoding="utf-8")
    DOC.write_text(BLOCK.sub(lambda m: m[1] + samples[m[2]] + m[4], page), encoding="utf-8")


def check_docs(samples: dict[str, str]) -> list[str]:
    """The differences between the docs' samples and this run's, once normalised."""
    differences: list[str] = []
    blocks = list(BLOCK.finditer(DOC.read_text(encoding="utf-8")))
    if sorted(match[2] for match in blocks) != sorted(samples):
        differences.append(f"{DOC.name} has samples {[m[2] for m in blocks]}, not {list(samples)}")
    for match in blocks:
        documented, made = comparable(match[3]), comparable(samples.get(match[2], ""))
        if documented != made:
            differences += difflib.unified_diff(
                documented.splitlines(), made.splitlines(), f"{DOC.name}: {match[2]}",
                "this run", lineterm="",
            )  # fmt: skip
    return differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="a mock API already running (python -m batchsync.mock)")
    parser.add_argument("--out", type=Path, default=DEMO_OUT, help="a folder for the outputs")
    docs = parser.add_mutually_exclusive_group()
    docs.add_argument("--write-docs", action="store_true", help=f"write the samples of {DOC.name}")
    docs.add_argument("--check-docs", action="store_true", help=f"check the samples of {DOC.name}")
    args = parser.parse_args()
    out: Path = args.out.resolve()
    if out != DEMO_OUT and out.exists() and any(out.iterdir()):
        parser.error(f"--out {args.out}: give a new or empty folder")
    # A demo starts from nothing: its own earlier outputs would be refused as another run's.
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    samples: dict[str, str] = {}
    with mock_api(args.server) as base:
        for name, text in sections(base, out):
            print(text, flush=True)
            samples[name] = canonical(text, base, out)
    if args.write_docs:
        write_docs(samples)
    if args.check_docs:
        differences = check_docs(samples)
        print(
            "\n".join(differences or [f"{shown(DOC)}: the samples are this run's"]), file=sys.stderr
        )
        return 3 if differences else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
