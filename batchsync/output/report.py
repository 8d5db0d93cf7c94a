"""The run's report: one self-contained HTML file of charts and tables over every Result,
rendered from its numbers (``report_data``): with plotly when it is installed (the ``report``
extra: one inline copy of plotly.js for every chart, so the file opens without a network) and
plain HTML tables otherwise.
"""

from __future__ import annotations

import contextlib
import html
import math
import os
import secrets
import time
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..core.history import Stint
from ..core.result import Listing, Summary, how_many
from ..store.submissions import Part
from .report_data import Aggregate, Entry, collected, submitted

INSTALL_HINT = "pip install 'batchsync[report]'"
# Runs of row indexes shown in a part's cell of the submissions table (the rest: "…").
RUNS_SHOWN = 4
# What the providers say of their batch endpoints' price, and nothing more: no per-token
# prices, which differ by model and change.
HALF_PRICE = (
    "The batch endpoints are billed at half the live price: these {inputs} input and "
    "{outputs} output tokens cost half what the same calls made live would."
)


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
.chart h3{font-size:1em;font-weight:normal;margin:.6em .8em 0}
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


def _table(
    name: str, head: Sequence[str], rows: Iterable[Sequence[object]], numbers: Container[int]
) -> str:
    """Table ``name``: ``rows`` of cells (their text escaped) under ``head``; the cells in the
    columns at ``numbers`` are numbers, aligned right."""
    heads = "".join(f"<th>{_e(title)}</th>" for title in head)
    body = "".join(f"<tr>{_cells(row, numbers)}</tr>" for row in rows)
    return f"<table id='{name}'><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table>"


def _cells(row: Sequence[object], numbers: Container[int]) -> str:
    return "".join(
        f"<td class='n'>{_e(cell)}</td>" if column in numbers else f"<td>{_e(cell)}</td>"
        for column, cell in enumerate(row)
    )


def _counts_table(summary: Summary) -> str:
    rows = [
        ("items", "items", summary.total), ("ok", "ok", summary.ok),
        ("failed", "failed", summary.failed),
        *((f"error: {kind}", f"kind-{kind}", n) for kind, n in summary.error_kinds.items()),
        *((f"HTTP {code}", f"status-{code}", n) for code, n in summary.status_codes.items()),
        ("requests sent", "requests", summary.requests_sent),
    ]  # fmt: skip
    body = "".join(
        f"<tr><th>{_e(name)}</th><td class='n' data-count='{_e(key)}'>{n}</td></tr>"
        for name, key, n in rows
    )
    return f"<table id='counts'>{body}</table>"


def _figures_table(summary: Summary) -> str:
    facts = [(name, value) for name, value in summary._figures() if name != "requests"]
    body = "".join(f"<tr><th>{_e(name)}</th><td class='n'>{_e(v)}</td></tr>" for name, v in facts)
    return f"<table id='facts'>{body}</table>"


_ITEM_COLUMNS = ("index", "id", "url", "status", "error kind", "error", "attempts", "seconds")


def _items_table(name: str, caption: str, items: Sequence[Listing], more: int = 0) -> str:
    rows = (
        (item.index, item.id, item.url, item.status_code, item.error_kind, item.error,
         item.attempts, f"{item.elapsed:.3f}")
        for item in items
    )  # fmt: skip
    note = f"<p>… and {more} more (all of them are in the results file).</p>" if more else ""
    search = (
        f"<p><input class='filter' data-table='{name}' placeholder='filter: url, status, error…'>"
        f" <span id='{name}-shown'>{len(items)}</span> shown</p>"
    )
    table = _table(name, _ITEM_COLUMNS, rows, {0, 3, 6, 7})
    return f"<h2>{_e(caption)}</h2>{search}{table}{note}"


def _series_table(name: str, times: Sequence[float], series: Mapping[str, Sequence[Any]]) -> str:
    head = ("seconds from start", *series)
    columns = [
        [None if value is None else f"{value:.3g}" for value in values]
        for values in series.values()
    ]
    rows = zip([f"{moment:g}" for moment in times], *columns, strict=True)
    return _table(name, head, rows, range(len(head)))


