"""What every row of a journal must hold before a run goes on with it.

A journal is a file anyone with the owner's rights can edit, so a run that goes on with one
(``resumed``) trusts nothing in it unchecked: its layout, then every row of every table, on a
read-only connection before anything opens it for writing. Each value a run reads is checked
for its type and range, each JSON text for its shape, the columns beside a record against the
record (the summary reads the columns, the results file the records), each failed item's
request against the input, the passes, the runs and the waits against each other. A refused
journal is left byte for byte as it was; a problem is named by its table, row and column,
never by the value (a secret, say). Each table's rules are in its table below (``rules``).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.admission import PICO
from ...core.records import dumps
from ...core.result import Result, how_many
from ..rules import (
    DOLLARS,
    MISSING,
    MOMENT,
    SECONDS,
    UNREADABLE,
    Facts,
    Rule,
    absent_or,
    boolean,
    count,
    each,
    first_problem,
    json_of,
    json_value,
    kind,
    line,
    optional,
    problem,
    shaped,
    status,
    text,
)
from ..submissions import overlap_problem, part_of, submission_problem
from .reader import JournalReader
from .schema import (
    LAYOUT,
    NOT_REPLACED,
    JournalMismatch,
    file_problem,
    foreign,
    read_only,
    storable,
    tables_of,
)

# The keys of the input identity that must match for a journal to be resumed.
# ``template``: the options that turn a table's rows into requests (absent: none).
# ``paging``: how items were paginated (absent: they were not).
IDENTITY_KEYS = ("entries", "sha256", "template", "paging")
# What a difference in each key of the identity says.
_DIFFERENCES = {
    "entries": "its input had {was}, this one has {now}",
    "sha256": "its input's SHA-256 was {was}, this one's is {now}",
    "template": "its template options were different: the URL template, method, body template "
    "(or --row-as-body), id field and table format must be the ones it was made with",
    "paging": "its pagination options were different: --paginate (paginate), --items "
    "(page_items) and --cursor-param must be the ones it was made with",
}
# How far a gate's waits may lie outside the runs' time (the wall clock may be set meanwhile).
_CLOCK_SLACK = 3600.0
_RECORD_KEYS = frozenset(Result(0, None, False).to_dict())
_PAGED_KEYS = _RECORD_KEYS | {"pages", "cost"}
_WRITTEN = "record is not a Result as batchsync writes it"


def mismatch(stored: Mapping[str, str], current: Mapping[str, str]) -> str | None:
    """Why a journal recorded for ``stored`` cannot be resumed for ``current``, or None."""
    for key in IDENTITY_KEYS:
        was, now = stored.get(key), current.get(key)
        if was != now:
            if key == "entries":
                was, now = (how_many(n, "entry", "entries") for n in (was, now))
            return _DIFFERENCES[key].format(was=was, now=now)
    return None


def _column(name: str) -> Callable[[Any, Facts], bool]:
    """The record's value is the column's of that name (1 is not True, nor 1.0)."""
    return lambda value, facts: (
        type(value) is type(facts["row"][name]) and (value == facts["row"][name])
    )


def _near(column: Any, stored: Any, terms: int = 1) -> bool:
    """Seconds in a column and in the record: the same, but for the rounding to the microsecond
    (``terms`` times over, for a sum) of columns an earlier batchsync wrote unrounded."""
    if not (SECONDS(column, {}) and SECONDS(stored, {})):
        return False
    return bool(abs(column - stored) <= 1e-6 * terms + 1e-9 * abs(column))


def _sent(log: list[dict[str, Any]]) -> int:
    return sum(1 + entry["hedged"] + entry.get("resent", 0) for entry in log)


def _waited(log: list[dict[str, Any]]) -> float:
    return sum(entry["wait"] or 0.0 for entry in log)


# One entry of a record's attempt log, as batchsync writes it.
_ATTEMPT = shaped(
    Rule("attempt", count(1), ""),
    Rule("status_code", status, ""),
    Rule("error_kind", optional(kind), ""),
    Rule("elapsed", SECONDS, ""),
    Rule("wait", optional(SECONDS), ""),
    Rule("fallback", optional(count()), ""),
    Rule("hedged", boolean, ""),
    Rule("resent", absent_or(count()), ""),
    Rule("cost", absent_or(DOLLARS), ""),
    Rule("reserved", absent_or(DOLLARS), ""),
    Rule("model", absent_or(text), ""),
    Rule("lane", absent_or(lambda lane, _: lane == "batch"), ""),
)
# A record (its fields, and ``row``: the columns beside it) against those columns.
_RECORD = (
    Rule("index", _column("idx"), "the record of item {row[idx]} is not that item's"),
    Rule("ok", lambda ok, facts: ok is bool(facts["row"]["ok"]), "ok is not the record's"),
    Rule("error_kind", _column("error_kind"), "error_kind is not the record's"),
    Rule("status_code", _column("status_code"), "status_code is not the record's"),
    Rule("attempts", _column("attempts"), "attempts is not the record's"),
    Rule("elapsed", lambda seconds, facts: _near(facts["row"]["elapsed"], seconds),
         "elapsed is not the record's"),
    Rule("attempt_log", each(_ATTEMPT), "record has an attempt log batchsync does not write"),
    Rule("attempt_log", lambda log, facts: facts["row"]["attempts"] >= _sent(log),
         "attempts is fewer than the record's attempt log sent"),
    Rule("attempt_log", lambda log, facts: _near(facts["row"]["backoff"], _waited(log),
                                                 len(log) + 1),
         "backoff is not the waits of the record's attempt log"),
    Rule("url", optional(text), _WRITTEN),
    Rule("final_url", optional(text), _WRITTEN),
    Rule("error", optional(text), _WRITTEN),
    Rule("redirects", count(), _WRITTEN),
    Rule("fallback_used", optional(count()), _WRITTEN),
    Rule("pages", absent_or(optional(count())), _WRITTEN),
    Rule("cost", absent_or(DOLLARS), _WRITTEN),
)  # fmt: skip
_RESULT_COLUMNS = tuple(column[0] for column in LAYOUT["results"])
# Where a failed paginated item goes on (``Result.continuation``).
_CONTINUATION = shaped(
    Rule("url", text, ""), Rule("page", count(1), ""), Rule("position", count(), "")
)
# A ``results`` row, given the input's ``size``, its ``latest`` pass, whether it was ``paged``
# and whether the journal keeps failed items' requests (``requested``: the command line's).
_RESULT = (
    Rule("idx", lambda index, facts: 0 <= index < facts["size"],
         "item {idx} is not in the input of {size} items"),
    Rule("ok", count(0, 1), "ok is not 0 or 1"),
    Rule("error_kind", optional(kind), "error_kind is not an error kind"),
    Rule("error_kind", lambda kind, facts: (kind is None) == bool(facts["ok"]),
         "error_kind does not agree with ok (a failure has one, a success none)"),
    Rule("status_code", lambda code, facts: status(code, facts) and not (
        facts["error_kind"] == "status" and code is None), "status_code is not an HTTP status"),
    Rule("attempts", count(), "attempts is not a count"),
    Rule("elapsed", SECONDS, "elapsed is not a number of seconds"),
    Rule("backoff", SECONDS, "backoff is not a number of seconds"),
    Rule("finished", optional(MOMENT), "finished is not a time"),
    Rule("pass", count(1, "latest"), "pass is not a pass the journal recorded"),
    Rule("record", text, "record is not text"),
    Rule("record", line, "the record of item {idx} is not one line"),
    Rule("request", optional(line), "request is not one line of text"),
    Rule("request", lambda request, facts: request is None or facts["requested"],
         "request is there, but the journal of a library's batch keeps none"),
    Rule("request", lambda request, facts: request is None or not facts["ok"],
         "request is there for an item that did not fail"),
    Rule("request", lambda request, facts: request is not None or facts["ok"]
         or not facts["requested"],
         "request is missing: the failed file needs it to send the item again"),
    Rule("resume", lambda resume, facts: resume is None or facts["paged"],
         "resume is there for an item that was not paginated"),
    Rule("resume", lambda resume, facts: resume is None or not facts["ok"],
         "resume is there for an item that did not fail"),
    Rule("resume", optional(json_of(_CONTINUATION)),
         "resume is not where a paginated item goes on"),
)  # fmt: skip


def record_problem(record: Any, row: Sequence[Any]) -> str | None:
    """What in a parsed record disagrees with the columns of its ``results`` row (``idx``,
    ``ok``, ``error_kind``, ``status_code``, ``attempts``, ``elapsed``, ``backoff``) or is not
    a Result's as batchsync writes it (None: nothing); the column named first."""
    if not isinstance(record, dict) or not _RECORD_KEYS <= record.keys() <= _PAGED_KEYS:
        return _WRITTEN
    return problem(_RECORD, {**record, "row": dict(zip(_RESULT_COLUMNS, row, strict=False))})


