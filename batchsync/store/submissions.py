"""The submissions of a run through a provider's batch endpoint, as the journal keeps them:
one row per part of the input, written as its state changes (planned, uploaded, submitted,
each status the provider reports, collected, cleaned), so that a process killed at any
moment is followed by one that polls the same batch and never submits a part twice.

A run without a journal keeps them in memory (``Ledger``), for a ``Batch``'s next ``run()``.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import re
import secrets
import sqlite3
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .rules import MOMENT, Facts, Rule, Test, count, each, json_of, json_value, optional, problem

# A provider's name, as ``batches.providers`` registers it.
Provider = str


@dataclass(frozen=True)
class Shape:
    """What the journal checks of one provider's parts: every status its batches may report,
    those after which nothing changes, the forms of its ids (``file``, ``batch``: what each
    begins with), and whether a part's rows go up as a file first (an input file id)."""

    statuses: tuple[str, ...]
    ended: frozenset[str]
    id_forms: Mapping[str, str]
    uploads: bool


# The providers batchsync submits to, by name: each provider's module registers its shape.
SHAPES: dict[Provider, Shape] = {}


# Our own states around the provider's statuses. ``planned``: rows chosen, nothing sent;
# ``uploaded``: OpenAI has the file; ``submitting``: the create was sent (its answer not yet
# recorded: a later run looks for the batch before sending another); ``waiting``: refused for
# the enqueued-token cap, submitted again later; ``collected``: every row has its Result;
# ``cleaned``: the files (or the batch) deleted at the provider, or kept as asked;
# ``dropped``: a part a later run found without a batch, its rows put in new parts; ``held``:
# a batch whose rows got a Result that is not its answer (the deadline or budget ended the wait,
# or its results could not be read): kept at the provider, read again by a run given its rows.
PLANNED, UPLOADED, SUBMITTING, WAITING = "planned", "uploaded", "submitting", "waiting"
COLLECTED, CLEANED, DROPPED, HELD = "collected", "cleaned", "dropped", "held"
OURS = (PLANNED, UPLOADED, SUBMITTING, WAITING, COLLECTED, CLEANED, DROPPED, HELD)
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")


def well_formed(provider: Provider, kind: str, value: object) -> str | None:
    """``value`` when it is an id of ``kind`` (``file``, ``batch``) as ``provider`` gives
    them (safe in a URL's path too), else None."""
    shape = SHAPES.get(provider)
    prefix = None if shape is None else shape.id_forms.get(kind)
    if prefix is None or not isinstance(value, str) or not _ID.fullmatch(value):
        return None
    if not value.strip("."):  # (".", "..": a path's segments, not an id)
        return None
    return value if value.startswith(prefix) and len(value) > len(prefix) else None


# The most tokens a part's answers may have used (a count past it is no count of ours).
MOST_TOKENS = 2**53
_TAG = re.compile(r"batchsync-part-[1-9][0-9]{0,17}-[0-9a-f]{12}")

Ranges = tuple[tuple[int, int], ...]


def new_tag(number: int) -> str:
    """A new part's own name (``Part.tag``): its number and a nonce no other part has."""
    return f"batchsync-part-{number}-{secrets.token_hex(6)}"


def ranges_of(indexes: Iterable[int]) -> Ranges:
    """Sorted indexes as (first, last) runs: a part of 50 000 rows in a line of text."""
    runs: list[tuple[int, int]] = []
    for index in indexes:
        if runs and index == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], index)
        else:
            runs.append((index, index))
    return tuple(runs)


def indexes_in(ranges: Ranges) -> Iterator[int]:
    for first, last in ranges:
        yield from range(first, last + 1)


@dataclass(frozen=True)
class Part:
    """One submission: its rows (input indexes, as runs), its state and what the provider
    named along the way; ``history``: (unix time, state) at each change, for the report."""

    number: int
    passing: int
    provider: Provider
    rows: Ranges
    state: str = PLANNED
    input_file: str | None = None
    batch: str | None = None
    output_file: str | None = None
    error_file: str | None = None
    submitted: float | None = None
    history: tuple[tuple[float, str], ...] = ()
    tokens: tuple[int, int] = (0, 0)
    # Its own name, made before anything is sent (``new_tag``): the name its rows are
    # uploaded under (OpenAI: a run killed during the upload leaves a file that a later run
    # finds by it), and its nonce begins each row's custom_id (a batch that is not this
    # part's has no row of it).
    tag: str = ""

    @property
    def nonce(self) -> str:
        return self.tag.rpartition("-")[2]

    @property
    def dropped(self) -> bool:
        """Whether a later run found it without a batch and put its rows in new parts (its
        uploaded file deleted since or not)."""
        cleaned_since = self.state == CLEANED and any(s == DROPPED for _, s in self.history)
        return self.batch is None and (self.state == DROPPED or cleaned_since)

    @property
    def size(self) -> int:
        return sum(last - first + 1 for first, last in self.rows)

    @property
    def open(self) -> bool:
        """Whether its rows may still be waiting on the provider (no Result from it yet)."""
        return self.state not in (COLLECTED, CLEANED, DROPPED)

    def shown(self, mask: Callable[[str], str]) -> Part:
        """This part as a report shows it: the provider's ids masked (an id a provider gave
        may repeat a secret)."""
        ids = ((name, getattr(self, name)) for name in _IDS)
        masked: dict[str, Any] = {name: None if i is None else mask(i) for name, i in ids}
        return replace(self, **masked)

    def moved(self, state: str, when: float | None = None, **changes: Any) -> Part:
        """This part in ``state`` (recorded in its history when it changed)."""
        history = self.history
        if state != self.state or not history:
            history = (*history, (time.time() if when is None else when, state))
        return replace(self, state=state, history=history, **changes)


