"""What happened to each item: Result, its attempt log, and the Summary of many."""

from __future__ import annotations

import html
import math
import re
import typing
from collections import Counter
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel

from .kinds import KINDS, NOT_FINAL
from .verdict import ErrorKind, Feedback, Verdict


def kept(seconds: float) -> float:
    """``seconds`` as a Result's record keeps them (to the microsecond): the one precision of
    every output and of every summary, so that a summary of Results in memory and one of
    their records read back (a resume, a batch's journal in a new session) say the same."""
    return round(seconds, 6)


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt: its number, what came back, how long it took and the wait that followed.

    ``fallback`` is the index of the fallback route it was made on (None: the item's own);
    ``hedged`` says a second identical request was raced against it; ``resent`` how many
    times it was sent again after a token refresh (requests beyond the one, or the hedged
    pair, that ``hedged`` counts); ``lane`` is ``"batch"`` for a row a provider's batch
    endpoint answered (None: a live call).
    """

    attempt: int
    status_code: int | None
    error_kind: ErrorKind | None
    elapsed: float
    wait: float | None = None
    fallback: int | None = None
    hedged: bool = False
    resent: int = 0
    # Under a spend cap: dollars spent, dollars reserved (its worst case), the model priced.
    cost: float | None = None
    reserved: float | None = None
    model: str | None = None
    lane: Literal["batch"] | None = None

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> AttemptRecord:
        return cls(**{name: record[name] for name in cls.__dataclass_fields__ if name in record})

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "status_code": self.status_code,
            "error_kind": self.error_kind,
            "elapsed": kept(self.elapsed),
            "wait": None if self.wait is None else kept(self.wait),
            "fallback": self.fallback,
            "hedged": self.hedged,
        } | _given(resent=self.resent or None, cost=self.cost, reserved=self.reserved,
                   model=self.model, lane=self.lane)  # fmt: skip


class Answer(Protocol):
    """What a job's facts of an attempt (``Verdict.facts``) give its AttemptRecord and the
    item's Result: the engine reads no more of them."""

    @property
    def status_code(self) -> int | None: ...
    @property
    def final_url(self) -> str | None: ...
    @property
    def redirects(self) -> int: ...


class _Unanswered:
    """The Answer of an attempt whose job keeps no facts of it."""

    status_code: int | None = None
    final_url: str | None = None
    redirects: int = 0


_UNANSWERED = _Unanswered()


def answer_of(verdict: Verdict) -> Answer:
    """What a Verdict's facts give an AttemptRecord and a Result (nothing, when it has none)."""
    facts = verdict.facts
    return _UNANSWERED if facts is None else facts


def repeats(earlier: Result, verdict: Verdict) -> bool:
    """Whether an attempt was answered as its item was in an earlier pass: a failure of the
    same kind with the same status, or with the status its last answer had when a limit or a
    stop ended it (a 503 whose Retry-After the budget could not wait: ``budget``). A retry
    pass sends only failed items, so that answer again is the item's own news, not the
    host's: the breaker does not count it. No answer (a refused connection, a timeout) always
    counts: it is the host's."""
    status = answer_of(verdict).status_code
    kind = earlier.error_kind
    return (
        not earlier.ok
        and status is not None
        and verdict.outcome != "success"
        and earlier.status_code == status
        and (kind == verdict.error_kind or (kind in KINDS and KINDS[kind].breaker == "ignored"))
    )


def for_the_limits(feedback: Feedback, verdict: Verdict, earlier: Result | None) -> Feedback:
    """What an attempt tells the limits, less a failure that repeats its item's ``earlier``
    Result: not the breaker's (``repeats``)."""
    if feedback.unwell and earlier is not None and repeats(earlier, verdict):
        return replace(feedback, unwell=None)
    return feedback


# The earlier Result of the item whose attempt runs in this context (a retry pass's), for the
# requests the attempt sends beside its own (a hedge's second one): see ``for_the_limits``.
ATTEMPT_EARLIER: ContextVar[Result | None] = ContextVar("attempt_earlier", default=None)


def judged_by(earlier: Result) -> Result:
    """What ``repeats`` reads of an earlier Result, and nothing else: light to send to
    another process, and without its data or where it would go on (which may hold secrets)."""
    kind, status = earlier.error_kind, earlier.status_code
    return Result(earlier.index, None, earlier.ok, status_code=status, error_kind=kind)


def result_of(
    verdict: Verdict,
    records: Sequence[AttemptRecord],
    *,
    index: int,
    url: str | None,
    id: Any,
    error: str | None,
    data: Any,
    elapsed: float,
    finished: float,
    fallback_used: int | None = None,
    pages: int | None = None,
    continuation: Any = None,
) -> Result:
    """An item's Result from its last Verdict and its attempts' records, its other fields by
    the Result's own names: the one place a Result is made of an answer, for the engine's
    attempts and a batch's rows alike."""
    answer = answer_of(verdict)
    sent = sum(1 + record.hedged + record.resent for record in records)
    costs = [record.cost for record in records if record.cost is not None]
    return Result(
        index=index,
        url=url,
        ok=verdict.outcome == "success",
        id=id,
        status_code=answer.status_code,
        attempts=sent,
        error_kind=verdict.error_kind,
        error=error,
        data=data,
        elapsed=elapsed,
        attempt_log=tuple(records),
        fallback_used=fallback_used,
        final_url=answer.final_url,
        redirects=answer.redirects,
        pages=pages,
        cost=sum(costs) if costs else None,
        continuation=continuation,
        finished=finished,
    )


def _given(**fields: Any) -> dict[str, Any]:
    """The fields a record has only when they are set."""
    return {name: value for name, value in fields.items() if value is not None}


def describe_attempts(records: Iterable[AttemptRecord]) -> str:
    """An attempt log in one short line: ``#1 503 wait 0.52 s, #2 timeout, ...``."""
    parts = []
    for record in records:
        part = f"#{record.attempt} {_what_happened(record)}"
        if record.fallback is not None:
            part += f" (fallback {record.fallback})"
        if record.wait is not None:
            part += f" wait {record.wait:.2f} s"
        parts.append(part)
    return ", ".join(parts)


def _what_happened(record: AttemptRecord) -> str:
    """An attempt's outcome in a word: its status when that decided it, else what ended it
    (a timeout whose headers said 200 is a timeout)."""
    if record.error_kind is None or KINDS[record.error_kind].by_status:
        return str(record.status_code or record.error_kind or "ok")
    if record.status_code is not None:
        return f"{record.error_kind} (HTTP {record.status_code})"
    return record.error_kind


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
    # Dollars its attempts spent, under a spend cap (None otherwise).
    cost: float | None = None
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
            "elapsed": kept(self.elapsed),
            "attempt_log": [record.to_dict() for record in self.attempt_log],
            "fallback_used": self.fallback_used,
        } | _given(pages=self.pages, cost=self.cost)


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
    on from ``earlier``'s) cover both, and a failure's ``error`` (whose "after N attempts"
    counts this sending's) says how many there were in all, as ``attempts`` does."""
    shift = max((record.attempt for record in earlier.attempt_log), default=0)
    renumbered = tuple(
        replace(record, attempt=record.attempt + shift) for record in later.attempt_log
    )
    costs = [cost for cost in (earlier.cost, later.cost) if cost is not None]
    attempts = earlier.attempts + later.attempts
    error = later.error
    if error is not None and earlier.attempts:
        error = f"{_IN_ALL.sub('', error)}; {how_many(attempts, 'attempt')} in all"
    return replace(
        later,
        cost=sum(costs) if costs else None,
        attempts=attempts,
        error=error,
        elapsed=earlier.elapsed + later.elapsed,
        attempt_log=earlier.attempt_log + renumbered,
    )


# What ``added_to`` says of the attempts in all (said once, however often it adds).
_IN_ALL = re.compile(r"; [0-9]+ attempts? in all$")


def how_many(count: int | str | None, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun``, plural unless it is 1: "1 attempt", "3 attempts"."""
    return f"{count} {noun}" if str(count) == "1" else f"{count} {nouns or noun + 's'}"


PERCENTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}
# The shortest wait the summary shows (in seconds; ``waits`` keeps every one).
SHOWN_WAIT = 0.05


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
    spent: float | None = None  # dollars, under a spend cap

    @property
    def requests_per_second(self) -> float | None:
        return self.requests_sent / self.elapsed if self.elapsed else None

    @property
    def attempts_per_item(self) -> float | None:
        return self.requests_sent / self.total if self.total else None

    def _figures(self) -> list[tuple[str, str]]:
        """The statistics as (name, value) pairs, for both the text and the HTML form."""
        figures = [("requests", str(self.requests_sent))]
        if self.attempts_per_item is not None:
            figures.append(("per item", f"{self.attempts_per_item:.2f}"))
        if self.elapsed is not None:
            figures.append(("elapsed", f"{self.elapsed:.2f} s"))
        if self.requests_per_second is not None:
            figures.append(("requests/s", f"{self.requests_per_second:.0f}"))
        figures += [(f"latency {name}", f"{value:.3f} s") for name, value in self.latency.items()]
        figures += [(f"waited: {cause}", f"{s:.1f} s") for cause, s in self._waits_shown()]
        if self.circuits_opened:
            figures.append(("circuits opened", str(self.circuits_opened)))
        if self.spent is not None:
            figures.append(("spent", f"${self.spent:.6f}"))
        return figures

    def _waits_shown(self) -> list[tuple[str, float]]:
        """The waits by cause, those that show as 0.1 s or more (less would read 0.0 s:
        a hold lifted as it began), in order of their names."""
        return [(cause, s) for cause, s in sorted(self.waits.items()) if s >= SHOWN_WAIT]

    def __str__(self) -> str:
        parts = [f"{how_many(self.total, 'item')}: {self.ok} ok, {self.failed} failed"]
        if self.error_kinds:
            kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(self.error_kinds.items()))
            parts[0] += f" ({kinds})"
        parts.append(self._sent())
        if self.latency:
            parts.append("latency " + ", ".join(f"{k} {v:.3f} s" for k, v in self.latency.items()))
        shown = self._waits_shown()
        if shown:
            parts.append("waited: " + ", ".join(f"{k} {v:.1f} s" for k, v in shown))
        if self.circuits_opened:
            parts.append(f"{how_many(self.circuits_opened, 'circuit')} opened")
        if self.spent is not None:
            parts.append(f"spent ${self.spent:.6f}")
        return "; ".join(parts)

    def _sent(self) -> str:
        """The requests part of the text form: how many, per item, in what time, how fast."""
        sent = how_many(self.requests_sent, "request")
        if self.attempts_per_item is not None:
            sent += f" ({self.attempts_per_item:.2f} per item)"
        if self.elapsed is not None:
            sent += f" in {self.elapsed:.2f} s"
        if self.requests_per_second is not None:
            sent += f", {self.requests_per_second:.0f}/s"
        return sent

    def _repr_html_(self) -> str:
        counts = [("items", self.total), ("ok", self.ok), ("failed", self.failed)]
        counts += [(f"error: {kind}", n) for kind, n in sorted(self.error_kinds.items())]
        counts += [(f"HTTP {code}", n) for code, n in sorted(self.status_codes.items())]
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(str(name))}</th>"
            f"<td>{html.escape(str(value))}</td></tr>"
            for name, value in [*counts, *self._figures()]
        )
        return f"<table>{body}</table>"


# What a summary counts of one Result: ok, error_kind, status_code, attempts, seconds of backoff
# (as its record keeps them, ``kept``).
# What a summary counts of a Result: ok, its kind, its status, requests sent, seconds of
# backoff, and what it spent under a spend cap (None: no cap).
Counted = tuple[bool, ErrorKind | None, int | None, int, float, float | None]


def counted(result: Result) -> Counted:
    backoff = sum(kept(record.wait or 0.0) for record in result.attempt_log)
    return result.ok, result.error_kind, result.status_code, result.attempts, backoff, result.cost


def summarize(
    rows: Iterable[Counted],
    sorted_times: Iterable[float],
    *,
    elapsed: float | None = None,
    waits: dict[str, float] | None = None,
    circuits_opened: int = 0,
) -> Summary:
    """The one way a Summary is computed, for Results in memory and in a journal alike.

    ``rows`` are read first, once; then ``sorted_times`` (the elapsed seconds of the items
    that made an attempt, in ascending order) as a stream, up to the last percentile.
    """
    total = ok = sent = timed = 0
    backoff = 0.0
    kinds = Counter[str]()
    codes = Counter[int]()
    costs: list[float] = []
    for is_ok, kind, code, attempts, waited, cost in rows:
        total += 1
        costs += () if cost is None else (cost,)
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
        total=total,
        ok=ok,
        failed=total - ok,
        error_kinds=dict(sorted(kinds.items())),
        status_codes=dict(sorted(codes.items())),
        requests_sent=sent,
        elapsed=elapsed,
        waits=all_waits,
        circuits_opened=circuits_opened,
        latency=_percentiles(sorted_times, timed),
        spent=math.fsum(costs) if costs else None,
    )


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


class Tried(NamedTuple):
    """What an attempt of the log says, for the report (a tuple: a report reads millions)."""

    status_code: int | None
    error_kind: str | None
    elapsed: float
    wait: float | None  # (after it)
    # Under a spend cap: dollars spent, dollars reserved (its worst case), the model priced.
    cost: float | None = None
    reserved: float | None = None
    model: str | None = None
    lane: str | None = None  # ("batch": a provider's batch endpoint answered it)


@dataclass(frozen=True, slots=True)
class Trace:
    """What the report reads of one Result, in memory or stored in the journal."""

    index: int
    ok: bool
    error_kind: str | None
    status_code: int | None
    attempts: int
    elapsed: float
    finished: float | None
    log: Sequence[Tried] = ()

    @classmethod
    def of(cls, result: Result) -> Trace:
        log = tuple(
            Tried(
                a.status_code, a.error_kind, a.elapsed, a.wait, a.cost, a.reserved, a.model, a.lane
            )
            for a in result.attempt_log
        )
        taken = {name: getattr(result, name) for name in cls.__dataclass_fields__ if name != "log"}
        return cls(**taken, log=log)


@dataclass(frozen=True)
class Listing:
    """An item as the report's tables list it (its texts were masked when its Result was
    made)."""

    index: int
    url: str | None
    id: Any
    status_code: int | None
    error_kind: str | None
    error: str | None
    attempts: int
    elapsed: float

    @classmethod
    def of(cls, result: Result) -> Listing:
        return cls(**{name: getattr(result, name) for name in cls.__dataclass_fields__})