def result_problem(
    row: Sequence[Any], *, size: int, latest: int, paged: bool, requested: bool
) -> str | None:
    """What makes one ``results`` row (its columns in the schema's order) untrustworthy for
    an input of ``size`` items whose last pass is ``latest``, ``paged`` or not, whose failed
    items keep their request (``requested``: the command line's) or not (a library's); None:
    nothing. The column is named first, never its value."""
    facts = dict(zip(_RESULT_COLUMNS, row, strict=False))
    context = {"size": size, "latest": latest, "paged": paged, "requested": requested}
    found = problem(_RESULT, facts | context)
    if found is not None:
        return found
    record = json_value(facts["record"])
    try:
        if record is UNREADABLE or dumps(record) != facts["record"]:
            return _WRITTEN
    except RecursionError:
        return "record nests deeper than this process can read"
    return record_problem(record, row)


def _retried(kinds: Any, facts: Facts) -> bool:
    """A sorted list of error kinds, none twice."""
    return each(kind)(kinds, facts) and kinds == sorted(set(kinds))


# A ``passes`` row: the first pass retries nothing, each later one the error kinds it names
# (empty: every failure).
_PASS = (
    Rule("number", count(1), "number is not a pass"),
    Rule("retry", lambda retry, facts: facts["number"] != 1 or retry is None,
         "retry is there for the first pass"),
    Rule("retry", lambda retry, facts: facts["number"] == 1 or json_of(_retried)(retry, facts),
         "retry is not a list of error kinds"),
)  # fmt: skip