_COLORS = {"ok": "#2ca02c", "retried": "#ff7f0e", "failed": "#d62728", "429": "#9467bd"}
# Each percentile its own line and mark, and the higher ones drawn first, wider: where two are
# equal (a step with few attempts) the one below still shows around the one on top.
_PERCENTILE_LOOKS = {
    "p99": {"color": "#d62728", "dash": "dot", "symbol": "diamond-open", "size": 11},
    "p95": {"color": "#ff7f0e", "dash": "dash", "symbol": "square-open", "size": 8},
    "p50": {"color": "#1f77b4", "dash": "solid", "symbol": "circle", "size": 5},
}
# A log axis's ticks where plotly would put bare "2" and "5" between its decades, labelled with
# their unit: 1, 2 and 5 of each decade when the latencies span at most two decades, 1 and 3
# up to four, the decades alone beyond.
_DECADES = [10.0**power for power in range(-6, 5)]


def _duration(seconds: float) -> str:
    """A tick's label: 1 µs ... 500 ms, 1 s ... 10000 s."""
    for unit, size in (("s", 1.0), ("ms", 1e-3)):
        if seconds >= size:
            return f"{seconds / size:g} {unit}"
    return f"{seconds / 1e-6:g} µs"


def _latency_ticks(series: Iterable[Sequence[float | None]]) -> dict[str, Any]:
    values = [value for values in series for value in values if value]
    if not values:
        return {}
    low, high = min(values), max(values)
    ticks = _log_ticks(math.log10(high / low))
    shown = [tick for tick in ticks if low / 10 <= tick <= high * 10]
    return {"tickvals": shown, "ticktext": [_duration(tick) for tick in shown]}


def _log_ticks(decades: float) -> list[float]:
    steps = (1.0, 2.0, 5.0) if decades <= 2 else (1.0, 3.0) if decades <= 4 else (1.0,)
    return [round(decade * step, 9) for decade in _DECADES for step in steps]


def _latency_figure(aggregate: Aggregate, go: Any, over_time: dict[str, Any]) -> Any:
    times, percentiles = aggregate.times(), aggregate.percentiles()
    lines = [
        go.Scatter(x=times, y=percentiles[name], name=name, mode="lines+markers",
                   connectgaps=True, line={"color": look["color"], "dash": look["dash"]},
                   marker={"symbol": look["symbol"], "size": look["size"], "color": look["color"]})
        for name, look in _PERCENTILE_LOOKS.items()
    ]  # fmt: skip
    return go.Figure(lines).update_layout(
        title="Attempt latency percentiles (±10 %; lines join the steps with attempts)",
        yaxis={"title": "latency", "type": "log", **_latency_ticks(percentiles.values())},
        legend={"traceorder": "reversed"}, **over_time)  # fmt: skip


def _chart(pio: Any, name: str, figure: Any, *, first: bool = False) -> str:
    """One chart's div under its title; the ``first`` brings the page's one copy of plotly.js.
    The title is the page's, not the figure's: plotly's toolbar shows over a figure's top."""
    title = figure.layout.title.text
    figure.update_layout(title=None)
    config = {"displaylogo": False, "responsive": True}
    chart = pio.to_html(figure, include_plotlyjs=first, full_html=False, div_id=name, config=config)
    return f"<div class='chart'><h3>{_e(title)}</h3>{chart}</div>"


def _live_figures(aggregate: Aggregate, go: Any, over_time: dict[str, Any]) -> dict[str, Any]:
    """The charts of the live calls over time; none for a run whose rows a batch answered and
    none went live (a batch's rows are charted with their parts)."""
    if aggregate.lanes["batch"] and not aggregate.live_attempts:
        return {}
    times = aggregate.times()
    return {
        "chart-rate": go.Figure(
            [go.Bar(x=times, y=values, name=name, marker_color=_COLORS[name])
             for name, values in aggregate.per_second().items()]
        ).update_layout(title="Attempts per second, by outcome", barmode="stack", bargap=0,
                        yaxis_title="attempts / s", **over_time),
        "chart-latency": _latency_figure(aggregate, go, over_time),
        "chart-waits": go.Figure(
            [go.Scatter(x=times, y=values, name=name, mode="lines", fill="tozeroy")
             for name, values in aggregate.waiting().items()]
        ).update_layout(title="Items waiting, by gate (average over each step)",
                        yaxis_title="items waiting", showlegend=True, **over_time),
    }  # fmt: skip