# The ids a provider gives a part.
_IDS = ("input_file", "batch", "output_file", "error_file")


class Covered:
    """Which part holds each input index, looked up by bisection over their runs: the newest
    part that has it (a row an ended batch did not run, sent again in a later part of the run,
    is the later part's)."""

    def __init__(self, parts: Iterable[Part]) -> None:
        runs = _newest_over(
            sorted((first, last, part.number) for part in parts for first, last in part.rows)
        )
        self._starts = [first for first, _, _ in runs]
        self._runs = runs

    def part_of(self, index: int) -> int | None:
        position = bisect_right(self._starts, index) - 1
        if position >= 0 and self._runs[position][1] >= index:
            return self._runs[position][2]
        return None


def _newest_over(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Sorted (first, last, part) runs, which may overlap, as disjoint runs each naming the
    newest (highest-numbered) part holding its indexes."""
    disjoint: list[tuple[int, int, int]] = []
    for first, last, number in _newest_segments(runs):
        if disjoint and disjoint[-1][2] == number and disjoint[-1][1] == first - 1:
            disjoint[-1] = (disjoint[-1][0], last, number)
        else:
            disjoint.append((first, last, number))
    return disjoint


def _newest_segments(runs: list[tuple[int, int, int]]) -> Iterator[tuple[int, int, int]]:
    """Between each two points where a run begins or ends, the newest part holding the span."""
    points = sorted({first for first, _, _ in runs} | {last + 1 for _, last, _ in runs})
    holding: list[tuple[int, int]] = []  # (-part, last) of the runs begun by the point
    taken = 0
    for point, after in itertools.pairwise(points):
        while taken < len(runs) and runs[taken][0] <= point:
            heapq.heappush(holding, (-runs[taken][2], runs[taken][1]))
            taken += 1
        while holding and holding[0][1] < point:
            heapq.heappop(holding)
        if holding:
            yield point, after - 1, -holding[0][0]


# A part's reservation under a spend cap: the spend ledger's mark of it, and its amount.
Charge = tuple[object, int]


class Ledger:
    """The parts of a run kept in memory (a batch without a journal), with the charge of
    each part reserved under a spend cap and not settled yet."""

    def __init__(self) -> None:
        self._parts: dict[int, Part] = {}
        self._charges: dict[int, Charge] = {}
        self._lock = threading.Lock()

    def parts(self) -> list[Part]:
        with self._lock:
            return [self._parts[number] for number in sorted(self._parts)]

    def charge_of(self, number: int) -> Charge | None:
        with self._lock:
            return self._charges.get(number)

    def save(self, part: Part, charge: Charge | None = None) -> None:
        """Keep ``part`` as it is now, with ``charge`` (its reservation) when given."""
        with self._lock:
            self._parts[part.number] = part
            if charge is not None:
                self._charges[part.number] = charge

    def settled(self, number: int) -> None:
        """Part ``number``'s charge is settled: forget it."""
        with self._lock:
            self._charges.pop(number, None)

    def close(self) -> None:
        """Nothing to close in memory."""


COLUMNS = (
    "part, pass, provider, rows, state, input_file, batch, output_file, error_file, "
    "submitted, updated, history, input_tokens, output_tokens, tag"
)
_COLUMNS = tuple(name.strip() for name in COLUMNS.split(","))
_SAVE = f"INSERT OR REPLACE INTO submissions ({COLUMNS}) VALUES ({', '.join('?' * len(_COLUMNS))})"


class JournaledLedger(Ledger):
    """The parts of a run kept in its journal's ``submissions`` table, each change committed
    before the call that depends on it is made, a part's charge in the same commit as the
    part (on a connection of its own: the Results' writer keeps its own)."""

    def __init__(self, path: Path, connect: Any) -> None:
        super().__init__()
        self._db: sqlite3.Connection = connect(path)
        rows = self._db.execute(f"SELECT {COLUMNS} FROM submissions ORDER BY part")
        self._parts = {part.number: part for part in map(part_of, rows)}
        charges = self._db.execute("SELECT part, attempt, reserved FROM charges")
        self._charges = {int(part): (int(mark), int(amount)) for part, mark, amount in charges}

    def save(self, part: Part, charge: Charge | None = None) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute(_SAVE, row_of(part))
            if charge is not None:
                # (the journal's own spend row: a ledger not kept in it has none to name)
                assert type(charge[0]) is int, "a part's charge is a row of the journal's spend"
                row = (part.number, charge[0], charge[1])
                self._db.execute("INSERT OR REPLACE INTO charges VALUES (?, ?, ?)", row)
                self._charges[part.number] = charge
            self._parts[part.number] = part

    def settled(self, number: int) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM charges WHERE part = ?", (number,))
            self._charges.pop(number, None)

    def close(self) -> None:
        self._db.close()


def row_of(part: Part) -> tuple[Any, ...]:
    """A part's ``submissions`` row (its columns in ``COLUMNS``' order)."""
    updated = part.history[-1][0] if part.history else time.time()
    ids = [getattr(part, name) for name in _IDS]
    rows, history = _pairs_text(part.rows), _pairs_text(part.history)
    return (part.number, part.passing, part.provider, rows, part.state, *ids, part.submitted,
            updated, history, *part.tokens, part.tag)  # fmt: skip


def _pairs_text(pairs: Iterable[tuple[Any, Any]]) -> str:
    return json.dumps([list(pair) for pair in pairs], separators=(",", ":"))


def part_of(row: Sequence[Any]) -> Part:
    """The Part a ``submissions`` row (checked by ``submission_problem``) holds."""
    fields = dict(zip(_COLUMNS, row, strict=True))
    return Part(
        int(fields["part"]), int(fields["pass"]), fields["provider"],
        tuple((int(first), int(last)) for first, last in json.loads(fields["rows"])),
        str(fields["state"]), submitted=fields["submitted"],
        history=tuple((float(when), str(state)) for when, state in json.loads(fields["history"])),
        tokens=(int(fields["input_tokens"]), int(fields["output_tokens"])), tag=fields["tag"],
        **{name: fields[name] for name in _IDS},
    )  # fmt: skip


# --- what a row must hold before a run trusts it ---------------------------------------------
def _runs(runs: Any, facts: Facts) -> bool:
    """Runs [first, last] of the input's indexes, in order, apart, none empty."""
    if not (isinstance(runs, list) and runs and each(_two_counts)(runs, facts)):
        return False
    before = [-2, *(last for _, last in runs)]  # (where the run before each ended)
    return all(
        end + 1 < first <= last < facts["size"]
        for end, (first, last) in zip(before, runs, strict=False)
    )


def _two_counts(pair: Any, facts: Facts) -> bool:
    return isinstance(pair, list) and len(pair) == 2 and all(count()(n, facts) for n in pair)


def _state(state: Any, facts: Facts) -> bool:
    return isinstance(state, str) and state in (*OURS, *facts["shape"].statuses)


def _history(entries: Any, facts: Facts) -> bool:
    return isinstance(entries, list) and all(
        isinstance(entry, list) and len(entry) == 2 and MOMENT(entry[0], facts)
        and _state(entry[1], facts)
        for entry in entries
    )  # fmt: skip


def _id_of(kind: str) -> Test:
    """None, or an id of ``kind`` as the part's provider gives them."""
    return lambda value, facts: (
        value is None or well_formed(facts["provider"], kind, value) is not None
    )


def _tag(tag: Any, facts: Facts) -> bool:
    matched = isinstance(tag, str) and _TAG.fullmatch(tag) is not None
    return matched and tag.split("-")[2] == str(facts["part"])


def _last_state(state: Any, facts: Facts) -> bool:
    entries = json_value(facts["history"])
    return not entries or entries[-1][1] == state


def _made(facts: Facts) -> bool:
    """Whether the provider made the part's batch and said so."""
    return facts["state"] in (*facts["shape"].statuses, HELD)


def _uploaded(facts: Facts) -> bool:
    return _made(facts) or facts["state"] in (UPLOADED, SUBMITTING)


_UNSENT = (PLANNED, UPLOADED, SUBMITTING, WAITING, DROPPED)
_TOKENS = count(most=MOST_TOKENS - 1)
# A ``submissions`` row of a journal of ``size`` items whose passes are ``passes``, its
# provider's ``shape``: each value, then what its state says it must hold (a batch id once the
# provider made one, files as they came).
_SUBMISSION = (
    Rule("part", count(1, "size"), "part is not a number from 1 to the items' count"),
    Rule("pass", lambda number, facts: number in facts["passes"],
         "pass is not a pass of the journal"),
    Rule("provider", lambda _, facts: facts["shape"] is not None,
         "provider is not one batchsync submits to"),
    Rule("rows", json_of(_runs), "rows are not runs of the input's indexes"),
    Rule("state", _state, "state is not one of a part"),
    Rule("input_file", _id_of("file"), "an id is not a file id as {provider} gives them"),
    Rule("batch", _id_of("batch"), "an id is not a batch id as {provider} gives them"),
    Rule("output_file", _id_of("file"), "an id is not a file id as {provider} gives them"),
    Rule("error_file", _id_of("file"), "an id is not a file id as {provider} gives them"),
    Rule("submitted", optional(MOMENT), "a time is not a time"),
    Rule("updated", MOMENT, "a time is not a time"),
    Rule("history", json_of(_history), "history is not a list of (time, state)"),
    Rule("input_tokens", _TOKENS, "tokens are not counts"),
    Rule("output_tokens", _TOKENS, "tokens are not counts"),
    Rule("tag", _tag, "tag is not the part's own as batchsync makes them"),
    Rule("state", _last_state, "state is not the last of its history"),
    Rule("batch", lambda batch, facts: batch is not None or not _made(facts),
         "batch is missing for a part the provider has"),
    Rule("batch", lambda batch, facts: batch is None or facts["state"] not in _UNSENT,
         "batch is set for a part the provider has not"),
    Rule("input_file", lambda file, facts: file is not None or not (
        _uploaded(facts) and facts["shape"].uploads), "input_file is missing for a part uploaded"),
    Rule("input_file", lambda file, facts: file is None or (
        facts["shape"].uploads and facts["state"] != PLANNED),
         "input_file is set for a part with no upload"),
    Rule("output_file", lambda file, facts: file is None or facts["state"] in (COLLECTED, CLEANED),
         "output_file or error_file is set for a part not collected"),
    Rule("error_file", lambda file, facts: file is None or facts["state"] in (COLLECTED, CLEANED),
         "output_file or error_file is set for a part not collected"),
    Rule("submitted", lambda when, facts: when is not None or not (
        _made(facts) or facts["state"] == SUBMITTING), "submitted is missing for a part sent"),
)  # fmt: skip


def submission_problem(row: Sequence[Any], size: int, passes: set[int]) -> str | None:
    """What makes a ``submissions`` row (its columns in the schema's order) untrustworthy for
    a journal of ``size`` items whose passes are ``passes`` (``_SUBMISSION``), or None."""
    facts = dict(zip(_COLUMNS, row, strict=True))
    shape = SHAPES.get(facts["provider"])
    return problem(_SUBMISSION, facts | {"size": size, "passes": passes, "shape": shape})


def times_sent(indexes: Iterable[int], parts: Iterable[Part]) -> dict[int, tuple[int, float]]:
    """How many of ``parts`` (those not dropped) hold each of ``indexes``, and the earliest
    submission among them (inf: none was submitted)."""
    sent = dict.fromkeys(indexes, (0, math.inf))
    for part in parts:
        if part.dropped:
            continue
        starts = [first for first, _ in part.rows]
        submitted = math.inf if part.submitted is None else part.submitted
        for index, (times, first) in sent.items():
            position = bisect_right(starts, index) - 1
            if position >= 0 and part.rows[position][1] >= index:
                sent[index] = (times + 1, min(first, submitted))
    return sent


def overlap_problem(parts: Iterable[Part]) -> str | None:
    """The first part whose rows another part of its pass has too, unless each such other is
    a dropped one or one its provider had ended (a row its batch did not run, sent again in the
    run: ``--batch-retries``); or whose number is not the next (parts are numbered 1, 2, …);
    or None."""
    taken: dict[tuple[int, int], Part] = {}
    for expected, part in enumerate(sorted(parts, key=lambda p: p.number), start=1):
        if part.number != expected:
            return f"submissions row {part.number}: part is not the next number ({expected})"
        if part.dropped:  # (its rows went into a later part)
            continue
        for index in indexes_in(part.rows):
            earlier = taken.get((part.passing, index))
            if earlier is not None and not ended_at_provider(earlier):
                return f"submissions row {part.number}: rows are in another part of its pass"
            taken[(part.passing, index)] = part
    return None


def ended_at_provider(part: Part) -> bool:
    """Whether the part's batch ended at the provider and stays so: its history holds a
    status the provider ends batches in, and it is in one still or closed (one failed for a
    queue cap and waiting to be submitted again has not ended)."""
    shape = SHAPES.get(part.provider)
    if shape is None or part.state not in (*shape.ended, COLLECTED, CLEANED, HELD):
        return False
    return any(state in shape.ended for _, state in part.history)
