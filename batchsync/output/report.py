"""The run's report: one self-contained HTML file of charts and tables over every Result.

Two halves, kept apart: the aggregation (``Aggregate``, pure, fed one Result's ``Trace`` at a time,
memory bounded by the number of time buckets, not of items) and the rendering (``render``),
with plotly when it is installed (the ``report`` extra: one inline copy of plotly.js for
every chart, so the file opens without a network) and plain HTML tables otherwise.

Times come from each Result's ``finished`` (unix seconds, stored in the journal). Attempts
are placed back from there: the last one ended when the item finished, each one before it
ended its own ``wait`` before the next began. Gate waits between attempts (cooldown, quota,
rate, breaker) are not in the attempt log, so the attempts of an item that waited at a gate
are placed a little later than they were sent; the run's totals of those waits are shown.
"""

from __future__ import annotations

import contextlib
import heapq
import html
import math
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.history import Stint
from ..core.result import PERCENTILES, Listing, Result, Summary, Trace, Tried
from ..store.submissions import Part

# The outcomes an attempt is counted under in the chart of attempts over time.
CHARTED = ("ok", "retried", "failed", "429")
# Time buckets at most: a run of any length is drawn with this many points.
MAX_BUCKETS = 150
# Latency histogram of each bucket: log-spaced bins from 100 µs, each 10 % wider than the
# one before, so a percentile read from it is within 10 % of the exact one.
_LATENCY_FLOOR = 1e-4
_LATENCY_STEP = 1.1
_LATENCY_BINS = 250
# Items listed in the tables.
SLOWEST = 25
FAILED_SHOWN = 1000
INSTALL_HINT = "pip install 'batchsync[report]'"
# Runs of row indexes shown in a part's cell of the submissions table (the rest: "…").
RUNS_SHOWN = 4
# What the providers say of their batch endpoints' price, and nothing more: no per-token
# prices, which differ by model and change.
HALF_PRICE = (
    "The batch endpoints are billed at half the live price: these {inputs} input and "
    "{outputs} output tokens cost half what the same calls made live would."
)


def charted_as(attempt: Tried, last: bool) -> str:
    """The outcome an attempt is counted under: a 429, a success, a failure followed by
    another attempt (``retried``), or the item's last failure."""
    status, kind, _, _ = attempt
    if status == 429:
        return "429"
    if kind is None:
        return "ok"
    return "failed" if last else "retried"


def placed(finished: float, log: Sequence[Tried]) -> list[tuple[float, float]]:
    """(start, end) of each attempt in unix seconds, placed back from ``finished``."""
    spans: list[tuple[float, float]] = []
    end = finished
    for position in range(len(log) - 1, -1, -1):
        _, _, elapsed, _ = log[position]
        start = end - elapsed
        spans.append((start, end))
        if position:
            end = start - (log[position - 1][3] or 0.0)
    spans.reverse()
    return spans


def bucket_width(span: float, buckets: int = MAX_BUCKETS) -> float:
    """The smallest of 1, 2, 5 x 10^k seconds that cuts ``span`` into at most ``buckets``."""
    wanted = max(span / buckets, 1e-3)
    power = 10.0 ** math.floor(math.log10(wanted))
    for step in (1.0, 2.0, 5.0, 10.0):
        if step * power >= wanted * (1 - 1e-9):
            return step * power
    return 10 * power  # pragma: no cover (the loop always returns)


def latency_bin(seconds: float) -> int:
    if seconds <= _LATENCY_FLOOR:
        return 0
    position = int(math.log(seconds / _LATENCY_FLOOR) / math.log(_LATENCY_STEP)) + 1
    return min(position, _LATENCY_BINS - 1)


def bin_seconds(position: int) -> float:
    """The upper edge of a latency bin (what a percentile falling in it is shown as)."""
    return _LATENCY_FLOOR * _LATENCY_STEP**position


def histogram_percentile(counts: Mapping[int, int], share: float) -> float:
    """The ``share`` percentile (nearest rank) of a latency histogram, as its bin's edge."""
    total = sum(counts.values())
    wanted = min(total, max(1, math.ceil(share * total)))
    seen = 0
    for position in sorted(counts):
        seen += counts[position]
        if seen >= wanted:
            return bin_seconds(position)
    return bin_seconds(max(counts))  # pragma: no cover (an empty histogram is never asked)