def _charts(aggregate: Aggregate, summary: Summary, plotly: Any) -> str:
    go, pio = plotly
    times = aggregate.times()
    layout: dict[str, Any] = {"height": 320, "margin": {"l": 60, "r": 20, "t": 30, "b": 45}}
    over_time = {"xaxis_title": "seconds from start", **layout}
    counts = sorted(aggregate.attempts_per_item.items())
    outcomes = [("ok", summary.ok), *summary.error_kinds.items()]
    figures: dict[str, Any] = {
        **_live_figures(aggregate, go, over_time),
        "chart-attempts": go.Figure(
            [go.Bar(x=[str(n) for n, _ in counts], y=[k for _, k in counts], name="items")]
        ).update_layout(title="Attempts per item", xaxis_title="requests sent",
                        yaxis_title="items", xaxis_type="category", **layout),
        "chart-outcomes": go.Figure(
            [go.Bar(x=[name for name, _ in outcomes], y=[n for _, n in outcomes], name="items",
                    marker_color=["#2ca02c"] + ["#d62728"] * (len(outcomes) - 1))]
        ).update_layout(title="Outcomes and error kinds", yaxis_title="items",
                        xaxis_type="category", **layout),
    }  # fmt: skip
    spending = aggregate.spending()
    if spending:  # (a run under a spend cap: what its attempts spent, as they ended)
        figures["chart-spend"] = go.Figure(
            [go.Bar(x=times, y=spending["reserved"], name="reserved in the step (worst cases)"),
             go.Bar(x=times, y=spending["spent"], name="spent in the step"),
             go.Scatter(x=times, y=spending["in all"], name="spent in all", mode="lines",
                        yaxis="y2")]
        ).update_layout(title="Dollars reserved and spent, as attempts ended", barmode="overlay",
                        yaxis_title="$ in the step",
                        yaxis2={"title": "$ in all", "overlaying": "y", "side": "right"},
                        **over_time)  # fmt: skip
    charts = [_chart(pio, name, figure, first=not position)
              for position, (name, figure) in enumerate(figures.items())]  # fmt: skip
    return f"<div class='charts'>{''.join(charts)}</div>"


def _plain(aggregate: Aggregate) -> str:
    """The charts' numbers as tables, for a report made without plotly."""
    times = aggregate.times()
    counts = sorted(aggregate.attempts_per_item.items())
    series = (
        ("rate", "Attempts per second, by outcome", aggregate.per_second()),
        ("latency", "Attempt latency percentiles (seconds, ±10 %)", aggregate.percentiles()),
        ("waits", "Items waiting, by gate", aggregate.waiting()),
        ("spend", "Dollars reserved and spent, as attempts ended", aggregate.spending()),
    )
    return (
        f"<p class='note'>Charts need plotly: <code>{_e(INSTALL_HINT)}</code>. "
        "Their numbers follow as tables.</p><h2>Attempts per item</h2>"
        + _table("attempts-per-item", ("requests sent", "items"), counts, {0, 1})
        + "".join(
            f"<details><summary>{_e(title)}</summary>{_series_table(name, times, values)}</details>"
            for name, title, values in series
            if values
        )
    )


def _spend_table(aggregate: Aggregate) -> str:
    """Under a spend cap: what each model priced had reserved (the attempts' worst cases) and
    spent, and the share of the reservations the answers used."""
    rows = [
        (model, attempts, f"{reserved:.6f}", f"{spent:.6f}",
         f"{spent / reserved:.0%}" if reserved else "")
        for model, attempts, reserved, spent in aggregate.spending_by_model()
    ]  # fmt: skip
    if not rows:
        return ""
    head = ("model", "attempts", "$ reserved", "$ spent", "spent of reserved")
    return (
        "<h2>Spend by model</h2><p>Each attempt reserved its worst case under the cap (every "
        "body byte an input token, its max_tokens at the output price) before it was sent; "
        "its answer's usage then replaced it. A low share means the cap held back more than "
        "the answers needed: a smaller max_tokens lets more go at once.</p>"
        + _table("spend-by-model", head, rows, {1, 2, 3, 4})
    )


