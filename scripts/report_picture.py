"""The README's picture of the report, docs/report.png, made again: the demo's first run (a list
of seven requests against the mock API, each meeting another fault) writes its report, and a
headless Chromium (Debian's ``chromium``, driven by playwright: no ``playwright install``)
takes the top of the page: the summary, the passes and the first four charts.

    python scripts/report_picture.py [--out docs/report.png]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import ViewportSize, sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHARTS = ("chart-rate", "chart-latency", "chart-waits", "chart-attempts")
VIEWPORT: ViewportSize = {"width": 1400, "height": 900}


def demo_report(folder: Path) -> Path:
    """The report of the demo's first run, made in ``folder``."""
    out = folder / "demo-out"
    subprocess.run(
        [sys.executable, "scripts/demo.py", "--out", str(out)], cwd=ROOT, check=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return out / "batch-report.html"


def picture(report: Path, png: Path) -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium on PATH: apt-get install chromium")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(report.as_uri())
            for chart in CHARTS:
                page.wait_for_selector(f"#{chart} .main-svg", timeout=20_000)
            bottom = page.evaluate(
                f"document.getElementById('{CHARTS[-1]}').closest('.chart')"
                ".getBoundingClientRect().bottom"
            )
            page.set_viewport_size({"width": VIEWPORT["width"], "height": int(bottom) + 16})
            page.screenshot(path=str(png))
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        picture(demo_report(Path(folder)), args.out)
    print(f"{args.out}: {args.out.stat().st_size // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