def pass_problem(number: int, retry: object) -> str | None:
    """What makes a ``passes`` row untrustworthy (``_PASS``), or None."""
    return problem(_PASS, {"number": number, "retry": retry})


def _gate_seconds(gates: Any, facts: Facts) -> bool:
    """Seconds by gate, each gate's name one the summary line can show (short, printable)."""
    return isinstance(gates, dict) and all(
        0 < len(gate) <= 64 and gate.isprintable() and SECONDS(seconds, facts)
        for gate, seconds in gates.items()
    )


# A ``runs`` row, given the numbers of the ``passes`` recorded.
_RUN = (
    Rule("pass", lambda number, facts: type(number) is int and number in facts["passes"],
         "pass is not a pass the journal recorded"),
    Rule("started", MOMENT, "started is not a time"),
    Rule("elapsed", SECONDS, "elapsed is not a number of seconds"),
    Rule("items", count(), "items is not a count"),
    Rule("requests", count(), "requests is not a count"),
    Rule("circuits", count(), "circuits is not a count"),
    Rule("waits", json_of(_gate_seconds), "waits is not the seconds waited at each gate"),
)  # fmt: skip
_RUN_COLUMNS = tuple(column[0] for column in LAYOUT["runs"])


# A ``spend`` row, given the number it must have (the attempts are numbered from 1, none
# missing): its reservation, and what it spent once settled, in pico-dollars.
_SPEND = (
    Rule("attempt", lambda number, facts: number == facts["number"],
         "attempt is not the one after the row before: a row is missing"),
    Rule("reserved", count(), "reserved is not an amount"),
    Rule("spent", optional(count()), "spent is not an amount"),
)  # fmt: skip


# A ``charges`` row: a part the journal submitted, and the ``spend`` row of its reservation
# (one no other part's), whose amount it repeats.
_CHARGE = (
    Rule("part", lambda part, facts: part in facts["checks"].parts,
         "part is not a part in submissions"),
    Rule("attempt", lambda attempt, facts: attempt in facts["checks"].reservations,
         "attempt is not a row of spend"),
    Rule("attempt", lambda attempt, facts: attempt not in facts["charged"],
         "attempt is another part's charge too"),
    Rule("reserved", lambda reserved, facts: (
        facts["checks"].reservations.get(facts["attempt"]) == reserved),
         "reserved is not what its spend row reserved"),
)  # fmt: skip


