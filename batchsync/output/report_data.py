"""The report's numbers, apart from how they are shown (``report``): pure, fed one Result's
``Trace`` at a time, memory bounded by the number of time buckets, not of items.

Times come from each Result's ``finished`` (unix seconds, stored in the journal). Attempts
are placed back from there: the last one ended when the item finished, each one before it
ended its own ``wait`` before the next began. Gate waits between attempts (cooldown, quota,
rate, breaker) are not in the attempt log, so the attempts of an item that waited at a gate
are placed a little later than they were sent; the run's totals of those waits are shown.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.result import PERCENTILES, Listing, Result, Trace, Tried
from ..store.submissions import Part

# The outcomes an attempt is counted under in the chart of attempts over time.
CHARTED = ("ok", "retried", "failed", "429")
# Time buckets at most: a run of any length is drawn with this many points.
MAX_BUCKETS = 150
# Latency histogram of each bucket: log-spaced bins from 100 µs, each 10 % wider than the
# one before, so a percentile read from it is within 10 % of the exact one.
_LATENCY_FLOOR = 1e-4
_LATENCY_STEP = 1.1
_LATENCY_BINS = 250
# Items listed in the tables.
SLOWEST = 25
FAILED_SHOWN = 1000


def charted_as(attempt: Tried, last: bool) -> str:
    """The outcome an attempt is counted under: a 429, a success, a failure followed by
    another attempt (``retried``), or the item's last failure."""
    status, kind = attempt.status_code, attempt.error_kind
    if status == 429:
        return "429"
    if kind is None:
        return "ok"
    return "failed" if last else "retried"


def placed(finished: float, log: Sequence[Tried]) -> list[tuple[float, float]]:
    """(start, end) of each attempt in unix seconds, placed back from ``finished``."""
    spans: list[tuple[float, float]] = []
    end = finished
    for position in range(len(log) - 1, -1, -1):
        start = end - log[position].elapsed
        spans.append((start, end))
        if position:
            end = start - (log[position - 1].wait or 0.0)
    spans.reverse()
    return spans


def bucket_width(span: float, buckets: int = MAX_BUCKETS) -> float:
    """The smallest of 1, 2, 5 x 10^k seconds that cuts ``span`` into at most ``buckets``."""
    wanted = max(span / buckets, 1e-3)
    power = 10.0 ** math.floor(math.log10(wanted))
    for step in (1.0, 2.0, 5.0, 10.0):
        if step * power >= wanted * (1 - 1e-9):
            return step * power
    return 10 * power  # pragma: no cover (the loop always returns)


def latency_bin(seconds: float) -> int:
    if seconds <= _LATENCY_FLOOR:
        return 0
    position = int(math.log(seconds / _LATENCY_FLOOR) / math.log(_LATENCY_STEP)) + 1
    return min(position, _LATENCY_BINS - 1)


def bin_seconds(position: int) -> float:
    """The upper edge of a latency bin (what a percentile falling in it is shown as)."""
    return _LATENCY_FLOOR * _LATENCY_STEP**position


def histogram_percentile(counts: Mapping[int, int], share: float) -> float:
    """The ``share`` percentile (nearest rank) of a latency histogram, as its bin's edge."""
    total = sum(counts.values())
    wanted = min(total, max(1, math.ceil(share * total)))
    seen = 0
    for position in sorted(counts):
        seen += counts[position]
        if seen >= wanted:
            return bin_seconds(position)
    return bin_seconds(max(counts))  # pragma: no cover (an empty histogram is never asked)


