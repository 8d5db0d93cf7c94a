"""The ResultSet a batch returns: its Results in input order, and what can be made of them
(the summary, the report, tables, data frames, the failures sent again).

Above ``result``, ``report`` and ``columnar``, so that a Result knows nothing of how a set of
them is written out.
"""

from __future__ import annotations

import html
import json
import math
import os
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from ..core.history import Stint, totals
from ..core.result import (
    Counted,
    Listing,
    Result,
    Summary,
    Trace,
    Tried,
    counted,
    error_kinds,
    flat_body,
    kept,
    summarize,
)
from ..store.journal import JournalMismatch, JournalReader
from ..store.rules import (
    EVER,
    Rule,
    boolean,
    count,
    each,
    kind,
    number,
    optional,
    present,
    problem,
    shaped,
    text,
)
from ..store.submissions import Part
from .columnar import PARQUET_HINT, pyarrow_missing, write_table
from .report import replacing, report_of
from .report_data import Entry, entries_of

if TYPE_CHECKING:
    import pandas


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("this needs pandas: pip install 'batchsync[pandas]'") from exc
    return pd


# pandas dtypes of the typed columns; nullable ones where a Result may hold None.
COLUMN_TYPES = {
    "index": "int64", "ok": "bool", "status_code": "Int64", "attempts": "int64",
    "error_kind": "string", "error": "string", "elapsed": "float64", "fallback_used": "Int64",
    "redirects": "int64",
}  # fmt: skip


# Sends a batch's failed items again: (the error kinds to retry, empty: all; the options
# that change) -> the merged set.
Retry = Callable[[frozenset[str], dict[str, Any]], "ResultSet"]


class ResultSet(Sequence[Result]):
    """The Results of a batch, one per input item, in input order.

    ``stints``: what each ``run()`` (or process, for a journal) did, for the report's table
    of passes; ``retry``: how the batch that made the set sends its failures again (see
    ``retry_failed``); ``submissions``: the parts a batch sent through a provider's batch
    endpoint (``batch_api=``), for the report's section on them (or how to read them, when
    the report asks: a journal's are read only then).
    """

    def __init__(
        self,
        results: Sequence[Result],
        elapsed: float | None = None,
        waits: dict[str, float] | None = None,
        circuits_opened: int = 0,
        wait_timeline: dict[tuple[str, int], float] | None = None,
        *,
        stints: Sequence[Stint] = (),
        retry: Retry | None = None,
        submissions: Sequence[Part] | Callable[[], Sequence[Part]] = (),
    ) -> None:
        self._results = list(results)
        self.elapsed = elapsed
        self.waits = dict(waits or {})
        self.circuits_opened = circuits_opened
        # Seconds waited at each gate by (gate, unix second), for the report.
        self.wait_timeline = dict(wait_timeline or {})
        self.stints = tuple(stints)
        self._retry = retry
        self._submissions = submissions

    @overload
    def __getitem__(self, index: int) -> Result: ...
    @overload
    def __getitem__(self, index: slice) -> list[Result]: ...
    def __getitem__(self, index: int | slice) -> Result | list[Result]:
        return self._results[index]

    def __len__(self) -> int:
        return len(self._results)

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    def __repr__(self) -> str:
        return f"<ResultSet {self.summary()}>"

    @property
    def submissions(self) -> tuple[Part, ...]:
        """The parts sent through a provider's batch endpoint (none for a live run)."""
        given = self._submissions
        return tuple(given() if callable(given) else given)

    @property
    def ok(self) -> list[Result]:
        return [result for result in self._results if result.ok]

    @property
    def failed(self) -> list[Result]:
        return [result for result in self._results if not result.ok]

    def retry_failed(self, *, kinds: Iterable[str] | None = None, **options: Any) -> ResultSet:
        """Send the failed items again (only those whose ``error_kind`` is in ``kinds``, when
        given), each with a fresh budget, with the batch's options changed by ``options``
        (its journal stays its own); the successes are kept as they are. Returns the merged
        set: every item, in input order, a retried one with the attempts of both passes
        (``attempts``, ``attempt_log``). ValueError for a set that no batch made (its items
        are unknown)."""
        if self._retry is None:
            raise ValueError(
                "this ResultSet was not made by fetch_all, run_all or a Batch: it does not know "
                "its items, so it cannot send them again"
            )
        chosen = frozenset() if kinds is None else error_kinds(kinds)
        if kinds is not None and not chosen:
            raise ValueError("kinds: name at least one error kind, or leave it out for all")
        return self._retry(chosen, options)

    def summary(self) -> Summary:
        return summarize(
            map(counted, self._results),
            sorted(kept(result.elapsed) for result in self._results if result.attempts),
            elapsed=self.elapsed,
            waits=self.waits,
            circuits_opened=self.circuits_opened,
        )

    def report(self, path: str | Path, *, charts: bool = True) -> Path:
        """Write the batch's report to ``path``: one self-contained HTML file (charts need
        the ``report`` extra, plotly; without it, tables). Returns the path."""
        entries, span = entries_of(self._results)
        return report_of(entries, span, self.summary(), path, charts=charts, **_ran(self))

    def to_pandas(self, expand: bool = False) -> pandas.DataFrame:
        """One row per item with typed columns (needs the ``pandas`` extra).

        ``expand=True`` replaces the ``data`` column by the successes' JSON bodies spread
        into ``data.``-prefixed columns (see ``data_frame``).
        """
        pd = _pandas()
        frame: pandas.DataFrame = pd.DataFrame.from_records(
            [result.to_dict() for result in self._results],
            columns=list(Result.__dataclass_fields__),
        )
        typed: pandas.DataFrame = frame.astype(COLUMN_TYPES)
        if not expand:
            return typed
        bodies = self.data_frame().add_prefix("data.")
        expanded: pandas.DataFrame = typed.drop(columns="data").merge(
            bodies, how="left", left_on="index", right_index=True
        )
        return expanded

    def to_csv(self, path: str | os.PathLike[str], *, flatten: bool = False) -> None:
        """Write the Results to ``path`` as the CLI's ``--format csv`` does (``flatten``:
        its ``--flatten``); the file is replaced only once it is whole."""
        self._write_table(Path(path), "csv", flatten)

    def to_parquet(self, path: str | os.PathLike[str], *, flatten: bool = False) -> None:
        """Write the Results to ``path`` as the CLI's ``--format parquet`` does (needs the
        ``parquet`` extra); the file is replaced only once it is whole."""
        self._write_table(Path(path), "parquet", flatten)

    def _write_table(self, path: Path, form: str, flatten: bool) -> None:
        if form == "parquet" and pyarrow_missing():
            raise ImportError(f"this needs pyarrow: {PARQUET_HINT}")
        paged = any(result.pages is not None for result in self._results)
        text = {} if form == "parquet" else {"encoding": "utf-8", "newline": ""}
        records = partial(map, Result.to_dict, self._results)  # (a fresh pass each call)
        with replacing(path, **text) as handle:
            write_table(handle, form, records, paged=paged, flatten=flatten)

    def data_frame(self) -> pandas.DataFrame:
        """The JSON bodies of the successes as columns (see ``flat_body``: as
        ``pandas.json_normalize`` spreads them), indexed by the item's index."""
        pd = _pandas()
        ok = [result for result in self._results if result.ok]
        rows = [flat_body(result.to_dict()["data"]) for result in ok]
        frame: pandas.DataFrame = pd.DataFrame.from_records(rows)
        frame.index = pd.Index([result.index for result in ok], name="index")
        return frame

    def _repr_html_(self) -> str:
        summary, failed = self.summary()._repr_html_(), self.failed
        if not failed:
            return summary
        rows = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(value))}</td>" for value in _SHOWN(r)) + "</tr>"
            for r in failed[:10]
        )
        head = "".join(f"<th>{name}</th>" for name in _SHOWN_AS)
        note = f"<p>… and {len(failed) - 10} more failures</p>" if len(failed) > 10 else ""
        return f"{summary}<p>First failures:</p><table><tr>{head}</tr>{rows}</table>{note}"