def run_problem(row: Sequence[Any], passes: Iterable[int]) -> str | None:
    """What makes a ``runs`` row (its columns in the schema's order) untrustworthy, given the
    numbers of the passes recorded; None: nothing."""
    return problem(_RUN, dict(zip(_RUN_COLUMNS, row, strict=True), passes=passes))


def _within(second: Any, facts: Facts) -> bool:
    span = facts["span"]
    return span is not None and span[0] - _CLOCK_SLACK <= second <= span[1] + _CLOCK_SLACK


# A ``waits`` row, given when the runs went (``span``: the first start and the last end, None:
# no run recorded) and the ``gates`` they waited at (the same waits, summed by gate).
_WAIT = (
    Rule("gate", lambda gate, facts: gate in facts["gates"],
         "gate is not a gate the runs waited at"),
    Rule("second", lambda second, facts: type(second) is int and MOMENT(second, facts),
         "second is not a time"),
    Rule("second", _within, "second is not within the runs the journal recorded"),
    Rule("seconds", SECONDS, "seconds is not a number of seconds"),
)  # fmt: skip


def wait_problem(
    row: Sequence[Any], span: tuple[float, float] | None, gates: Iterable[str]
) -> str | None:
    """What makes a ``waits`` row untrustworthy (``_WAIT``), or None."""
    columns = dict(zip(("gate", "second", "seconds"), row, strict=True))
    return problem(_WAIT, columns | {"span": span, "gates": gates})


# What the values of ``meta`` that have a shape look like (a value of another shape was
# edited, whatever the input): a count, a SHA-256; the others are texts.
_META_SHAPES = {
    "entries": re.compile(r"0|[1-9][0-9]{0,15}"),
    "size": re.compile(r"0|[1-9][0-9]{0,18}"),
    "sha256": re.compile(r"[0-9a-f]{64}"),
}
_META_KEYS = ("schema", "input", "size", "sha256", "entries", "template", "paging")


def _shaped_value(value: Any, facts: Facts) -> bool:
    shape = _META_SHAPES.get(facts["key"])
    return isinstance(value, str) and (shape is None or shape.fullmatch(value) is not None)


# A ``meta`` row (rowid, key, value) as any batchsync writes one, whatever the input.
_META_SHAPE = (
    Rule("key", lambda key, _: key in _META_KEYS,
         "meta row {rowid}: key is not one batchsync writes"),
    Rule("value", _shaped_value, "meta row {rowid}: value of {key} is not one batchsync writes"),
)  # fmt: skip
# A ``meta`` row of a journal made for the input whose identity is ``expected``.
_META = (
    Rule("key", lambda key, facts: isinstance(key, str) and key in facts["expected"],
         "meta row {rowid}: key is not one a journal of this input has"),
    Rule("value", lambda value, facts: isinstance(value, str) and (
        facts["key"] == "input" or value == facts["expected"][facts["key"]]),
         "meta row {rowid}: value of {key} is not the input's"),
)  # fmt: skip


def _meta_facts(rows: Iterable[tuple[int, Any, Any]], **known: Any) -> Iterator[Facts]:
    return ({"rowid": rowid, "key": key, "value": value, **known} for rowid, key, value in rows)


def meta_shape_problem(rows: Iterable[tuple[int, Any, Any]]) -> str | None:
    """What in the ``meta`` rows (rowid, key, value) no batchsync writes, whatever the input:
    a key of its own, a text, a count or a SHA-256 where one belongs. (A value
    of the right shape but not the input's: made for other input, ``mismatch`` says.)"""
    return first_problem(_META_SHAPE, _meta_facts(rows))


def meta_problem(rows: Iterable[tuple[int, Any, Any]], identity: Mapping[str, str]) -> str | None:
    """What in the ``meta`` rows (rowid, key, value) is not what a journal made for
    ``identity`` holds: each of its keys and the schema's, no other, each value the input's
    (``input``, where it was, aside: a file moved is still the same input)."""
    expected = {key: storable(value) for key, value in identity.items()}
    rows = [row for row in rows if row[1] != "schema"]
    missing = sorted(expected.keys() - {key for _, key, _ in rows})
    found = first_problem(_META, _meta_facts(rows, expected=expected))
    return found or (f"meta has no row {missing[0]}" if missing else None)