@dataclass
class Aggregate:
    """The report's numbers, added up one Result at a time over fixed time buckets.

    ``start`` and ``end`` (unix seconds) bound the run's times: the first claim and the last
    Result. Memory depends on the bucket count, never on the number of items.
    """

    start: float
    end: float
    width: float = 0.0
    items: int = 0
    untimed: int = 0
    attempts: dict[str, list[int]] = field(default_factory=dict)
    backoff: list[float] = field(default_factory=list)
    latency: list[Counter[int]] = field(default_factory=list)
    attempts_per_item: Counter[int] = field(default_factory=Counter)
    slowest: list[tuple[float, int]] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    failed_total: int = 0
    gates: dict[str, list[float]] = field(default_factory=dict)
    _count: int = field(default=1, init=False, repr=False)

    def __post_init__(self) -> None:
        self.end = max(self.end, self.start)
        if not self.width:
            self.width = bucket_width(self.end - self.start)
        count = self._count = max(1, math.ceil((self.end - self.start) / self.width - 1e-9))
        self.attempts = {name: [0] * count for name in CHARTED}
        self.backoff = [0.0] * count
        self.latency = [Counter() for _ in range(count)]

    @property
    def buckets(self) -> int:
        return self._count

    def bucket(self, moment: float) -> int:
        return min(self._count - 1, max(0, int((moment - self.start) / self.width)))

    def add(self, trace: Trace) -> None:
        self.items += 1
        self.attempts_per_item[trace.attempts] += 1
        if len(self.slowest) < SLOWEST:
            heapq.heappush(self.slowest, (trace.elapsed, -trace.index))
        elif trace.elapsed > self.slowest[0][0]:
            heapq.heapreplace(self.slowest, (trace.elapsed, -trace.index))
        if not trace.ok:
            self.failed_total += 1
            if len(self.failed) < FAILED_SHOWN:
                self.failed.append(trace.index)
        if trace.finished is None:
            self.untimed += 1
            return
        log = trace.log
        last = len(log) - 1
        for position, (begun, ended) in enumerate(placed(trace.finished, log)):
            attempt = log[position]
            self.attempts[charted_as(attempt, position == last)][self.bucket(begun)] += 1
            self.latency[self.bucket(ended)][latency_bin(attempt[2])] += 1
            wait = attempt[3]
            if wait and position < last:
                self._spread(self.backoff, ended, ended + wait)

    def _spread(
        self, series: list[float], begun: float, ended: float, amount: float | None = None
    ) -> None:
        """Add the seconds of [begun, ended] that fall in each bucket to that bucket (or the
        share of ``amount`` that they are)."""
        first, final = self.bucket(begun), self.bucket(ended)
        scale = 1.0 if amount is None or ended <= begun else amount / (ended - begun)
        for position in range(first, final + 1):
            low = max(begun, self.start + position * self.width)
            high = (
                ended if position == final else min(ended, self.start + (position + 1) * self.width)
            )
            series[position] += max(0.0, high - low) * scale

    def add_gate_waits(self, timeline: Mapping[tuple[str, int], float]) -> None:
        """Add the seconds waited at each gate, by (gate, unix second), as a run's gates
        counted them (``WaitStats.timeline``)."""
        for (gate, second), seconds in sorted(timeline.items()):
            series = self.gates.setdefault(gate, [0.0] * self.buckets)
            self._spread(series, float(second), float(second + 1), seconds)

    # -- what the charts show --------------------------------------------------------------

    def times(self) -> list[float]:
        """Each bucket's start, in seconds from the run's start."""
        return [round(position * self.width, 6) for position in range(self.buckets)]

    def per_second(self) -> dict[str, list[float]]:
        """Attempts per second in each bucket, by outcome."""
        return {
            name: [count / self.width for count in counts] for name, counts in self.attempts.items()
        }

    def percentiles(self) -> dict[str, list[float | None]]:
        """p50/p95/p99 of the attempts that ended in each bucket (None where none did)."""
        return {
            name: [
                histogram_percentile(counts, share) if counts else None for counts in self.latency
            ]
            for name, share in PERCENTILES.items()
        }

    def waiting(self) -> dict[str, list[float]]:
        """Items waiting at each gate, on average over each bucket (seconds waited per
        second): ``backoff`` between attempts, then the gates' waits when they were given."""
        series = {"backoff": self.backoff, **dict(sorted(self.gates.items()))}
        return {
            gate: [seconds / self.width for seconds in values] for gate, values in series.items()
        }

    def slowest_indexes(self) -> list[int]:
        return [-negative for _, negative in sorted(self.slowest, reverse=True)]


