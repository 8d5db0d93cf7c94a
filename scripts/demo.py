"""``make demo``: start the mock server, run batchsync on the bundled list and on the bundled
table of customers (templated, paginated, quota-aware), show what happened."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "demo-out"
sys.path.insert(0, str(ROOT))

from tests.mockserver import start_mock_server  # noqa: E402


def show_table(results: Path) -> None:
    print(f"{'#':>2}  {'ok':<5} {'status':>6} {'tries':>5}  {'error kind':<13} url / error")
    for line in results.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        detail = r["error"] or r["url"]
        print(
            f"{r['index']:>2}  {r['ok']!s:<5} {r['status_code'] or '-':>6} {r['attempts']:>5}  "
            f"{r['error_kind'] or '-':<13} {detail}"
        )


def orders(base: str) -> int:
    """The second run: a URL per row of a CSV, every page of each, under the API's quota."""
    # The mock API pages each customer's orders by Link headers, 2 a page, and allows 6
    # requests per 2-second window, saying so in X-RateLimit-* headers.
    template = (f"{base}/pages/link/customers/{{id}}/orders?since={{since}}&total={{orders}}"
                "&size=2&limit=6&window=2&family=demo")  # fmt: skip
    command = [sys.executable, "-m", "batchsync", "examples/customers.csv", "--url", template,
               "--paginate", "link", "--items", "items", "-o", "demo-out/orders",
               "--no-progress"]  # fmt: skip
    print("\n# A CSV of customers: one templated URL per row, every page of each, under the")
    print("# quota the API announces in its headers.")
    print("$ python -m batchsync", shlex.join(command[3:]), flush=True)
    run = subprocess.run(command, cwd=ROOT, stderr=subprocess.STDOUT, check=False)
    print(f"exit status: {run.returncode}\n")
    print(f"{'id':<8} {'ok':<5} {'pages':>5} {'orders':>6}  url")
    for line in (OUT / "orders-results.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        print(f"{r['id']:<8} {r['ok']!s:<5} {r['pages']:>5} {len(r['data']):>6}  {r['url']}")
    return 0 if run.returncode == 0 else run.returncode


def main() -> int:
    # A demo starts from nothing: its own earlier outputs would be refused as another run's.
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    server = start_mock_server()
    base = server.url
    try:
        template = (ROOT / "examples" / "demo-urls.txt").read_text(encoding="utf-8")
        urls = OUT / "urls.txt"
        urls.write_text(template.replace("{base}", base), encoding="utf-8")
        command = [sys.executable, "-m", "batchsync", str(urls.relative_to(ROOT)),
                   "-o", "demo-out/batch", "--no-progress", "-v"]  # fmt: skip
        print(f"mock server: {base}")
        print("$ python -m batchsync", shlex.join(command[3:]), flush=True)
        # The run's log and summary go to stderr; show them in order with the rest.
        run = subprocess.run(command, cwd=ROOT, stderr=subprocess.STDOUT, check=False)
        status = run.returncode
        print(f"exit status: {status} (0 all ok, 1 some failed)\n")
        show_table(OUT / "batch-results.jsonl")
        print("\n$ cat demo-out/batch-failed.jsonl   # the failures, valid INPUT again")
        print((OUT / "batch-failed.jsonl").read_text(encoding="utf-8"), end="")
        print(
            f"# to send them again within this run: python -m batchsync "
            f"{shlex.join(command[3:6])} --retry-failed"
        )
        if status not in (0, 1):
            return status
        return orders(base)
    finally:
        server.process.terminate()
        server.process.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
