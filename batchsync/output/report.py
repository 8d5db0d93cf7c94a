"""The run's report: one self-contained HTML file of charts and tables over every Result,
rendered from its numbers (``report_data``): with plotly when it is installed (the ``report``
extra: one inline copy of plotly.js for every chart, so the file opens without a network) and
plain HTML tables otherwise.
"""

from __future__ import annotations

import contextlib
import html
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.history import Stint
from ..core.result import Listing, Summary
from ..store.submissions import Part
from .report_data import Aggregate, Entry, Submitted, collected, submitted

INSTALL_HINT = "pip install 'batchsync[report]'"
# Runs of row indexes shown in a part's cell of the submissions table (the rest: "…").
RUNS_SHOWN = 4
# What the providers say of their batch endpoints' price, and nothing more: no per-token
# prices, which differ by model and change.
HALF_PRICE = (
    "The batch endpoints are billed at half the live price: these {inputs} input and "
    "{outputs} output tokens cost half what the same calls made live would."
)


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


def _head(names: Iterable[str]) -> str:
    """A table's header cells."""
    return "".join(f"<th>{_e(name)}</th>" for name in names)


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
    head = _head(("index", "id", "url", "status", "error kind", "error", "attempts", "seconds"))
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
    head = _head(("seconds from start", *series))

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


def _chart(pio: Any, name: str, figure: Any, *, first: bool = False) -> str:
    """One chart's div; the ``first`` brings the page's one copy of plotly.js."""
    chart = pio.to_html(
        figure,
        include_plotlyjs=first,
        full_html=False,
        div_id=name,
        config={"displaylogo": False, "responsive": True},
    )
    return f"<div class='chart'>{chart}</div>"


def _charts(aggregate: Aggregate, summary: Summary, plotly: Any) -> str:
    go, pio = plotly
    times = aggregate.times()
    layout: dict[str, Any] = {"height": 340, "margin": {"l": 55, "r": 20, "t": 45, "b": 45}}
    over_time = {"xaxis_title": "seconds from start", **layout}
    counts = sorted(aggregate.attempts_per_item.items())
    outcomes = [("ok", summary.ok), *summary.error_kinds.items()]
    figures = {
        "chart-rate": go.Figure(
            [go.Bar(x=times, y=values, name=name, marker_color=_COLORS[name])
             for name, values in aggregate.per_second().items()]
        ).update_layout(title="Attempts per second, by outcome", barmode="stack", bargap=0,
                        yaxis_title="attempts / s", **over_time),
        "chart-latency": go.Figure(
            [go.Scatter(x=times, y=values, name=name, mode="lines+markers", connectgaps=True)
             for name, values in aggregate.percentiles().items()]
        ).update_layout(
            title="Attempt latency percentiles (±10 %; lines join the steps with attempts)",
            yaxis_title="seconds", yaxis_type="log", **over_time),
        "chart-waits": go.Figure(
            [go.Scatter(x=times, y=values, name=name, mode="lines", fill="tozeroy")
             for name, values in aggregate.waiting().items()]
        ).update_layout(title="Items waiting, by gate (average over each step)",
                        yaxis_title="items waiting", showlegend=True, **over_time),
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
    charts = [_chart(pio, name, figure, first=not position)
              for position, (name, figure) in enumerate(figures.items())]  # fmt: skip
    return f"<div class='charts'>{''.join(charts)}</div>"


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
    head = _head(("pass", "what", "started", "seconds", "items finished", "requests"))
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


_PART_COLUMNS = ("part", "pass", "provider", "rows", "batch id", "state now", "submitted",
                 "last change", "input tokens", "output tokens")  # fmt: skip


def _part_row(part: Part) -> str:
    last_change = part.history[-1][0] if part.history else None
    return (
        f"<tr><td class='n'>{part.number}</td><td class='n'>{part.passing}</td>"
        f"<td>{_e(part.provider)}</td><td>{_e(_runs_text(part))}</td><td>{_e(part.batch)}</td>"
        f"<td>{_e(part.state)}</td><td>{_e(_moment(part.submitted))}</td>"
        f"<td>{_e(_moment(last_change))}</td>"
        f"<td class='n'>{part.tokens[0]}</td><td class='n'>{part.tokens[1]}</td></tr>"
    )


def _part_notes(sums: Submitted) -> str:
    """What the section says of parts dropped and parts still open, when there are any."""
    notes = ""
    if sums.dropped:
        notes += (
            f" {sums.dropped} part(s) were dropped: a later run found them without a batch at "
            "the provider and put their rows in new parts."
        )
    if sums.still_open:
        notes += (
            f" {sums.still_open} part(s) are still open at the provider: --batch-api with "
            "--resume or --retry-failed goes on with them (a live run is refused meanwhile)."
        )
    return notes


def _submissions_section(parts: Sequence[Part], plotly: Any) -> str:
    """The parts sent through a batch endpoint: what each is now, how it got there, and the
    tokens they used; nothing for a run that sent none."""
    if not parts:
        return ""
    sums = submitted(parts)
    notes = _part_notes(sums)
    chart = _submissions_chart(parts, plotly) if plotly is not None else ""
    price = HALF_PRICE.format(inputs=sums.inputs, outputs=sums.outputs)
    return (
        "<h2 id='batch-submissions'>Batch submissions</h2>"
        f"<p>The rows went through the provider's batch endpoint in {len(parts)} part(s). "
        "A row's seconds run from its part's submission to the collection of its "
        f"results.{_e(notes)}</p>"
        f"<table id='submissions'><thead><tr>{_head(_PART_COLUMNS)}</tr></thead>"
        f"<tbody>{''.join(map(_part_row, parts))}</tbody></table>"
        f"<p id='batch-tokens'>Tokens used: {sums.inputs} input and {sums.outputs} output, as "
        f"the provider counted them. {_e(price)}</p>{chart}{_history_table(parts)}"
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
    head = _head(("part", "state", "at", "seconds from planned", "seconds in it"))
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
    return _chart(pio, "chart-submissions", figure)


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
    in memory); ``timeline``: the run's gate
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