def span_of(traces: Iterable[Trace]) -> tuple[float, float] | None:
    """(first claim, last finish) in unix seconds over the timed Results, or None."""
    first, last = math.inf, -math.inf
    for one in traces:
        if one.finished is not None:
            first = min(first, one.finished - one.elapsed)
            last = max(last, one.finished)
    return None if first == math.inf else (first, last)


def aggregated(traces: Iterable[Trace], span: tuple[float, float] | None) -> Aggregate:
    start, end = span or (0.0, 0.0)
    counted = Aggregate(start, end)
    for one in traces:
        counted.add(one)
    return counted


# -- sources -------------------------------------------------------------------------------


# One item as the report reads it: what its charts count, and what its tables list.
Entry = tuple[Trace, Listing]


def collected(
    entries: Iterable[Entry],
    span: tuple[float, float] | None,
    timeline: Mapping[tuple[str, int], float] | None = None,
) -> tuple[Aggregate, Callable[[list[int]], list[Listing]]]:
    """The aggregate of ``entries`` (and of the gates' waits, when given), added up in one
    pass within ``span``, and how to list the items its tables show, by index: only those
    listings are kept (at most a few times the tables' rows at any moment)."""
    counted = aggregated((), span)
    kept: dict[int, Listing] = {}
    for trace, listing in entries:
        counted.add(trace)
        kept[trace.index] = listing
        if len(kept) > 2 * (SLOWEST + FAILED_SHOWN):
            kept = _shown(counted, kept)
    counted.add_gate_waits(timeline or {})
    kept = _shown(counted, kept)
    return counted, lambda indexes: [kept[i] for i in indexes if i in kept]


def _shown(counted: Aggregate, kept: dict[int, Listing]) -> dict[int, Listing]:
    wanted = {*counted.failed, *counted.slowest_indexes()}
    return {index: listing for index, listing in kept.items() if index in wanted}


def from_results(
    results: Sequence[Result], timeline: Mapping[tuple[str, int], float] | None = None
) -> tuple[Aggregate, Callable[[list[int]], list[Listing]]]:
    """The aggregate of Results in memory (and of the gates' waits, when given), and how to
    list some of them by index."""
    traces = [Trace.of(result) for result in results]
    entries = zip(traces, map(Listing.of, results), strict=True)
    return collected(entries, span_of(traces), timeline)


# -- rendering -----------------------------------------------------------------------------


def _plotly() -> Any:
    try:
        import plotly.graph_objects as go
        import plotly.io as pio
    except ImportError:
        return None
    return go, pio