def _stints_table(stints: Sequence[Stint]) -> str:
    """The passes over the items (the first, then each retry of failures) and each process
    (or ``run()``) that worked in them."""
    if not stints:
        return ""
    rows = (
        (stint.passing.number, stint.passing.describe(), _moment(stint.started),
         f"{stint.elapsed:.2f}", stint.items, stint.requests)
        for stint in stints
    )  # fmt: skip
    head = ("pass", "what", "started", "seconds", "items finished", "requests")
    return (
        "<h2>Passes</h2><p>Each process (or run()) that worked on the run, in its pass: the "
        f"first, then each retry of the failures.</p>{_table('passes', head, rows, ())}"
    )


def _moment(when: float | None) -> str:
    return "" if when is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))


def _runs_text(part: Part) -> str:
    """A part's rows as its count and its runs of indexes: ``5 (0-4)``."""
    runs = [str(first) if first == last else f"{first}-{last}" for first, last in part.rows]
    shown = ", ".join(runs[:RUNS_SHOWN]) + (", …" if len(runs) > RUNS_SHOWN else "")
    return f"{part.size} ({shown})"


_PART_COLUMNS = ("part", "pass", "provider", "rows", "batch id", "state now", "submitted",
                 "last change", "input tokens", "output tokens")  # fmt: skip


def _part_cells(part: Part) -> tuple[object, ...]:
    last_change = part.history[-1][0] if part.history else None
    return (part.number, part.passing, part.provider, _runs_text(part), part.batch, part.state,
            _moment(part.submitted), _moment(last_change), *part.tokens)  # fmt: skip


# What the section says of parts dropped and of parts still open, when there are any.
_PART_NOTES = (
    ("dropped", " Parts dropped: {} (a later run found each without a batch at the provider "
     "and put its rows in new parts)."),
    ("still_open", " Parts still open at the provider: {} (--batch-api with --resume or "
     "--retry-failed goes on with them; a live run is refused meanwhile)."),
)  # fmt: skip


# Why the rows of a run that went through a batch endpoint were answered by each lane.
_LANE_WHY = {
    "batch": "answered through the provider's batch endpoint, at its price",
    "live": "sent live, one call each: their batch was cancelled before it ran them (--lanes "
    "auto, when the deadline left too little time for the batches), or they were in none",
    "none": "answered by neither: never sent, or their batch did not run them (see the error)",
}


def _lanes_table(lanes: Mapping[str, int]) -> str:
    """Which lane answered how many rows, and why."""
    rows = [(lane, lanes[lane], why) for lane, why in _LANE_WHY.items() if lanes.get(lane)]
    return "<h3 id='lanes'>Lanes</h3>" + _table("lanes", ("lane", "rows", "why"), rows, {1})


def _submissions_section(parts: Sequence[Part], plotly: Any, lanes: Mapping[str, int]) -> str:
    """The parts sent through a batch endpoint: which lane answered the rows, what each part
    is now, how it got there, and the tokens they used; nothing for a run that sent none."""
    if not parts:
        return ""
    sums = submitted(parts)
    notes = "".join(note.format(sums[name]) for name, note in _PART_NOTES if sums[name])
    chart = _submissions_chart(parts, plotly) if plotly is not None else ""
    count = how_many(len(parts), "part")
    return (
        "<h2 id='batch-submissions'>Batch submissions</h2>"
        f"<p>The rows went through the provider's batch endpoint in {count}. "
        "A row's seconds run from its part's submission to the collection of its "
        f"results.{_e(notes)}</p>"
        + _lanes_table(lanes)
        + _table("submissions", _PART_COLUMNS, map(_part_cells, parts), {0, 1, 8, 9})
        + f"<p id='batch-tokens'>Tokens used: {sums['inputs']} input and {sums['outputs']} "
        f"output, as the provider counted them. {_e(HALF_PRICE.format_map(sums))}</p>{chart}"
        + _history_table(parts)
    )


def _stays(part: Part) -> Iterator[tuple[float, str, float | None]]:
    """Each state in a part's history: when it entered it, and when it left it (None: it is
    in it still)."""
    history = part.history
    leaving = [when for when, _ in history[1:]] + [None]  # (one more when there is none)
    return ((when, state, left) for (when, state), left in zip(history, leaving, strict=False))