@dataclass
class Aggregate:
    """The report's numbers, added up one Result at a time over fixed time buckets.

    ``start`` and ``end`` (unix seconds) bound the run's times: the first claim and the last
    Result. Memory depends on the bucket count, never on the number of items.
    """

    start: float
    end: float
    width: float = 0.0
    items: int = 0
    untimed: int = 0
    attempts: dict[str, list[int]] = field(default_factory=dict)
    backoff: list[float] = field(default_factory=list)
    latency: list[Counter[int]] = field(default_factory=list)
    attempts_per_item: Counter[int] = field(default_factory=Counter)
    slowest: list[tuple[float, int]] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    failed_total: int = 0
    gates: dict[str, list[float]] = field(default_factory=dict)
    # Under a spend cap (else empty): dollars the attempts that ended in each bucket spent and
    # had reserved (their worst cases), and by the model priced: attempts, reserved, spent.
    spent: list[float] = field(default_factory=list)
    reserved: list[float] = field(default_factory=list)
    models: dict[str, list[float]] = field(default_factory=dict)
    # Items by the lane that answered them ("batch": a provider's batch endpoint; "live"; "none":
    # never sent), and the live attempts drawn over time (a batch row's is not: it is charted
    # with its part).
    lanes: Counter[str] = field(default_factory=Counter)
    live_attempts: int = 0
    buckets: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        self.end = max(self.end, self.start)
        if not self.width:
            self.width = bucket_width(self.end - self.start)
        count = self.buckets = max(1, math.ceil((self.end - self.start) / self.width - 1e-9))
        self.attempts = {name: [0] * count for name in CHARTED}
        self.backoff = [0.0] * count
        self.latency = [Counter() for _ in range(count)]

    def bucket(self, moment: float) -> int:
        return min(self.buckets - 1, max(0, int((moment - self.start) / self.width)))

    def add(self, trace: Trace) -> None:
        self.items += 1
        self.attempts_per_item[trace.attempts] += 1
        self._add_lane(trace.log)
        if len(self.slowest) < SLOWEST:
            heapq.heappush(self.slowest, (trace.elapsed, -trace.index))
        elif trace.elapsed > self.slowest[0][0]:
            heapq.heapreplace(self.slowest, (trace.elapsed, -trace.index))
        if not trace.ok:
            self.failed_total += 1
            if len(self.failed) < FAILED_SHOWN:
                self.failed.append(trace.index)
        if trace.finished is None:
            self.untimed += 1
            return
        log = trace.log
        last = len(log) - 1
        for position, (begun, ended) in enumerate(placed(trace.finished, log)):
            self._add_attempt(log[position], begun, ended, last=position == last)

    def _add_lane(self, log: Sequence[Tried]) -> None:
        self.lanes[(log[-1].lane or "live") if log else "none"] += 1

    def _add_attempt(self, attempt: Tried, begun: float, ended: float, *, last: bool) -> None:
        if attempt.lane is not None:  # (a batch row: only what it spent)
            if attempt.cost is not None:
                self._add_spend(attempt, self.bucket(ended))
            return
        self.live_attempts += 1
        self.attempts[charted_as(attempt, last)][self.bucket(begun)] += 1
        self.latency[self.bucket(ended)][latency_bin(attempt[2])] += 1
        if attempt.wait and not last:
            self._spread(self.backoff, ended, ended + attempt.wait)
        if attempt.cost is not None:
            self._add_spend(attempt, self.bucket(ended))

    def _add_spend(self, attempt: Tried, bucket: int) -> None:
        if not self.spent:
            self.spent, self.reserved = [0.0] * self.buckets, [0.0] * self.buckets
        reserved = attempt.reserved or 0.0  # (a journal of an earlier batchsync: not kept)
        self.spent[bucket] += attempt.cost or 0.0
        self.reserved[bucket] += reserved
        counted = self.models.setdefault(attempt.model or "(not recorded)", [0, 0.0, 0.0])
        counted[0] += 1
        counted[1] += reserved
        counted[2] += attempt.cost or 0.0

    def _spread(
        self, series: list[float], begun: float, ended: float, amount: float | None = None
    ) -> None:
        """Add the seconds of [begun, ended] that fall in each bucket to that bucket (or the
        share of ``amount`` that they are)."""
        first, final = self.bucket(begun), self.bucket(ended)
        scale = 1.0 if amount is None or ended <= begun else amount / (ended - begun)
        for position in range(first, final + 1):
            low = max(begun, self.start + position * self.width)
            high = (
                ended if position == final else min(ended, self.start + (position + 1) * self.width)
            )
            series[position] += max(0.0, high - low) * scale

    def add_gate_waits(self, timeline: Mapping[tuple[str, int], float]) -> None:
        """Add the seconds waited at each gate, by (gate, unix second), as a run's gates
        counted them (``WaitStats.timeline``)."""
        for (gate, second), seconds in sorted(timeline.items()):
            series = self.gates.setdefault(gate, [0.0] * self.buckets)
            self._spread(series, float(second), float(second + 1), seconds)

    # -- what the charts show --------------------------------------------------------------

    def times(self) -> list[float]:
        """Each bucket's start, in seconds from the run's start."""
        return [round(position * self.width, 6) for position in range(self.buckets)]

    def per_second(self) -> dict[str, list[float]]:
        """Attempts per second in each bucket, by outcome."""
        return self._rates(self.attempts)

    def percentiles(self) -> dict[str, list[float | None]]:
        """p50/p95/p99 of the attempts that ended in each bucket (None where none did)."""
        return {
            name: [
                histogram_percentile(counts, share) if counts else None for counts in self.latency
            ]
            for name, share in PERCENTILES.items()
        }

    def waiting(self) -> dict[str, list[float]]:
        """Items waiting at each gate, on average over each bucket (seconds waited per
        second): ``backoff`` between attempts, then the gates' waits when they were given."""
        return self._rates({"backoff": self.backoff, **dict(sorted(self.gates.items()))})

    def spending(self) -> dict[str, list[float]]:
        """Dollars spent and reserved in each bucket, and spent in all by its end (empty: no
        spend cap)."""
        if not self.spent:
            return {}
        in_all = list(itertools.accumulate(self.spent))
        return {"spent": self.spent, "reserved": self.reserved, "in all": in_all}

    def spending_by_model(self) -> list[tuple[str, int, float, float]]:
        """(model, attempts, dollars reserved, dollars spent), the dearest first."""
        rows = [
            (model, int(n), reserved, spent) for model, (n, reserved, spent) in self.models.items()
        ]
        return sorted(rows, key=lambda row: (-row[3], row[0]))

    def _rates(self, series: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
        return {name: [value / self.width for value in values] for name, values in series.items()}

    def slowest_indexes(self) -> list[int]:
        return [-negative for _, negative in sorted(self.slowest, reverse=True)]


# One item as the report reads it: what its charts count, and what its tables list.
Entry = tuple[Trace, Listing]


def collected(
    entries: Iterable[Entry],
    span: tuple[float, float] | None,
    timeline: Mapping[tuple[str, int], float] | None = None,
) -> tuple[Aggregate, Callable[[list[int]], list[Listing]]]:
    """The aggregate of ``entries`` (and of the gates' waits, when given), added up in one
    pass within ``span``, and how to list the items its tables show, by index: only those
    listings are kept (at most a few times the tables' rows at any moment)."""
    counted = Aggregate(*(span or (0.0, 0.0)))
    kept: dict[int, Listing] = {}
    for trace, listing in entries:
        counted.add(trace)
        kept[trace.index] = listing
        if len(kept) > 2 * (SLOWEST + FAILED_SHOWN):
            kept = _shown(counted, kept)
    counted.add_gate_waits(timeline or {})
    kept = _shown(counted, kept)
    return counted, lambda indexes: [kept[i] for i in indexes if i in kept]


def _shown(counted: Aggregate, kept: dict[int, Listing]) -> dict[int, Listing]:
    wanted = {*counted.failed, *counted.slowest_indexes()}
    return {index: listing for index, listing in kept.items() if index in wanted}


def entries_of(results: Sequence[Result]) -> tuple[Iterable[Entry], tuple[float, float] | None]:
    """Results in memory as the report reads them, and the span of their times: (first
    claim, last finish) in unix seconds over the timed Results, or None."""
    traces = [Trace.of(result) for result in results]
    timed = [(t.finished - t.elapsed, t.finished) for t in traces if t.finished is not None]
    span = (min(start for start, _ in timed), max(end for _, end in timed)) if timed else None
    return zip(traces, map(Listing.of, results), strict=True), span


def submitted(parts: Sequence[Part]) -> dict[str, int]:
    """What the parts sent through a batch endpoint add up to: the input and output tokens
    their answers used (as the providers counted them), the parts dropped and those still
    open at the provider."""
    return {
        "inputs": sum(part.tokens[0] for part in parts),
        "outputs": sum(part.tokens[1] for part in parts),
        "dropped": sum(1 for part in parts if part.dropped),
        "still_open": sum(1 for part in parts if part.open and part.batch is not None),
    }
