"""One run's lifecycle, the same for ``Batch``/``CallBatch``, the command line and the
cluster runner: the journal's lock, what the journal keeps, the journal opened for the pass,
what is left sent (by the engine here or by a cluster) with each Result journaled then
delivered, the progress bar, the stint, and the journal closed on every way out.

A runner says only what it sends (its items and what is left of them), what sends them and
where the Results go; ``RunController`` does the rest.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..core.engine import Deliver, Earlier
from ..core.history import Pass, Stint, difference
from ..core.result import Result, added_to
from ..limits.gates import Gates
from ..store.journal import Encode, Journal, JournalUnusable, locked, remove
from ..store.journal.spend import SpendRecord
from ..store.resume import Kept, Left, read_back
from .assembly import Ran
from .progress import Tally, counter


@dataclass(frozen=True)
class Journaled:
    """Where a run's final Results are journaled: the file, how a Result is stored
    (``encode``) and the identity of the items the journal is made for."""

    path: Path
    encode: Encode
    identity: Mapping[str, str]

    def open(
        self,
        passing: Pass | None,
        progress: Callable[[], Stint],
        committed: Callable[[Result], None] | None = None,
    ) -> Journal:
        """The journal, new or resumed, or JournalUnusable before anything is sent;
        ``passing``: the pass of its Results (None: the run sends nothing, records nothing);
        ``committed``: told each Result once it is on disk."""
        try:
            return Journal(
                self.path, self.encode, self.identity, passing=passing, progress=progress,
                committed=committed,
            )  # fmt: skip
        except sqlite3.Error as exc:
            raise JournalUnusable(f"cannot create the journal {self.path}: {exc}") from None


@dataclass(frozen=True)
class Plan:
    """What a run sends: the pass it is in, and what is left of that pass."""

    passing: Pass
    left: Left[Any]


class Send(Protocol):
    """What sends the items left and delivers each Result: the engine here
    (``assembly.fetch``, ``assembly.run_calls``) or a cluster (``cluster.on_cluster``);
    ``gates`` are the run's limits (None: a cluster's workers keep their own), ``progress``
    counts each finished item, ``earlier`` gives an item sent again its Result of an earlier
    pass (``Engine.run``)."""

    def __call__(
        self,
        items: Iterable[tuple[int, object]],
        deliver: Deliver,
        *,
        gates: Gates | None,
        progress: Tally,
        earlier: Earlier | None = None,
    ) -> Ran: ...


@runtime_checkable
class Finishing(Protocol):
    """A ``Send`` with something to do once the run's Results are journaled (a batch
    endpoint's files to delete at the provider)."""

    def finish(self) -> None: ...


@dataclass(frozen=True)
class Ended:
    """How a run ended: how its sending ended, and what it did (``Stint``)."""

    ran: Ran
    stint: Stint


class RunController:
    """One run of a batch, journaled or not. Entered, it holds the journal's lock until it
    exits (JournalInUse when another run has it; OSError when its folder cannot be written),
    so that what it reads of the journal and what it adds are one run's."""

    def __init__(self, journal: Journaled | None) -> None:
        self.journal = journal
        self._held = ExitStack()

    def __enter__(self) -> RunController:
        if self.journal is not None:
            self._held.enter_context(locked(self.journal.path))
        return self

    def __exit__(self, *exc: object) -> None:
        self._held.close()

    def replace(self) -> bool:
        """Delete the journal, for a fresh run: True when there was one."""
        return self.journal is not None and remove(self.journal.path)

    def kept(self, size: int, restore: Callable[[dict[str, Any]], Result], hint: str) -> Kept:
        """What the journal holds of the ``size`` items (``resume.read_back``; ``hint`` ends
        a mismatch's message); nothing without a journal, or before its first run."""
        if self.journal is None or not self.journal.path.exists():
            return Kept.nothing(size)
        return read_back(self.journal.path, self.journal.identity, restore, hint)

    def run(
        self,
        send: Send,
        items: Iterable[tuple[int, object]],
        deliver: Deliver,
        *,
        plan: Plan,
        gates: Gates | None,
        progress: bool,
        stints: list[Stint] | None = None,
        kept: Callable[[Result], None] | None = None,
    ) -> Ended:
        """Send what ``plan`` has left of ``items`` (index, item) through ``send``, each
        Result added to its item's earlier one, journaled when final, then delivered;
        ``progress``: show a bar; ``kept``: told each final Result once it is kept (on disk,
        with a journal). However the run ends, its stint (when it sent anything) is added to
        ``stints`` and to the journal, which is closed; then a ``Finishing`` send
        finishes."""
        left = plan.left
        passing = plan.passing if left.count else None  # (none: nothing to send)
        tally = counter(left.count, progress, None if gates is None else gates.holding)
        so_far = progress_of(plan.passing, tally, gates)
        before = _timeline(gates)
        journal = None if self.journal is None else self.journal.open(passing, so_far, kept)
        deliver = _delivering(deliver, journal, kept, left.earlier)
        try:
            with tally, _spend_kept(journal, gates):
                ran = send(
                    left.sent(items), deliver, gates=gates, progress=tally, earlier=left.before
                )
        finally:
            stint = so_far()
            if passing is not None and stints is not None:
                stints.append(stint)
            if journal is not None:
                journal.close(difference(_timeline(gates), before), stint)
        if isinstance(send, Finishing):  # (every Result it made is journaled by now)
            send.finish()
        return Ended(ran, stint)