def _history_table(parts: Sequence[Part]) -> str:
    """Each part's states, in order: when it entered each and how long it stayed."""
    rows = (
        (part.number, state, _moment(when), f"{when - part.history[0][0]:.1f}",
         None if left is None else f"{left - when:.1f}")
        for part in parts
        for when, state, left in _stays(part)
    )  # fmt: skip
    head = ("part", "state", "at", "seconds from planned", "seconds in it")
    table = _table("submission-history", head, rows, {0, 3, 4})
    return f"<details><summary>Each part's states over time</summary>{table}</details>"


def _submissions_chart(parts: Sequence[Part], plotly: Any) -> str:
    """Each part's states as a bar along the time from the first part's start (plotly.js is
    on the page already: the other charts brought it)."""
    go, pio = plotly
    start = min((part.history[0][0] for part in parts if part.history), default=0.0)
    spans: dict[str, tuple[list[float], list[float], list[str]]] = {}
    for part in parts:
        for when, state, left in _stays(part):
            bases, lengths, names = spans.setdefault(state, ([], [], []))
            bases.append(when - start)
            lengths.append(max((when if left is None else left) - when, 0.0))
            names.append(f"part {part.number}")
    bars = [
        go.Bar(base=bases, x=lengths, y=names, name=state, orientation="h")
        for state, (bases, lengths, names) in spans.items()
    ]
    figure = go.Figure(bars)
    figure.update_layout(
        title="Each part's states over time",
        barmode="overlay",
        xaxis_title="seconds from the first part's start",
        yaxis={"autorange": "reversed", "type": "category"},
        height=max(220, 60 + 28 * len(parts)),
        margin={"l": 70, "r": 20, "t": 30, "b": 45},
    )
    return _chart(pio, "chart-submissions", figure)


@contextlib.contextmanager
def replacing(path: Path, **text: Any) -> Iterator[IO[Any]]:
    """A new file beside ``path`` to write (bytes, or text opened with the options ``text``),
    synced and renamed over ``path`` once the block is done; removed when it fails."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with temporary.open("x" if text else "xb", **text) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


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
    PREFIX-report.html, from ``resultset.StoredResults``; a ``ResultSet``'s, from its Results
    in memory): one page, scripts and data inline. ``timeline``: the run's gate waits
    (``WaitStats.timeline``), ``stints`` what each process did, ``submissions`` the parts it
    sent through a batch endpoint (a section of their own when there are any)."""
    aggregate, details = collected(entries, span, timeline)
    plotly = _plotly() if charts else None
    started = _moment(aggregate.start) if aggregate.items else ""
    untimed = (
        f"<p class='note'>Items with no finish time (finished by an older run): "
        f"{aggregate.untimed}. They are counted, but not drawn over time.</p>"
        if aggregate.untimed
        else ""
    )
    gates = ", ".join(f"{gate} {s:.1f} s" for gate, s in sorted(summary.waits.items()))
    unlisted = aggregate.failed_total - len(aggregate.failed)
    body = (
        f"<h1>{_e(title)}</h1>"
        f"<p class='summary'>{_e(summary)}</p>"
        f"<p>Run started {_e(started)}; time steps of {aggregate.width:g} s.</p>"
        "<h2>Outcomes</h2>"
        f"<div style='display:flex;gap:2em;flex-wrap:wrap'>{_counts_table(summary)}"
        f"{_figures_table(summary)}</div>{untimed}{_stints_table(stints)}"
        f"{_spend_table(aggregate)}"
        + (_charts(aggregate, summary, plotly) if plotly is not None else _plain(aggregate))
        + (
            "<p>The waits chart shows the backoff between attempts, from the attempt logs, "
            "and the waits at the gates (token, cooldown, host_slot, breaker, adaptive), over "
            "every process that worked on the run. The totals: "
            f"{_e(gates or 'none')}.</p>"
        )
        + _submissions_section(submissions, plotly, aggregate.lanes)
        + _items_table("slowest", "Slowest items", details(aggregate.slowest_indexes()))
        + _items_table("failed", "Failed items", details(aggregate.failed), unlisted)
    )
    page = (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width'><title>{_e(title)}</title>"
        f"<style>{_STYLE}</style></head><body>{body}<script>{_FILTER}</script></body></html>"
    )
    # (a lone surrogate, from a JSON "\\ud800" escape in an id or url: as its escape)
    with replacing(Path(path), encoding="utf-8", errors="backslashreplace") as handle:
        handle.write(page)
    return Path(path)
