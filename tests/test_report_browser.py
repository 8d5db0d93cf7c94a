"""The report of a faulty run, opened in a real headless Chromium: no console errors, nothing
fetched from the network, charts drawn with the run's data, the counts the run's summary gave.

Needs Debian's ``chromium`` (``make test`` installs it where apt-get can) and the
``playwright`` package (the dev extra), which drives it; ``playwright install`` is never
needed. Without either, the test is skipped, saying why. (``scripts/report_picture.py`` takes
the README's picture of a report the same way.)
"""

from __future__ import annotations

import random
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from .mockserver import MockServerProcess
from .test_cli import batchsync
from .test_report import counts_in, stated

pytestmark = pytest.mark.integration

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip
CHARTS = ("chart-rate", "chart-latency", "chart-waits", "chart-attempts", "chart-outcomes")


@pytest.fixture(scope="module")
def chromium() -> Any:
    if not CHROMIUM.exists():
        pytest.skip(
            f"Chromium is not installed ({CHROMIUM}): `make test` installs Debian's chromium "
            "with apt-get where it can"
        )
    pytest.importorskip("plotly", reason="the report's charts need plotly (the report extra)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package (dev extra) drives Chromium"
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def faulty_urls(base: str) -> list[str]:
    """Forty items: quick and slower successes, 404s, always-503s, 429s then ok."""
    k = uuid.uuid4().hex[:8]
    picks = random.Random(20)
    urls = [f"{base}/ok/{k}-{n}?delay={picks.choice((0, 0.05, 0.1, 0.3, 0.6))}" for n in range(25)]
    urls += [f"{base}/404/{k}-{n}" for n in range(5)]
    urls += [f"{base}/503/{k}-{n}" for n in range(5)]
    urls += [f"{base}/429-once/{k}-{n}?retry_after=1" for n in range(5)]
    picks.shuffle(urls)
    return urls


def test_the_report_of_a_faulty_run_renders_in_chromium(
    chromium: Any, server: MockServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "urls.txt").write_text("\n".join(faulty_urls(server.url)) + "\n")
    done = batchsync(
        "urls.txt", "-c", "6", "--attempts", "3", "--no-progress", "-o", "faulty",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    path = tmp_path / "faulty-report.html"
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else 0)
    page.on("pageerror", lambda error: problems.append(str(error)))
    fetched: list[str] = []

    def refuse_network(route: Any) -> None:
        if not route.request.url.startswith("file:"):
            fetched.append(route.request.url)
            route.abort()
        else:
            route.continue_()

    page.route("**/*", refuse_network)
    page.goto(path.as_uri())
    for chart in CHARTS:
        page.wait_for_selector(f"#{chart} .main-svg", timeout=20_000)
    assert problems == [] and fetched == []

    # The numbers on the page are the run's summary.
    counts = counts_in(page.content())
    assert {key: counts[key] for key in stated(done.stderr)} == stated(done.stderr)
    requests = int(re.search(r"; (\d+) requests", done.stderr)[1])  # type: ignore[index]
    assert counts["requests"] == requests
    shown = {
        key: int(page.locator(f"[data-count='{key}']").inner_text()) for key in ("ok", "failed")
    }
    assert shown == {"ok": counts["ok"], "failed": counts["failed"]} == {"ok": 30, "failed": 10}

    # Each chart is drawn, with the run's data: the attempts over time add up to the requests
    # sent (no hedging, no token refresh here), the histogram to the items.
    drawn = page.evaluate(
        """(charts) => charts.map((id) => {
            const svg = document.querySelector('#' + id + ' .main-svg');
            const marks = document.querySelectorAll('#' + id + ' g.trace path');
            const tall = Array.from(marks).filter((m) => {
                const box = m.getBBox(); return box.width > 0 && box.height > 0;
            }).length;
            return [id, svg !== null, tall];
        })""",
        list(CHARTS),
    )
    for chart, has_svg, marks in drawn:
        assert has_svg and marks > 0, chart
    waits = page.evaluate("() => document.getElementById('chart-waits').data.map((t) => t.name)")
    assert waits[0] == "backoff" and "cooldown" in waits  # (the 429s' Retry-After held the host)
    totals = page.evaluate(
        """() => {
            const sum = (id) => document.getElementById(id).data
                .map((t) => Array.from(t.y).reduce((a, b) => a + (b || 0), 0));
            const rate = document.getElementById('chart-rate');
            const width = rate.data[0].x.length > 1 ? rate.data[0].x[1] - rate.data[0].x[0] : 1;
            return {rate: sum('chart-rate').map((s) => s * width),
                    attempts: sum('chart-attempts'), outcomes: sum('chart-outcomes')};
        }"""
    )
    by_outcome = dict(zip(("ok", "retried", "failed", "429"), totals["rate"], strict=True))
    assert sum(by_outcome.values()) == pytest.approx(requests)
    assert by_outcome["ok"] == pytest.approx(30) and by_outcome["429"] == pytest.approx(5)
    assert by_outcome["failed"] == pytest.approx(10)  # 5 404s, 5 503s at their last attempt
    assert totals["attempts"] == [40] and totals["outcomes"] == [40]

    # The failed items' table filters as one types.
    assert page.locator("#failed tbody tr").count() == 10
    page.fill("input[data-table='failed']", "http 404")  # (not "404": the port may hold it)
    assert page.locator("#failed tbody tr:visible").count() == 5
    assert page.locator("#failed-shown").inner_text() == "5"
    page.fill("input[data-table='failed']", "")

    # The latency chart: ticks with their unit, each percentile a line of its own, and plotly's
    # toolbar, shown while the pointer is over a chart, not over its title.
    ticks = page.locator("#chart-latency .ytick text").all_text_contents()
    assert ticks and all(re.fullmatch(r"\d+ (µs|ms|s)", tick) for tick in ticks), ticks
    looks = page.evaluate(
        """() => document.getElementById('chart-latency').data
            .map((t) => [t.name, (t.line || {}).dash, (t.marker || {}).symbol])"""
    )
    assert sorted(name for name, _, _ in looks) == ["p50", "p95", "p99"]
    assert len({(dash, symbol) for _, dash, symbol in looks}) == 3, looks
    for chart in CHARTS:
        page.hover(f"#{chart} .main-svg")
        overlap = page.evaluate(
            """(id) => {
                const chart = document.getElementById(id).closest('.chart');
                const bar = chart.querySelector('.modebar').getBoundingClientRect();
                const title = chart.querySelector('h3, .gtitle').getBoundingClientRect();
                return bar.width > 0 && bar.left < title.right && title.left < bar.right
                    && bar.top < title.bottom && title.top < bar.bottom;
            }""",
            chart,
        )
        assert not overlap, chart
    page.close()
