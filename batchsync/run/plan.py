"""One plan for every run: how a row becomes a request, which lane sends the rows (the engine
here, partitions on a cluster, a provider's batch endpoint), and the refusals that keep a row
from being run, and paid for, twice. ``Batch`` and the command line both plan their runs here;
each keeps only its own words (``Words``) and its own edges (inputs, files, signals).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ..core.engine import Job
from ..core.result import Result
from ..core.task import Task
from ..core.verdict import InvalidItem
from ..http.paginate import Continued
from ..http.spec import RequestSpec, parse_item
from ..http.template import RowError, Template
from ..jobs.fetch import HttpJob, WrappedJob
from ..jobs.options import FetchOptions
from ..store.submissions import Ledger, Part
from .assembly import Stoppable, fetch
from .batched import ThroughBatchApi, open_batches
from .controller import Send

# What runs a live run's rows on a cluster, given the job's wrap and what sees the run start.
Cluster = Callable[[Callable[[HttpJob], Job] | None, Callable[[Stoppable], None]], Send]


class Rows(Protocol):
    """How a run's rows become items (a URL, a request mapping, a RequestSpec)."""

    def item_of(self, row: object) -> object:
        """The row's item; InvalidItem when it makes none."""
        ...

    def located(self, row: object, problem: str) -> str:
        """``problem`` said of ``row`` (where it is in the input, when that is known)."""
        ...


@dataclass(frozen=True)
class TemplateRows:
    """Table rows filled into a template as their turn comes (a paginated one going on from a
    later page stays so)."""

    template: Template

    def item_of(self, row: object) -> object:
        try:
            if isinstance(row, Continued):
                return replace(row, item=self.template.expand(row.item))
            return self.template.expand(row)
        except RowError as exc:
            raise InvalidItem(str(exc)) from None

    def located(self, row: object, problem: str) -> str:
        return problem


class RowsJob(WrappedJob):
    """The HTTP job over a run's rows; a row that makes no request is its ``invalid_request``
    Result, said where the row is."""

    def __init__(self, inner: HttpJob, rows: Rows) -> None:
        super().__init__(inner)
        self._rows = rows

    def label(self, row: object) -> tuple[str | None, Any]:
        try:
            return self._inner.label(self._rows.item_of(row))
        except InvalidItem:  # (a row that is no item has no URL to show)
            return None, None

    def prepare(self, row: object) -> Task:
        item = self._rows.item_of(row)
        try:
            return self._inner.prepare(item)
        except InvalidItem as exc:
            raise InvalidItem(self._rows.located(row, str(exc))) from None


def row_request(row: object, rows: Rows) -> RequestSpec:
    """The request a row makes, for a batch endpoint; InvalidItem when it makes none."""
    item = rows.item_of(row)
    try:
        return parse_item(item)
    except InvalidItem as exc:
        raise InvalidItem(rows.located(row, str(exc))) from None


class LaneRefused(ValueError):
    """The run would send rows that a provider's batch endpoint holds, or has run: nothing
    is sent."""


@dataclass(frozen=True)
class Words:
    """How a refusal names the ways on, in the caller's own spelling."""

    go_on: str  # with the batches still open at the provider
    forget: str  # a fresh start that would forget them
    go_live: str = ""  # from a run that went through a batch endpoint, sending the rest live


@dataclass(frozen=True)
class Lane:
    """Where a run's rows go and what the run knows of them: ``parts`` the submissions its
    journal (or ledger) holds; ``live`` whether going on live from a batch run was said. A
    library call chooses its lane in code (it says so by leaving out ``batch_api``); a
    command line run again without ``--batch-api`` may not mean to, and says so with
    ``--live``."""

    options: FetchOptions
    rows: Rows | None
    parts: Sequence[Part]
    words: Words
    live: bool = True

    @property
    def batched(self) -> bool:
        """Whether the rows go through a batch endpoint (some may go live: lanes="auto")."""
        return self.options.batch_api is not None and self.options.lanes != "live"

    @property
    def going_live(self) -> bool:
        """Whether going on live from a batch run was said (``live``, or lanes="live")."""
        return self.live or self.options.lanes == "live"


def refuse_fresh(parts: Iterable[Part], words: Words) -> None:
    """LaneRefused when a fresh start would forget batches still open at the provider."""
    still = open_batches(parts)
    if still is not None:
        raise LaneRefused(f"{still}: {words.forget}")


def plan_send(
    lane: Lane,
    *,
    url: str | None,
    journal: Path | None,
    passing: int,
    ledger: Ledger | None = None,
    cancel: bool = False,
    again: Callable[[], Iterable[tuple[int, object]]] | None = None,
    stored: Callable[[int], Result | None] = lambda index: None,
    on_start: Callable[[Stoppable], None] = lambda run: None,
    cluster: Cluster | None = None,
) -> Send:
    """What sends the run's rows: through the batch endpoint with ``batch_api``, else the
    engine here, or on a cluster (``cluster`` makes that Send); a
    LaneRefused (before anything is sent) when a live run would send rows that batches at
    the provider still hold, or go on live from a batch run unsaid."""
    options, rows = lane.options, lane.rows
    wrap = None if rows is None else partial(RowsJob, rows=rows)
    if lane.batched:
        assert rows is not None and url is not None
        return ThroughBatchApi(
            options,
            url,
            partial(row_request, rows=rows),
            passing=passing,
            journal=journal,
            ledger=ledger,
            cancel=cancel,
            again=again,
            stored=stored,
            on_start=on_start,
            live=partial(_live, wrap=wrap, on_start=on_start),
        )
    if cancel:
        raise LaneRefused(
            "lanes='live' (--lanes live) sends no row through a batch: there is "
            "no batch to cancel; give lanes='batch' or 'auto' to cancel them"
        )
    still = open_batches(lane.parts)
    if still is not None:
        raise LaneRefused(f"{still}: {lane.words.go_on}")
    if lane.parts and not lane.going_live:
        raise LaneRefused(
            f"{journal or 'the journal'} holds a run sent through {lane.parts[0].provider}'s "
            f"batch endpoint: {lane.words.go_live}"
        )
    if cluster is not None:
        return cluster(wrap, on_start)
    return _live(options, wrap=wrap, on_start=on_start)


def _live(
    options: FetchOptions,
    *,
    wrap: Callable[[HttpJob], Job] | None,
    on_start: Callable[[Stoppable], None],
) -> Send:
    """The engine here sending rows live (``wrap``: the job over template rows)."""
    return partial(fetch, options, wrap=wrap, on_start=on_start)