@dataclass(frozen=True)
class Requests:
    """What the input gives as each item's stored request, the failed file's line: ``text``
    of each of ``items`` in input order (``resumed`` reads them only up to the last failure)."""

    items: Iterable[Any]
    text: Callable[[Any], str]


@dataclass
class _Check:
    """The check of the journal ``db`` made for ``identity`` (``requests``: what each failed
    item's request must be; None: it keeps none), a table at a time, each read once, each one's
    facts kept for those after it (``span``: when the runs went, None: no run recorded)."""

    db: sqlite3.Connection
    identity: Mapping[str, str]
    requests: Requests | None
    tables: set[str] = field(default_factory=set)
    passes: set[int] = field(default_factory=set)
    finished: Counter[int] = field(default_factory=Counter)
    span: tuple[float, float] | None = None
    gates: set[str] = field(default_factory=set)
    parts: set[int] = field(default_factory=set)
    reservations: dict[int, int] = field(default_factory=dict)

    def problem(self) -> str | None:
        """The first thing in the journal a run cannot trust, named by its table, row and
        column, or None."""
        self.tables = {str(name) for (name,) in self.db.execute("SELECT name FROM sqlite_master")}
        steps = (self._meta, self._passes, self._runs, self._waits, self._submissions)
        later = (self._results, self._spend, self._charges, self._requests)
        found = (step() for step in (*steps, *later))
        return next(filter(None, found), None)

    def _rows(self, table: str, query: str) -> Iterable[Any]:
        """The rows of ``query`` on ``table``; none when a journal made before it lacks it."""
        return self.db.execute(query) if table in self.tables else ()

    def _meta(self) -> str | None:
        return meta_problem(self.db.execute("SELECT rowid, key, value FROM meta"), self.identity)

    def _passes(self) -> str | None:
        for number, retry in self._rows("passes", "SELECT number, retry FROM passes"):
            found = pass_problem(number, retry)
            if found is not None:
                return f"passes row {number}: {found}"
            self.passes.add(number)
        return None

    def _runs(self) -> str | None:
        """Each run trusted (``run_problem``), none repeated, a run recorded for each pass."""
        if "runs" not in self.tables:
            return None
        seen: dict[tuple[Any, Any], int] = {}
        for rowid, *row in self._rows("runs", "SELECT rowid, * FROM runs"):
            found = run_problem(row, self.passes)
            if found is None and (row[0], row[1]) in seen:
                found = f"it repeats row {seen[row[0], row[1]]}"
            if found is not None:
                return f"runs row {rowid}: {found}"
            seen[row[0], row[1]] = rowid
            self.finished[row[0]] += row[3]
            self.gates.update(json_value(row[5]))
            first, last = self.span or (row[1], row[1] + row[2])
            self.span = (min(first, row[1]), max(last, row[1] + row[2]))
        unrun = sorted(self.passes - {number for number, _ in seen})
        return f"passes row {unrun[0]}: no run of it is recorded in runs" if unrun else None

    def _waits(self) -> str | None:
        for rowid, *row in self._rows("waits", "SELECT rowid, * FROM waits"):
            found = wait_problem(row, self.span, self.gates)
            if found is not None:
                return f"waits row {rowid}: {found}"
        return None

    def _submissions(self) -> str | None:
        parts = []
        for row in self._rows("submissions", "SELECT * FROM submissions"):
            found = submission_problem(row, int(self.identity["entries"]), self.passes or {1})
            if found is not None:
                return f"submissions row {row[0]}: {found}"
            parts.append(part_of(row))
        self.parts = {part.number for part in parts}
        return overlap_problem(parts)

    def _results(self) -> str | None:
        """Each row trusted (``result_problem``), and no pass with more Results than its runs
        finished items."""
        columns = [column[0] for column in tables_of(self.db)["results"]]
        query = "SELECT * FROM results" if "pass" in columns else "SELECT *, 1 FROM results"
        size, paged = int(self.identity["entries"]), "paging" in self.identity
        latest, requested = max(self.passes, default=1), self.requests is not None
        made: Counter[int] = Counter()
        for row in self.db.execute(query):
            found = result_problem(row, size=size, latest=latest, paged=paged, requested=requested)
            if found is not None:
                return f"results row {row[0]}: {found}"
            made[row[11]] += 1
        for number, results in sorted(made.items()):
            if number > 1 and results > self.finished[number]:
                return f"runs of pass {number}: items are fewer than the results of that pass"
        return None

    def _spend(self) -> str | None:
        """Each reservation trusted, none missing, and no less spent than the Results say."""
        query = "SELECT attempt, reserved, spent FROM spend ORDER BY attempt"
        total = 0
        for number, (attempt, reserved, spent) in enumerate(self._rows("spend", query), 1):
            facts = {"attempt": attempt, "reserved": reserved, "spent": spent, "number": number}
            found = problem(_SPEND, facts)
            if found is not None:
                return f"spend row {attempt}: {found}"
            self.reservations[attempt] = reserved
            total += reserved if spent is None else spent
        costs = (json_value(record).get("cost") for (record,) in self._costed())
        paid = sum(cost for cost in costs if isinstance(cost, float | int))
        if paid * PICO > total * (1 + 1e-9) + 1:
            return "spend: its rows hold less than the results say they spent"
        return None

    def _charges(self) -> str | None:
        """Each part's charge a ``spend`` row of its own, of the amount that row reserved (a
        charge pointing elsewhere would settle another attempt's reservation)."""
        charged: set[int] = set()
        for part, attempt, reserved in self._rows("charges", "SELECT * FROM charges"):
            facts = {"part": part, "attempt": attempt, "reserved": reserved, "charged": charged}
            found = problem(_CHARGE, facts | {"checks": self})
            if found is not None:
                return f"charges row {part}: {found}"
            charged.add(attempt)
        return None

    def _costed(self) -> Iterable[Any]:
        return self.db.execute("SELECT record FROM results WHERE record LIKE '%\"cost\"%'")

    def _requests(self) -> str | None:
        """The first failed item whose stored request is not what the input gives (the
        failed file would send it elsewhere), or None."""
        if self.requests is None:
            return None
        items = enumerate(self.requests.items)
        query = "SELECT idx, request FROM results WHERE request IS NOT NULL ORDER BY idx"
        for index, stored in self.db.execute(query):
            item = next((item for position, item in items if position == index), MISSING)
            if item is MISSING:
                return f"results row {index}: request is for an item the input does not have"
            if self.requests.text(item) != stored:
                return f"results row {index}: request is not the input's item {index}"
        return None


