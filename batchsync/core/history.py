"""A run's history: its passes (the first, then each retry of the failures) and what each
process, or each ``run()`` of a batch, did in them, so that the numbers of a run that was
resumed or retried cover all of it. Pure records and decisions; the journal stores them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from .kinds import NOT_FINAL

_Key = TypeVar("_Key")

# What a pass does with each item (``Pass.does``).
TO_SEND, DONE, TO_REDO, TO_GO_ON, TO_FINISH = range(5)


@dataclass(frozen=True)
class Pass:
    """One pass over a run's items: the first (``retry`` None), or a retry of the failures
    of the passes before it (``retry``: the error kinds retried; empty: every failure)."""

    number: int = 1
    retry: frozenset[str] | None = None

    def redoes(self, ok: bool, error_kind: str | None, made_in: int) -> bool:
        """Whether an item whose final Result (``ok``, ``error_kind``) was made in pass
        ``made_in`` is sent again in this pass."""
        chosen = self.retry is not None and (not self.retry or error_kind in self.retry)
        return chosen and not ok and made_in < self.number

    def does(self, ok: bool, error_kind: str | None, made_in: int, continued: bool) -> int:
        """What this pass does with an item whose final Result (``ok``, ``error_kind``) was
        made in pass ``made_in``: ``DONE``, ``TO_REDO`` (a failure it retries), ``TO_FINISH``
        (``continued``: a paginated item stopped partway before it failed or ended) or
        ``TO_GO_ON`` (a paginated item that failed partway, which the first pass's resume and
        a retry of its kind go on with); the last two from their next page. (An item without
        a final Result is ``TO_SEND``.)"""
        redone = self.redoes(ok, error_kind, made_in)
        if continued and error_kind in NOT_FINAL:
            return TO_FINISH
        if continued and (self.retry is None or redone):
            return TO_GO_ON
        return TO_REDO if redone else DONE

    def retrying(self, kinds: Iterable[str]) -> Pass:
        """The pass after this one, retrying the failures of ``kinds`` (none given: all)."""
        return Pass(self.number + 1, frozenset(kinds))

    def describe(self) -> str:
        if self.retry is None:
            return "run"
        return "retry of " + (", ".join(sorted(self.retry)) if self.retry else "every failure")


@dataclass(frozen=True)
class Stint:
    """What one process (or one ``run()`` of a batch) did: in which pass, from when (unix
    seconds), for how long, how many items it finished and requests it sent, and the seconds
    its attempts waited at each gate."""

    passing: Pass
    started: float
    elapsed: float
    items: int
    requests: int
    waits: Mapping[str, float] = field(default_factory=dict)
    circuits_opened: int = 0


@dataclass(frozen=True)
class Totals:
    """A run's totals over its stints: the one scope of every number a summary states."""

    elapsed: float | None
    waits: dict[str, float]
    circuits_opened: int


def totals(stints: Iterable[Stint]) -> Totals:
    """The sums over ``stints``; ``elapsed`` None when there were none (nothing was run)."""
    ran = list(stints)
    elapsed = sum((stint.elapsed for stint in ran), 0.0) if ran else None
    waits = merged_timeline(*(stint.waits for stint in ran))
    return Totals(elapsed, waits, sum(stint.circuits_opened for stint in ran))


def merged_timeline(*timelines: Mapping[_Key, float]) -> dict[_Key, float]:
    """Seconds waited by (gate, unix second), or by gate, summed over several timelines."""
    merged: dict[_Key, float] = {}
    for timeline in timelines:
        for key, seconds in timeline.items():
            merged[key] = merged.get(key, 0.0) + seconds
    return merged


def difference(now: Mapping[_Key, float], before: Mapping[_Key, float]) -> dict[_Key, float]:
    """What was added to a mapping of sums between two readings of it."""
    return {
        key: seconds - before.get(key, 0.0)
        for key, seconds in now.items()
        if seconds != before.get(key, 0.0)
    }