def _delivering(
    deliver: Deliver,
    journal: Journal | None,
    kept: Callable[[Result], None] | None,
    earlier: Earlier | None,
) -> Deliver:
    """``deliver`` behind what a run does first with each Result: add it to the item's
    ``earlier`` one, then journal it (or tell ``kept``)."""
    if journal is not None:
        deliver = journaling(journal, deliver)
    elif kept is not None:
        deliver = telling(kept, deliver)
    return deliver if earlier is None else adding_to(earlier, deliver)


def _timeline(gates: Gates | None) -> dict[tuple[str, int], float]:
    """The seconds waited at ``gates`` so far, by (gate, unix second)."""
    if gates is None:
        return {}
    with gates.waits.lock:
        return dict(gates.waits.timeline)


def progress_of(passing: Pass, tally: Tally, gates: Gates | None) -> Callable[[], Stint]:
    """What a process (or a ``run()``) does in ``passing`` from now on, as a Stint read at
    any moment: its seconds, what ``tally`` counts, and its waits at ``gates`` from now."""
    started, begun = time.time(), time.monotonic()
    waited = _waits(gates)
    opened = 0 if gates is None else gates.circuits_opened

    def so_far() -> Stint:
        done, _, requests = tally.counts()
        waits = difference(_waits(gates), waited)
        elapsed = time.monotonic() - begun
        circuits = (0 if gates is None else gates.circuits_opened) - opened
        return Stint(passing, started, elapsed, done, requests, waits, circuits)

    return so_far


def _waits(gates: Gates | None) -> dict[str, float]:
    if gates is None:
        return {}
    with gates.waits.lock:
        return dict(gates.waits.seconds)


def adding_to(earlier: Earlier, deliver: Deliver) -> Deliver:
    """``deliver``, each Result added to the one ``earlier`` has for its item (a failure
    sent again, a paginated item going on: ``result.added_to``)."""

    def deliver_added(result: Result, item: object) -> None:
        before = earlier(result.index)
        deliver(result if before is None else added_to(before, result), item)

    return deliver_added


def telling(kept: Callable[[Result], None], deliver: Deliver) -> Deliver:
    """``deliver``, then ``kept`` told of each final Result (a run without a journal)."""

    def deliver_then_tell(result: Result, item: object) -> None:
        deliver(result, item)
        if result.final:
            kept(result)

    return deliver_then_tell


def journaling(journal: Journal, deliver: Deliver) -> Deliver:
    """``deliver``, after storing each final Result in the journal."""

    def store_then_deliver(result: Result, item: object) -> None:
        try:
            if result.final:
                journal.add(result, item)
        finally:  # a journal that failed stops the run, but what came back is still kept
            deliver(result, item)

    return store_then_deliver


@contextmanager
def _spend_kept(journal: Journal | None, gates: Gates | None) -> Iterator[None]:
    """The spend cap's reservations kept in ``journal`` for the block, when the run has both."""
    if journal is None or gates is None or gates.spend_ledger is None:
        yield
        return
    record = SpendRecord(journal.path)
    gates.keep_spend(record)
    try:
        yield
    finally:
        gates.keep_spend(None)
        record.close()
