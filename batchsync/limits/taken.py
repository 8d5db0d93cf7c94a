"""What the attempts to one host took of its announced counts, in flight and ended, with the
running sums the quota gate asks for: so that a take costs the same at request 200 000 as at
request 1, whatever the rate (each question is a look-up or a search in time order, never a
walk over every attempt of the last minute)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Taking:
    """What one attempt took, when it was let through (then sent) and when it ended; ``before``:
    what the attempts that ended before it took, once it has ended; ``told``: what its answer
    said was left."""

    mark: int
    amounts: dict[str, int]
    sent_at: float
    ended_at: float | None = None
    before: dict[str, int] = field(default_factory=dict)
    told: dict[str, int] = field(default_factory=dict)
    order: int = 0  # how many attempts ended before it, once it has ended


@dataclass
class TakenLog:
    """The attempts in flight (by mark, in the order they were taken) and those ended within
    ``kept`` seconds (in the order they ended); one in flight longer than ``longest`` is
    forgotten (no attempt lasts that long)."""

    kept: float
    longest: float
    flying: dict[int, Taking] = field(default_factory=dict)
    _ended: list[Taking] = field(default_factory=list)
    _ends: list[float] = field(default_factory=list)  # (their ends, searched without a key)
    _first: int = 0  # the oldest ended one still kept
    _flying_sum: dict[str, int] = field(default_factory=dict)
    _ended_sum: dict[str, int] = field(default_factory=dict)  # of every one ever ended
    ended_count: int = 0  # how many ever ended

    def take(self, taking: Taking) -> None:
        self.flying[taking.mark] = taking
        _add(self._flying_sum, taking.amounts, 1)

    def drop(self, mark: int) -> Taking | None:
        """The attempt taken as ``mark``, out of flight (never sent, or ended)."""
        taking = self.flying.pop(mark, None)
        if taking is not None:
            _add(self._flying_sum, taking.amounts, -1)
        return taking

    def end(self, taking: Taking, sent: float, now: float) -> None:
        """``taking``, out of flight, sent at ``sent``, ended ``now`` (never before the last)."""
        taking.sent_at, taking.ended_at = sent, now
        taking.before, taking.order = dict(self._ended_sum), self.ended_count
        self.ended_count += 1
        self._ended.append(taking)
        self._ends.append(now)
        _add(self._ended_sum, taking.amounts, 1)

    def forget(self, now: float) -> None:
        while self.flying:
            oldest = next(iter(self.flying.values()))
            if oldest.sent_at > now - self.longest:
                break
            self.drop(oldest.mark)
        ends = self._ends
        while self._first < len(ends) and ends[self._first] <= now - self.kept:
            self._first += 1
        if self._first > len(ends) // 2:  # (amortised: each is moved once more at most)
            del self._ended[: self._first], ends[: self._first]
            self._first = 0

    def in_flight(self, kind: str) -> int:
        return self._flying_sum.get(kind, 0)

    def ended_after(self, instant: float, kind: str) -> int:
        """What the kept attempts that ended after ``instant`` took of ``kind``."""
        index = self._after(instant)
        if index == len(self._ended):
            return 0
        return self._ended_sum.get(kind, 0) - self._ended[index].before.get(kind, 0)

    def ended_since(self, instant: float) -> Iterator[Taking]:
        """The kept attempts that ended at ``instant`` or after, oldest first."""
        start = bisect.bisect_left(self._ends, instant, lo=self._first)
        for index in range(start, len(self._ended)):
            yield self._ended[index]

    def ended_by(self, instant: float) -> Iterator[Taking]:
        """The kept attempts that ended by ``instant``, newest first."""
        for index in range(self._after(instant) - 1, self._first - 1, -1):
            yield self._ended[index]

    def _after(self, instant: float) -> int:
        return bisect.bisect_right(self._ends, instant, lo=self._first)


def _add(sums: dict[str, int], amounts: dict[str, int], sign: int) -> None:
    for kind, amount in amounts.items():
        sums[kind] = sums.get(kind, 0) + sign * amount