_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:1.6em}
table{border-collapse:collapse;margin:.4em 0} th,td{border:1px solid #ddd;padding:.25em .6em}
th{background:#f4f4f4;text-align:left} td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{background:#fff7e0;border:1px solid #f0d080;padding:.5em .8em}
.charts{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:1em}
.chart{border:1px solid #eee;min-height:320px} input.filter{width:30em;padding:.3em}
.summary{font-family:ui-monospace,monospace;font-size:.9em}
"""

_FILTER = """
document.querySelectorAll('input.filter').forEach(function (box) {
  box.addEventListener('input', function () {
    var words = box.value.toLowerCase();
    var rows = document.querySelectorAll('#' + box.dataset.table + ' tbody tr');
    var shown = 0;
    rows.forEach(function (row) {
      var keep = row.textContent.toLowerCase().indexOf(words) !== -1;
      row.style.display = keep ? '' : 'none';
      if (keep) { shown += 1; }
    });
    document.getElementById(box.dataset.table + '-shown').textContent = shown;
  });
});
"""


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _counts_table(summary: Summary) -> str:
    rows: list[tuple[str, str, int]] = [
        ("items", "items", summary.total),
        ("ok", "ok", summary.ok),
        ("failed", "failed", summary.failed),
    ]
    rows += [(f"error: {kind}", f"kind-{kind}", n) for kind, n in summary.error_kinds.items()]
    rows += [(f"HTTP {code}", f"status-{code}", n) for code, n in summary.status_codes.items()]
    rows.append(("requests sent", "requests", summary.requests_sent))
    body = "".join(
        f"<tr><th>{_e(name)}</th><td class='n' data-count='{_e(key)}'>{n}</td></tr>"
        for name, key, n in rows
    )
    return f"<table id='counts'>{body}</table>"


def _figures_table(summary: Summary) -> str:
    facts = [(name, value) for name, value in summary._figures() if name != "requests"]
    body = "".join(f"<tr><th>{_e(name)}</th><td class='n'>{_e(v)}</td></tr>" for name, v in facts)
    return f"<table id='facts'>{body}</table>"


def _items_table(name: str, caption: str, items: Sequence[Listing], more: int = 0) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("index", "id", "url", "status", "error kind", "error", "attempts", "seconds")
    )
    rows = "".join(
        "<tr>"
        f"<td class='n'>{item.index}</td><td>{_e(item.id)}</td><td>{_e(item.url)}</td>"
        f"<td class='n'>{_e(item.status_code)}</td><td>{_e(item.error_kind)}</td>"
        f"<td>{_e(item.error)}</td><td class='n'>{item.attempts}</td>"
        f"<td class='n'>{item.elapsed:.3f}</td></tr>"
        for item in items
    )
    note = f"<p>… and {more} more (all of them are in the results file).</p>" if more else ""
    search = (
        f"<p><input class='filter' data-table='{name}' placeholder='filter: url, status, error…'>"
        f" <span id='{name}-shown'>{len(items)}</span> shown</p>"
    )
    return (
        f"<h2>{_e(caption)}</h2>{search}<table id='{name}'><thead><tr>{head}</tr></thead>"
        f"<tbody>{rows}</tbody></table>{note}"
    )


def _series_table(name: str, times: Sequence[float], series: Mapping[str, Sequence[Any]]) -> str:
    head = "<th>seconds from start</th>" + "".join(f"<th>{_e(k)}</th>" for k in series)

    def cell(value: Any) -> str:
        return "<td class='n'></td>" if value is None else f"<td class='n'>{value:.3g}</td>"

    rows = "".join(
        f"<tr><td class='n'>{moment:g}</td>"
        + "".join(cell(values[position]) for values in series.values())
        + "</tr>"
        for position, moment in enumerate(times)
    )
    return f"<table id='{name}'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


_COLORS = {"ok": "#2ca02c", "retried": "#ff7f0e", "failed": "#d62728", "429": "#9467bd"}


def _charts(aggregate: Aggregate, summary: Summary, plotly: Any) -> str:
    go, pio = plotly
    times = aggregate.times()
    figures = []
    layout = {"height": 340, "margin": {"l": 55, "r": 20, "t": 45, "b": 45}}
    per_second = aggregate.per_second()
    rate = go.Figure(
        [
            go.Bar(x=times, y=values, name=name, marker_color=_COLORS[name])
            for name, values in per_second.items()
        ]
    )
    rate.update_layout(
        title="Attempts per second, by outcome",
        barmode="stack",
        bargap=0,
        xaxis_title="seconds from start",
        yaxis_title="attempts / s",
        **layout,
    )
    figures.append(("chart-rate", rate))
    latency = go.Figure(
        [
            go.Scatter(x=times, y=values, name=name, mode="lines+markers", connectgaps=True)
            for name, values in aggregate.percentiles().items()
        ]
    )
    latency.update_layout(
        title="Attempt latency percentiles (±10 %; lines join the steps with attempts)",
        xaxis_title="seconds from start",
        yaxis_title="seconds",
        yaxis_type="log",
        **layout,
    )
    figures.append(("chart-latency", latency))
    waits = go.Figure(
        [
            go.Scatter(x=times, y=values, name=name, mode="lines", fill="tozeroy")
            for name, values in aggregate.waiting().items()
        ]
    )
    waits.update_layout(
        title="Items waiting, by gate (average over each step)",
        xaxis_title="seconds from start",
        yaxis_title="items waiting",
        showlegend=True,
        **layout,
    )
    figures.append(("chart-waits", waits))
    counts = sorted(aggregate.attempts_per_item.items())
    histogram = go.Figure(
        [go.Bar(x=[str(n) for n, _ in counts], y=[k for _, k in counts], name="items")]
    )
    histogram.update_layout(
        title="Attempts per item",
        xaxis_title="requests sent",
        yaxis_title="items",
        xaxis_type="category",
        **layout,
    )
    figures.append(("chart-attempts", histogram))
    outcomes = [("ok", summary.ok), *summary.error_kinds.items()]
    kinds = go.Figure(
        [
            go.Bar(
                x=[name for name, _ in outcomes],
                y=[n for _, n in outcomes],
                name="items",
                marker_color=["#2ca02c"] + ["#d62728"] * (len(outcomes) - 1),
            )
        ]
    )
    kinds.update_layout(
        title="Outcomes and error kinds", yaxis_title="items", xaxis_type="category", **layout
    )
    figures.append(("chart-outcomes", kinds))
    parts = []
    for position, (name, figure) in enumerate(figures):
        chart = pio.to_html(
            figure,
            include_plotlyjs=position == 0,
            full_html=False,
            div_id=name,
            config={"displaylogo": False, "responsive": True},
        )
        parts.append(f"<div class='chart'>{chart}</div>")
    return f"<div class='charts'>{''.join(parts)}</div>"


def _plain(aggregate: Aggregate) -> str:
    """The charts' numbers as tables, for a report made without plotly."""
    times = aggregate.times()
    counts = sorted(aggregate.attempts_per_item.items())
    histogram = "".join(f"<tr><td class='n'>{n}</td><td class='n'>{k}</td></tr>" for n, k in counts)
    return (
        f"<p class='note'>Charts need plotly: <code>{_e(INSTALL_HINT)}</code>. "
        "Their numbers follow as tables.</p>"
        "<h2>Attempts per item</h2><table id='attempts-per-item'><thead><tr><th>requests "
        f"sent</th><th>items</th></tr></thead><tbody>{histogram}</tbody></table>"
        "<details><summary>Attempts per second, by outcome</summary>"
        f"{_series_table('rate', times, aggregate.per_second())}</details>"
        "<details><summary>Attempt latency percentiles (seconds, ±10 %)</summary>"
        f"{_series_table('latency', times, aggregate.percentiles())}</details>"
        "<details><summary>Items waiting, by gate</summary>"
        f"{_series_table('waits', times, aggregate.waiting())}</details>"
    )


def render(
    summary: Summary,
    aggregate: Aggregate,
    details: Callable[[list[int]], list[Listing]],
    *,
    title: str = "batchsync report",
    charts: bool = True,
    stints: Sequence[Stint] = (),
    submissions: Sequence[Part] = (),
) -> str:
    """The report's HTML: one page, scripts and data inline; ``submissions``: the parts
    sent through a provider's batch endpoint (a section of their own when there are any)."""
    plotly = _plotly() if charts else None
    started = (
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(aggregate.start))
        if aggregate.items
        else ""
    )
    untimed = (
        f"<p class='note'>{aggregate.untimed} item(s) have no finish time (finished by an older "
        "run) and are counted, but not drawn over time.</p>"
        if aggregate.untimed
        else ""
    )
    gates = ", ".join(f"{gate} {s:.1f} s" for gate, s in sorted(summary.waits.items()))
    body = (
        f"<h1>{_e(title)}</h1>"
        f"<p class='summary'>{_e(summary)}</p>"
        f"<p>Run started {_e(started)}; time steps of {aggregate.width:g} s.</p>"
        "<h2>Outcomes</h2>"
        f"<div style='display:flex;gap:2em;flex-wrap:wrap'>{_counts_table(summary)}"
        f"{_figures_table(summary)}</div>{untimed}{_stints_table(stints)}"
        + (_charts(aggregate, summary, plotly) if plotly is not None else _plain(aggregate))
        + (
            "<p>The waits chart shows the backoff between attempts, from the attempt logs, "
            "and the waits at the gates (token, cooldown, host_slot, breaker, adaptive), over "
            "every process that worked on the run. The totals: "
            f"{_e(gates or 'none')}.</p>"
        )
        + _submissions_section(submissions, plotly)
        + _items_table("slowest", "Slowest items", details(aggregate.slowest_indexes()))
        + _items_table(
            "failed",
            "Failed items",
            details(aggregate.failed),
            aggregate.failed_total - len(aggregate.failed),
        )
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width'><title>{_e(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{body}<script>{_FILTER}</script></body></html>"
    )


def _stints_table(stints: Sequence[Stint]) -> str:
    """The passes over the items (the first, then each retry of failures) and each process
    (or ``run()``) that worked in them."""
    if not stints:
        return ""
    rows = "".join(
        f"<tr><td>{stint.passing.number}</td><td>{_e(stint.passing.describe())}</td>"
        f"<td>{_e(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(stint.started)))}</td>"
        f"<td>{stint.elapsed:.2f}</td><td>{stint.items}</td><td>{stint.requests}</td></tr>"
        for stint in stints
    )
    head = "".join(
        f"<th>{name}</th>"
        for name in ("pass", "what", "started", "seconds", "items finished", "requests")
    )
    return (
        "<h2>Passes</h2><p>Each process (or run()) that worked on the run, in its pass: the "
        "first, then each retry of the failures.</p>"
        f"<table id='passes'><tr>{head}</tr>{rows}</table>"
    )


def _moment(when: float | None) -> str:
    if when is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def _runs_text(part: Part) -> str:
    """A part's rows as its count and its runs of indexes: ``5 (0-4)``."""
    runs = [str(first) if first == last else f"{first}-{last}" for first, last in part.rows]
    shown = ", ".join(runs[:RUNS_SHOWN]) + (", …" if len(runs) > RUNS_SHOWN else "")
    return f"{part.size} ({shown})"


def token_totals(parts: Iterable[Part]) -> tuple[int, int]:
    """The input and output tokens the parts' answers used, as the providers counted them."""
    inputs = outputs = 0
    for part in parts:
        inputs += part.tokens[0]
        outputs += part.tokens[1]
    return inputs, outputs


def _submissions_section(parts: Sequence[Part], plotly: Any) -> str:
    """The parts sent through a batch endpoint: what each is now, how it got there, and the
    tokens they used; nothing for a run that sent none."""
    if not parts:
        return ""
    head = "".join(
        f"<th>{name}</th>"
        for name in (
            "part",
            "pass",
            "provider",
            "rows",
            "batch id",
            "state now",
            "submitted",
            "last change",
            "input tokens",
            "output tokens",
        )
    )
    rows = "".join(
        f"<tr><td class='n'>{part.number}</td><td class='n'>{part.passing}</td>"
        f"<td>{_e(part.provider)}</td><td>{_e(_runs_text(part))}</td><td>{_e(part.batch)}</td>"
        f"<td>{_e(part.state)}</td><td>{_e(_moment(part.submitted))}</td>"
        f"<td>{_e(_moment(part.history[-1][0] if part.history else None))}</td>"
        f"<td class='n'>{part.tokens[0]}</td><td class='n'>{part.tokens[1]}</td></tr>"
        for part in parts
    )
    inputs, outputs = token_totals(parts)
    notes = ""
    dropped = sum(1 for part in parts if part.dropped)
    if dropped:
        notes += (
            f" {dropped} part(s) were dropped: a later run found them without a batch at the "
            "provider and put their rows in new parts."
        )
    still = sum(1 for part in parts if part.open and part.batch is not None)
    if still:
        notes += (
            f" {still} part(s) are still open at the provider: --batch-api with --resume or "
            "--retry-failed goes on with them (a live run is refused meanwhile)."
        )
    chart = _submissions_chart(parts, plotly) if plotly is not None else ""
    return (
        "<h2 id='batch-submissions'>Batch submissions</h2>"
        f"<p>The rows went through the provider's batch endpoint in {len(parts)} part(s). "
        "A row's seconds run from its part's submission to the collection of its "
        f"results.{_e(notes)}</p>"
        f"<table id='submissions'><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        f"<p id='batch-tokens'>Tokens used: {inputs} input and {outputs} output, as the "
        f"provider counted them. {_e(HALF_PRICE.format(inputs=inputs, outputs=outputs))}</p>"
        f"{chart}{_history_table(parts)}"
    )


def _history_table(parts: Sequence[Part]) -> str:
    """Each part's states, in order: when it entered each and how long it stayed."""
    rows = []
    for part in parts:
        history = part.history
        for position, (when, state) in enumerate(history):
            stayed = history[position + 1][0] - when if position + 1 < len(history) else None
            rows.append(
                f"<tr><td class='n'>{part.number}</td><td>{_e(state)}</td>"
                f"<td>{_e(_moment(when))}</td><td class='n'>{when - history[0][0]:.1f}</td>"
                f"<td class='n'>{'' if stayed is None else f'{stayed:.1f}'}</td></tr>"
            )
    head = "".join(
        f"<th>{name}</th>"
        for name in ("part", "state", "at", "seconds from planned", "seconds in it")
    )
    return (
        "<details><summary>Each part's states over time</summary>"
        f"<table id='submission-history'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></details>"
    )


def _submissions_chart(parts: Sequence[Part], plotly: Any) -> str:
    """Each part's states as a bar along the time from the first part's start (plotly.js is
    on the page already: the other charts brought it)."""
    go, pio = plotly
    start = min((part.history[0][0] for part in parts if part.history), default=0.0)
    spans: dict[str, tuple[list[float], list[float], list[str]]] = {}
    for part in parts:
        history = part.history
        for position, (when, state) in enumerate(history):
            ended = history[position + 1][0] if position + 1 < len(history) else when
            bases, lengths, names = spans.setdefault(state, ([], [], []))
            bases.append(when - start)
            lengths.append(max(ended - when, 0.0))
            names.append(f"part {part.number}")
    figure = go.Figure(
        [
            go.Bar(base=bases, x=lengths, y=names, name=state, orientation="h")
            for state, (bases, lengths, names) in spans.items()
        ]
    )
    figure.update_layout(
        title="Each part's states over time",
        barmode="overlay",
        xaxis_title="seconds from the first part's start",
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(220, 60 + 28 * len(parts)),
        margin={"l": 70, "r": 20, "t": 45, "b": 45},
    )
    chart = pio.to_html(
        figure,
        include_plotlyjs=False,
        full_html=False,
        div_id="chart-submissions",
        config={"displaylogo": False, "responsive": True},
    )
    return f"<div class='chart'>{chart}</div>"


def write_atomically(path: Path, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, synced, then rename it over."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # (a lone surrogate, from a JSON "\\ud800" escape in an id or url: as its escape)
        with temporary.open("x", encoding="utf-8", errors="backslashreplace") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    return path


def report_results(
    results: Sequence[Result],
    summary: Summary,
    path: str | Path,
    *,
    charts: bool = True,
    timeline: Mapping[tuple[str, int], float] | None = None,
    stints: Sequence[Stint] = (),
    submissions: Sequence[Part] = (),
) -> Path:
    """Write the report of Results in memory (``ResultSet.report``)."""
    counted, details = from_results(results, timeline)
    page = render(summary, counted, details, charts=charts, stints=stints, submissions=submissions)
    return write_atomically(Path(path), page)


def report_of(
    entries: Iterable[Entry],
    span: tuple[float, float] | None,
    summary: Summary,
    path: str | Path,
    *,
    title: str = "batchsync report",
    charts: bool = True,
    timeline: Mapping[tuple[str, int], float] | None = None,
    stints: Sequence[Stint] = (),
    submissions: Sequence[Part] = (),
) -> Path:
    """Write the report of a stream of items within ``span`` (the command line's
    PREFIX-report.html, from ``resultset.StoredResults``); ``timeline``: the run's gate
    waits (``WaitStats.timeline``), ``stints`` what each process did, ``submissions`` the
    parts it sent through a batch endpoint."""
    counted, details = collected(entries, span, timeline)
    page = render(
        summary,
        counted,
        details,
        title=title,
        charts=charts,
        stints=stints,
        submissions=submissions,
    )
    return write_atomically(Path(path), page)
