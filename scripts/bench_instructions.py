"""CPU instructions per request for each method, counted by valgrind's callgrind.

    python scripts/bench_instructions.py [METHOD ...]

Wall-clock rates on a shared 2-core machine move by several per cent from run to run;
instruction counts do not. Each method runs ``scripts/bench_client.py`` under callgrind twice,
for 500 and for 2 500 requests to a local nginx (the bundled asyncio server without it), at
concurrency 4; the difference over the 2 000 extra requests is the cost of one request, with
start-up and imports taken out. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from bench import METHODS, available_methods, start_fast_server  # noqa: E402

CLIENT = ROOT / "scripts" / "bench_client.py"
SMALL, LARGE = 500, 2500


def instructions(method: str, url: str, count: int, folder: Path) -> int:
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder / 'callgrind.out'}",
         sys.executable, str(CLIENT), method, url, "4", str(count)],
        capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind reported no count for {method}")
    return int(found[1])


def main() -> None:
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")
    wanted = sys.argv[1:] or [m for m in available_methods()[0] if m in METHODS[:-1]]
    with tempfile.TemporaryDirectory(prefix="batchsync-instructions-") as tmp:
        folder = Path(tmp)
        server, note = start_fast_server(folder)
        try:
            if note:
                print(note)
            per_request = {}
            for method in wanted:
                small = instructions(method, server.url, SMALL, folder)
                large = instructions(method, server.url, LARGE, folder)
                per_request[method] = (large - small) / (LARGE - SMALL)
                print(f"{method:17} {per_request[method] / 1000:8.0f} k instructions/request")
        finally:
            server.stop()
    base = per_request.get("baseline")
    if base:
        for method, count in per_request.items():
            print(f"{method:17} {count / base:5.2f} of the baseline's instructions")


if __name__ == "__main__":
    main()