def _decoded(raw: bytes) -> Any:
    """A stored text as a check reads it: ``UNREADABLE`` when it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return UNREADABLE


@contextlib.contextmanager
def resumed(
    path: Path, identity: Mapping[str, str], what: str, hint: str, requests: Requests | None = None
) -> Iterator[JournalReader]:
    """A reader of the journal to resume, checked to be one of this layout made for these
    ``what`` (their identity), every row of it trusted (``_Check``): JournalMismatch naming
    the problem, then ``hint``, otherwise. Checked on a read-only connection before anything
    else opens the file, so a journal refused stays as it was, byte for byte. ``requests``:
    what each failed row's request must be (None: a library's journal, which holds none)."""
    with contextlib.closing(read_only(path)) as db:
        db.text_factory = _decoded
        try:
            found = file_problem(db)
        except sqlite3.Error as exc:  # not SQLite at all, or unreadable
            found = f"cannot be read as a batchsync journal ({exc})"
        if found is not None:
            chosen = NOT_REPLACED if foreign(path) else hint
            raise JournalMismatch(f"{path} {found}: {chosen}")
        try:
            found = meta_shape_problem(db.execute("SELECT rowid, key, value FROM meta"))
            stored = {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta")}
            other = mismatch(stored, identity) if found is None else None
            if other is not None:
                raise JournalMismatch(f"{path} was made for other {what} ({other}); {hint}")
            found = found or _Check(db, identity, requests).problem()
        except sqlite3.Error as exc:  # damaged past what SQLite can read
            found = f"it cannot be read ({exc})"
    if found is not None:
        raise JournalMismatch(f"{path} was altered: {found}; {hint}")
    with contextlib.closing(JournalReader(path)) as reader:
        reader.upgrade()
        yield reader
