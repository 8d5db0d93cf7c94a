"""What happened to each item: Result, its attempt log, and the ResultSet a batch returns."""

from __future__ import annotations

import html
import math
import os
import typing
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from pydantic import BaseModel

from .history import Stint
from .kinds import NOT_FINAL
from .verdict import ErrorKind

if TYPE_CHECKING:
    import pandas


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt: its number, what came back, how long it took and the wait that followed.

    ``fallback`` is the index of the fallback route it was made on (None: the item's own);
    ``hedged`` says a second identical request was raced against it; ``resent`` how many
    times it was sent again after a token refresh (requests beyond the one, or the hedged
    pair, that ``hedged`` counts).
    """

    attempt: int
    status_code: int | None
    error_kind: ErrorKind | None
    elapsed: float
    wait: float | None = None
    fallback: int | None = None
    hedged: bool = False
    resent: int = 0

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> AttemptRecord:
        return cls(
            record["attempt"], record["status_code"], record["error_kind"], record["elapsed"],
            record["wait"], record.get("fallback"), record.get("hedged", False),
            record.get("resent", 0),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "status_code": self.status_code,
            "error_kind": self.error_kind,
            "elapsed": round(self.elapsed, 6),
            "wait": None if self.wait is None else round(self.wait, 6),
            "fallback": self.fallback,
            "hedged": self.hedged,
        } | ({"resent": self.resent} if self.resent else {})


@dataclass(frozen=True, slots=True)
class Result:
    """The final outcome of one input item (the fields of the design's Result table)."""

    index: int
    url: str | None
    ok: bool
    id: Any = None
    status_code: int | None = None
    attempts: int = 0
    error_kind: ErrorKind | None = None
    error: str | None = None
    data: Any = None
    elapsed: float = 0.0
    attempt_log: tuple[AttemptRecord, ...] = field(default=())
    fallback_used: int | None = None
    final_url: str | None = None
    redirects: int = 0
    # Pages fetched, when the item was paginated (None otherwise).
    pages: int | None = None
    # When the Result was made (unix seconds), for the report's charts over time; None for a
    # Result made outside the engine. Not written to the results file.
    finished: float | None = field(default=None, repr=False, compare=False)
    # Where a paginated item that stopped partway would go on (its next page, secrets
    # included): kept only by the journal, for a resumed run; never shown or written out.
    continuation: Any = field(default=None, repr=False, compare=False)

    @property
    def final(self) -> bool:
        """False only for an item stopped while waiting to retry with nothing kept: a later
        run should redo it. (A paginated one that got pages is kept and goes on from there.)"""
        return self.error_kind not in NOT_FINAL or self.continuation is not None

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Result:
        """The Result a ``to_dict`` record was made from (``data`` in its JSON form)."""
        fields = {name: record[name] for name in cls.__dataclass_fields__ if name in record}
        fields["attempt_log"] = tuple(
            AttemptRecord.from_dict(entry) for entry in record.get("attempt_log") or ()
        )
        return cls(**fields)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; a pydantic model in ``data`` becomes its JSON form."""
        data = self.data
        if isinstance(data, BaseModel):
            data = data.model_dump(mode="json")
        return {
            "index": self.index,
            "url": self.url,
            "final_url": self.final_url,
            "redirects": self.redirects,
            "id": self.id,
            "ok": self.ok,
            "status_code": self.status_code,
            "attempts": self.attempts,
            "error_kind": self.error_kind,
            "error": self.error,
            "data": data,
            "elapsed": round(self.elapsed, 6),
            "attempt_log": [record.to_dict() for record in self.attempt_log],
            "fallback_used": self.fallback_used,
        } | ({} if self.pages is None else {"pages": self.pages})


def error_kinds(kinds: Iterable[str]) -> frozenset[str]:
    """``kinds`` (or one kind) checked to be error kinds (ValueError naming the first that
    is not)."""
    known = typing.get_args(ErrorKind)
    chosen = frozenset([kinds] if isinstance(kinds, str) else kinds)
    for kind in sorted(chosen):
        if kind not in known:
            raise ValueError(f"{kind!r} is not an error kind; the kinds: {', '.join(known)}")
    return chosen


def added_to(earlier: Result, later: Result) -> Result:
    """``later``, the Result of an item sent again (a retry of its failure, a paginated item
    going on from its next page), counting ``earlier``'s attempts and time too, so that it
    tells the item's whole story: ``attempts``, ``elapsed`` and ``attempt_log`` (numbered
    on from ``earlier``'s) cover both."""
    shift = max((record.attempt for record in earlier.attempt_log), default=0)
    renumbered = tuple(
        replace(record, attempt=record.attempt + shift) for record in later.attempt_log
    )
    return replace(
        later,
        attempts=earlier.attempts + later.attempts,
        elapsed=earlier.elapsed + later.elapsed,
        attempt_log=earlier.attempt_log + renumbered,
    )


PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}


def rank(count: int, share: float) -> int:
    """The 0-based position of the ``share`` percentile among ``count`` sorted values."""
    return min(count - 1, max(0, math.ceil(share * count) - 1))


def percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` percentile of ``values`` by nearest rank."""
    ordered = sorted(values)
    return ordered[rank(len(ordered), share)]


@dataclass(frozen=True)
class Summary:
    """Counts by outcome, error kind and status code, and the run's statistics.

    ``latency`` holds p50/p95/p99 of the item times (claim to Result) of the items that sent
    at least one request; ``waits`` the seconds spent waiting, by cause (``backoff`` between
    attempts, and each gate: ``token``, ``cooldown``, ``host_slot``, ``adaptive``).

    Every number covers the whole run: a run resumed, retried or continued in several
    processes (or ``run()`` calls) counts the requests, waits and seconds of all of them, and
    ``elapsed`` is the time they spent running, not the time between them.
    """

    total: int
    ok: int
    failed: int
    error_kinds: dict[str, int]
    status_codes: dict[int, int]
    requests_sent: int
    elapsed: float | None = None
    waits: dict[str, float] = field(default_factory=dict)
    circuits_opened: int = 0
    latency: dict[str, float] = field(default_factory=dict)

    @property
    def requests_per_second(self) -> float | None:
        if not self.elapsed:
            return None
        return self.requests_sent / self.elapsed

    @property
    def attempts_per_item(self) -> float | None:
        return self.requests_sent / self.total if self.total else None

    def _facts(self) -> list[tuple[str, str]]:
        """The statistics as (name, value) pairs, for both the text and the HTML form."""
        facts = [("requests", str(self.requests_sent))]
        if self.attempts_per_item is not None:
            facts.append(("per item", f"{self.attempts_per_item:.2f}"))
        if self.elapsed is not None:
            facts.append(("elapsed", f"{self.elapsed:.2f} s"))
        if self.requests_per_second is not None:
            facts.append(("requests/s", f"{self.requests_per_second:.0f}"))
        facts += [(f"latency {name}", f"{value:.3f} s") for name, value in self.latency.items()]
        facts += [(f"waited: {cause}", f"{s:.1f} s") for cause, s in sorted(self.waits.items())]
        if self.circuits_opened:
            facts.append(("circuits opened", str(self.circuits_opened)))
        return facts

    def __str__(self) -> str:
        parts = [f"{self.total} items: {self.ok} ok, {self.failed} failed"]
        if self.error_kinds:
            kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.error_kinds.items()))
            parts[0] += f" ({kinds})"
        sent = f"{self.requests_sent} requests"
        if self.attempts_per_item is not None:
            sent += f" ({self.attempts_per_item:.2f} per item)"
        if self.elapsed is not None:
            sent += f" in {self.elapsed:.2f} s"
        if self.requests_per_second is not None:
            sent += f", {self.requests_per_second:.0f}/s"
        parts.append(sent)
        if self.latency:
            parts.append("latency " + ", ".join(f"{k} {v:.3f} s" for k, v in self.latency.items()))
        if self.waits:
            parts.append(
                "waited: " + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(self.waits.items()))
            )
        if self.circuits_opened:
            parts.append(f"{self.circuits_opened} circuit(s) opened")
        return "; ".join(parts)

    def _repr_html_(self) -> str:
        rows: list[tuple[str, object]] = [
            ("items", self.total),
            ("ok", self.ok),
            ("failed", self.failed),
        ]
        rows += [(f"error: {kind}", n) for kind, n in sorted(self.error_kinds.items())]
        rows += [(f"HTTP {code}", n) for code, n in sorted(self.status_codes.items())]
        rows += self._facts()
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(str(name))}</th>"
            f"<td>{html.escape(str(value))}</td></tr>"
            for name, value in rows
        )
        return f"<table>{body}</table>"


# What a summary counts of one Result: ok, error_kind, status_code, attempts, seconds of backoff.
Facts = tuple[bool, ErrorKind | None, int | None, int, float]


def facts_of(result: Result) -> Facts:
    backoff = sum(record.wait or 0.0 for record in result.attempt_log)
    return result.ok, result.error_kind, result.status_code, result.attempts, backoff


def summarize(
    facts: Iterable[Facts],
    sorted_times: Iterable[float],
    *,
    elapsed: float | None = None,
    waits: dict[str, float] | None = None,
    circuits_opened: int = 0,
) -> Summary:
    """The one way a Summary is computed, for Results in memory and in a journal alike.

    ``facts`` are read first, once; then ``sorted_times`` (the elapsed seconds of the items
    that made an attempt, in ascending order) as a stream, up to the last percentile.
    """
    total = ok = sent = timed = 0
    backoff = 0.0
    kinds = Counter[str]()
    codes = Counter[int]()
    for is_ok, kind, code, attempts, waited in facts:
        total += 1
        ok += bool(is_ok)
        sent += attempts
        timed += attempts > 0
        backoff += waited
        if kind is not None:
            kinds[kind] += 1
        if code is not None:
            codes[code] += 1
    all_waits = dict(waits or {})
    if backoff:
        all_waits["backoff"] = backoff
    return Summary(
        total=total, ok=ok, failed=total - ok, error_kinds=dict(sorted(kinds.items())),
        status_codes=dict(sorted(codes.items())),
        requests_sent=sent, elapsed=elapsed, waits=all_waits, circuits_opened=circuits_opened,
        latency=_percentiles(sorted_times, timed),
    )  # fmt: skip


def _percentiles(sorted_times: Iterable[float], count: int) -> dict[str, float]:
    """The latency percentiles by nearest rank, read from a sorted stream of ``count`` values
    (nothing held but the values wanted)."""
    # Several percentiles may fall on one position (few items): each gets its value.
    wanted: dict[int, list[str]] = {}
    for name, share in PERCENTILES.items():
        wanted.setdefault(rank(count, share), []).append(name)
    found: dict[str, float] = {}
    for position, seconds in enumerate(sorted_times):
        for name in wanted.get(position, ()):
            found[name] = seconds
        if len(found) == len(PERCENTILES) or position >= count - 1:
            break
    return {name: found[name] for name in PERCENTILES if name in found}


def flat_body(data: Any) -> dict[str, Any]:
    """A JSON body as one flat object, as ``pandas.json_normalize`` spreads records: nested
    objects' keys joined with ``.`` (``{"b": {"c": 1}}`` -> ``{"b.c": 1}``), an empty nested
    object left out, lists kept whole, a later key winning over an equal earlier one, a key
    with a lone surrogate named by its escape (``\\ud800``); a body
    that is not an object is ``{"value": body}``. The one rule for ``to_pandas(expand=True)``
    and the CLI's ``--flatten``."""
    if not isinstance(data, dict):
        return {"value": data}
    flat: dict[str, Any] = {}
    _spread(data, "", flat)
    return flat


def utf8_text(value: str) -> str:
    """Text a UTF-8 file can hold: a lone surrogate (from a JSON "\\ud800" escape) is written
    as that escape, as the JSONL writes it."""
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def _spread(data: dict[Any, Any], prefix: str, into: dict[str, Any]) -> None:
    for key, value in data.items():
        # (a key becomes a column's name, which must be UTF-8 text like a cell's value)
        name = f"{prefix}{utf8_text(key)}"
        if isinstance(value, dict):
            _spread(value, f"{name}.", into)
        else:
            into[name] = value


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError("this needs pandas: pip install 'batchsync[pandas]'") from exc
    return pd


# pandas dtypes of the typed columns; nullable ones where a Result may hold None.
COLUMN_TYPES = {
    "index": "int64",
    "ok": "bool",
    "status_code": "Int64",
    "attempts": "int64",
    "error_kind": "string",
    "error": "string",
    "elapsed": "float64",
    "fallback_used": "Int64",
    "redirects": "int64",
}


# Sends a batch's failed items again: (the error kinds to retry, empty: all; the options
# that change) -> the merged set.
Retry = Callable[[frozenset[str], dict[str, Any]], "ResultSet"]


class ResultSet(Sequence[Result]):
    """The Results of a batch, one per input item, in input order.

    ``stints``: what each ``run()`` (or process, for a journal) did, for the report's table
    of passes; ``retry``: how the batch that made the set sends its failures again (see
    ``retry_failed``).
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
    ) -> None:
        self._results = list(results)
        self.elapsed = elapsed
        self.waits = dict(waits or {})
        self.circuits_opened = circuits_opened
        # Seconds waited at each gate by (gate, unix second), for the report.
        self.wait_timeline = dict(wait_timeline or {})
        self.stints = tuple(stints)
        self._retry = retry

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
            map(facts_of, self._results),
            sorted(result.elapsed for result in self._results if result.attempts),
            elapsed=self.elapsed, waits=self.waits, circuits_opened=self.circuits_opened,
        )  # fmt: skip

    def report(self, path: str | Path, *, charts: bool = True) -> Path:
        """Write the batch's report to ``path``: one self-contained HTML file (charts need
        the ``report`` extra, plotly; without it, tables). Returns the path."""
        from .report import report_results

        return report_results(
            self._results, self.summary(), path, charts=charts, timeline=self.wait_timeline,
            stints=self.stints,
        )  # fmt: skip

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
        from .columnar import PARQUET_HINT, pyarrow_missing, write_table

        if form == "parquet" and pyarrow_missing():
            raise ImportError(f"this needs pyarrow: {PARQUET_HINT}")
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        paged = any(result.pages is not None for result in self._results)
        try:
            with temporary.open(
                "wb" if form == "parquet" else "w",
                newline=None if form == "parquet" else "",
                encoding=None if form == "parquet" else "utf-8",
            ) as handle:
                write_table(
                    handle, form, lambda: (result.to_dict() for result in self._results),
                    paged=paged, flatten=flatten,
                )  # fmt: skip
            temporary.replace(path)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise

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
        summary = self.summary()._repr_html_()
        failed = self.failed
        failures = failed[:10]
        if not failures:
            return summary
        rows = "".join(
            "<tr>"
            + "".join(
                f"<td>{html.escape(str(value))}</td>"
                for value in (r.index, r.url, r.final_url, r.status_code, r.error_kind, r.error)
            )
            + "</tr>"
            for r in failures
        )
        head = "".join(
            f"<th>{name}</th>"
            for name in ("index", "url", "final url", "status", "error kind", "error")
        )
        more = len(failed) - len(failures)
        note = f"<p>… and {more} more failures</p>" if more > 0 else ""
        return f"{summary}<p>First failures:</p><table><tr>{head}</tr>{rows}</table>{note}"