# What a notebook shows of the first failures, and under which heads.
_SHOWN = attrgetter("index", "url", "final_url", "status_code", "error_kind", "error")
_SHOWN_AS = ("index", "url", "final url", "status", "error kind", "error")


@dataclass(frozen=True, slots=True)
class Final:
    """One item's final Result as every output of a journaled run reads it: the record (the
    results file's line) and its fields, the failed file's line (None unless the record
    failed) and when it finished (for the report)."""

    index: int
    record: str
    fields: dict[str, Any]
    request: str | None
    finished: float | None

    def trace(self) -> Trace:
        log = tuple(map(_tried, self.fields["attempt_log"]))
        traced = {key: self.fields[key] for key in _TRACED}
        return Trace(index=self.index, finished=self.finished, log=log, **traced)

    def listing(self) -> Listing:
        return Listing(self.index, *_LISTED(self.fields))


# The fields of a record (and of its attempt log's entries) that a Trace, a Listing and the
# summary's counts (``Counted``) hold, in their order.
_TRACED = ("ok", "error_kind", "status_code", "attempts", "elapsed")
_COUNTED = itemgetter("ok", "error_kind", "status_code", "attempts")


def _tried(attempt: dict[str, Any]) -> Tried:
    """A stored attempt as the report reads it (its spend only under a spend cap)."""
    return Tried(
        attempt["status_code"],
        attempt["error_kind"],
        attempt["elapsed"],
        attempt["wait"],
        attempt.get("cost"),
        attempt.get("reserved"),
        attempt.get("model"),
        attempt.get("lane"),
    )


_LISTED = itemgetter("url", "id", "status_code", "error_kind", "error", "attempts", "elapsed")


class StoredResults:
    """A journaled run's final Results: the one source of the command line's summary line,
    results file, failed file, columnar tables and report, so that they cannot disagree.

    Every output reads the stored records (the Results as written), never the journal's
    columns beside them: a failed record's line goes to the failed file and only a failed
    one's. ``summary`` is computed once, on a first pass that also checks each record
    (JournalMismatch naming the item when it is not a Result, or a failure has no line to
    re-run). Iterating makes a fresh pass in input order, holding one record at a time; only
    the latency percentiles hold a float per item sent.
    """

    def __init__(self, reader: JournalReader, path: Path) -> None:
        self._reader = reader
        self._path = path
        self.stints = reader.stints()
        self.wait_timeline = reader.timeline()
        # The parts sent through a batch endpoint (none for a live run), for the report.
        self.submissions = reader.parts()
        self.span: tuple[float, float] | None = None
        times = array("d")
        # (summarize reads every row before it asks for the times: sorted once they are in)
        ran = asdict(totals(self.stints))  # (the run's totals: a summary's keywords)
        self.summary = summarize(self._counted(times), _sorted(times), **ran)

    def _counted(self, times: array[float]) -> Iterator[Counted]:
        """The first pass: what the summary counts of each Result, the times of those sent,
        and the run's time span."""
        first, last = math.inf, -math.inf
        for final in self:
            fields = final.fields
            if fields["attempts"]:
                times.append(fields["elapsed"])
            if final.finished is not None:
                first = min(first, final.finished - fields["elapsed"])
                last = max(last, final.finished)
            ok, kind, status, attempts = _COUNTED(fields)
            waited = sum(e["wait"] or 0.0 for e in fields["attempt_log"])
            yield ok, kind, status, attempts, waited, fields.get("cost")
        self.span = None if first == math.inf else (first, last)

    def _final(self, index: int, record: str, request: str | None, finished: Any) -> Final:
        """One stored row as a Final; JournalMismatch naming the item when its record breaks
        ``_RECORD`` (not a Result as batchsync writes them, a failure with no failed line)."""
        try:
            fields = json.loads(record)
            facts = {"item": index, "request": request, "finished": finished}
            found = problem(_RECORD, fields | facts) if isinstance(fields, dict) else _NOT_ITS
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            found = "is not a Result"
        if found is not None:
            raise JournalMismatch(f"{self._path} was altered: the record of item {index} {found}")
        return Final(index, record, fields, None if fields["ok"] else request, finished)

    def __iter__(self) -> Iterator[Final]:
        for index, record, request, finished in self._reader.finals():
            yield self._final(index, record, request, finished)

    def rows(self) -> Iterator[tuple[str, str | None]]:
        """(record, failed line) pairs in input order, as ``cli.output.write_outputs`` takes."""
        return ((final.record, final.request) for final in self)

    def entries(self) -> Iterator[Entry]:
        return ((final.trace(), final.listing()) for final in self)

    def report(self, path: Path, *, title: str, charts: bool = True) -> Path:
        """The run's report, from the same Results and summary as the other outputs."""
        entries, span = self.entries(), self.span
        return report_of(
            entries, span, self.summary, path, title=title, charts=charts, **_ran(self)
        )


def _ran(results: ResultSet | StoredResults) -> dict[str, Any]:
    """What a report shows of the run besides its Results: the seconds waited at each gate by
    (gate, unix second), what each process did, the parts sent through a batch endpoint."""
    return {"timeline": results.wait_timeline, "stints": results.stints,
            "submissions": results.submissions}  # fmt: skip


def _sorted(times: array[float]) -> Iterator[float]:
    yield from sorted(times)


# An attempt log's entry as every output reads it.
_LOGGED = shaped(
    Rule("status_code", present, ""),
    Rule("error_kind", present, ""),
    Rule("elapsed", EVER, ""),
    Rule("wait", optional(number(0.0, math.inf)), ""),
    closed=False,
)
_NOT_ITS = "is not that item's"
# A record of item ``item`` (its failed-file line ``request``, when it ``finished``): the
# fields every output reads, of their types and ranges.
_RECORD = (
    Rule("index", lambda index, facts: index == facts["item"], _NOT_ITS),
    Rule("ok", boolean, "has no outcome it can have"),
    Rule("error_kind", optional(kind), "has no outcome it can have"),
    Rule("status_code", optional(count()), "has no status code it can have"),
    Rule("attempts", count(), "has no attempts or time it can have"),
    Rule("elapsed", number(0.0, math.inf), "has no attempts or time it can have"),
    Rule("attempt_log", each(_LOGGED), "has an attempt log that is not its attempts'"),
    Rule("url", optional(text), "has a url that is no text"),
    Rule("error", optional(text), "has a error that is no text"),
    Rule("request", lambda line, facts: line is not None or facts["ok"],
         "failed, but has no line for the failed file"),
    Rule("finished", optional(EVER), "has no finish time"),
)  # fmt: skip
