"""A limit of N per period that holds over every window of that period as the server counts it:
``rate`` (one per attempt) and ``token_rate`` (each attempt's tokens).

A user reads ``500/min`` as "never more than 500 in any minute", and servers count over a
sliding window from when a request reaches them. Two rules keep that by construction:

* **A log of what was sent.** Each attempt's amount enters the log when it is let through and
  leaves it one period after the attempt *ended* (its answer came, or it failed). The server
  counted the request somewhere between those two instants, so a new attempt, which reaches
  the server after it is let through, can never share a server's window with one that left
  the log: no margin for arrival jitter is needed or guessed. An attempt in flight never
  leaves. The price is the answer's latency once per period: a run at the limit uses
  ``period / (period + latency)`` of it (99 % of a second's limit at 10 ms, 97 % of a
  minute's at 2 s).
* **An even pace.** Sends are spaced ``period / count`` apart (an attempt's amount times
  that, for tokens): no burst at the start or after a quiet spell, as servers that enforce a
  minute's limit over shorter spans expect, and a long run still paces the whole count.

An amount larger than the whole count can never be sent (``token_rate`` refuses such items
before they start). Entries keep the larger of their amount and what the answer said it
used: a server may count what was asked for (OpenAI counts ``max_tokens``), never less.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..core.admission import Admission
from ..core.verdict import ErrorKind, Feedback
from .gate import POLL_SECONDS, Waiting
from .rates import Rate

INFINITE = math.inf


@dataclass(frozen=True)
class Window:
    """At most ``count`` per ``period`` seconds, sent at most one ``interval`` apart."""

    count: float
    period: float

    @classmethod
    def of(cls, rate: Rate) -> Window:
        """A rate as a window that whole sends can fill: below one a period, one per the
        longer period that makes it one (0.5/s: one in any 2 s)."""
        if rate.count < 1:
            return cls(1.0, rate.period / rate.count)
        return cls(float(rate.count), rate.period)

    @property
    def interval(self) -> float:
        """Seconds between the sends of one unit each."""
        return self.period / self.count

    def __str__(self) -> str:
        return f"{self.count:g} per {self.period:g} s"


@dataclass(eq=False, slots=True)
class Entry:
    """One attempt's amount in a log, leaving it ``period`` after the attempt ends (``leaves``
    is infinite while it is in flight)."""

    amount: float
    period: float
    leaves: float = INFINITE
    paced_from: float = -INFINITE  # the pace before it was taken, given back if it is the last


def room_wait(ended: deque[Entry], held: float, amount: float, count: float, now: float) -> float:
    """Seconds until ``amount`` fits beside the ``held`` amount of the log (0: now; infinite:
    only an attempt in flight could make the room); ``ended``: the log's ended entries, in
    the order they leave. An amount above the count fits only an empty log."""
    need = held + amount - count
    if need <= 0 or held == 0:
        return 0.0
    for entry in ended:
        need -= entry.amount
        if need <= 0:
            return max(0.0, entry.leaves - now)
    return INFINITE


class WindowLimiter(Protocol):
    """Where a window's log is kept: in this process, or shared (``contrib.redis``)."""

    # How often a waiter looks again when nothing wakes it (``changed``).
    poll: float

    def take(
        self, amount: float, window: Window, turn: object, longest: float
    ) -> tuple[object | None, float]:
        """Let ``amount`` through now if the window and the pace allow and ``turn`` is first
        in line: (its entry, 0). Else (None, the seconds to wait first: infinite while the
        room waits on an attempt in flight or on a turn ahead). ``longest``: how long the
        attempt can last, after which a shared log forgets it (its process may have died)."""
        ...

    def finish(self, entry: object, used: float | None) -> None:
        """The attempt ended now; ``used``: what its answer says it cost, when known."""
        ...

    def cancel(self, entry: object) -> None:
        """The attempt was never sent."""
        ...

    def withdraw(self, turn: object) -> None:
        """``turn`` gave up waiting."""
        ...

    def changed(self) -> threading.Event:
        """An event set at the log's next change (an entry ended, a turn left the line):
        taken before ``take``, it wakes a waiter for a change that came just after."""
        ...


class LocalWindow:
    """A window's log in this process; turns are served first come, first served."""

    poll = POLL_SECONDS

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._in_flight: set[Entry] = set()
        self._ended: deque[Entry] = deque()  # in the order they leave
        self._held = 0.0  # every entry's amount together
        self._paced_until = -INFINITE  # the earliest instant the pace lets the next go
        self._last: Entry | None = None  # the entry taken last
        self._line: deque[object] = deque()
        self._lock = threading.Lock()
        self._changed = threading.Event()

    def take(
        self, amount: float, window: Window, turn: object, longest: float
    ) -> tuple[object | None, float]:
        with self._lock:
            if turn not in self._line:  # (the line is at most the concurrency long)
                self._line.append(turn)
            if self._line[0] is not turn:
                return None, INFINITE
            now = self._clock()
            ended = self._ended
            while ended and ended[0].leaves <= now:
                self._held -= ended.popleft().amount
            wait = max(
                self._paced_until - now, room_wait(ended, self._held, amount, window.count, now)
            )
            if wait > 0:
                return None, wait
            self._line.popleft()
            entry = Entry(amount, window.period, paced_from=self._paced_until)
            self._in_flight.add(entry)
            self._held += amount
            self._paced_until = max(self._paced_until, now) + amount * window.interval
            self._last = entry
            self._wake()
            return entry, 0.0

    def finish(self, entry: object, used: float | None) -> None:
        assert isinstance(entry, Entry)
        with self._lock:
            if entry not in self._in_flight:
                return
            self._in_flight.remove(entry)
            if used is not None and used > entry.amount:
                self._held += used - entry.amount
                entry.amount = used
            entry.leaves = self._clock() + entry.period
            ended = self._ended
            position = len(ended)
            while position and ended[position - 1].leaves > entry.leaves:
                position -= 1  # (only when periods differ: a window whose limit changed)
            ended.insert(position, entry)
            self._wake()

    def cancel(self, entry: object) -> None:
        assert isinstance(entry, Entry)
        with self._lock:
            if entry in self._in_flight:
                self._in_flight.remove(entry)
                self._held -= entry.amount
                if entry is self._last:  # nothing was paced after it: its pace is back too
                    self._paced_until = entry.paced_from
                self._wake()

    def withdraw(self, turn: object) -> None:
        with self._lock:
            if turn in self._line:
                self._line.remove(turn)
                self._wake()

    def changed(self) -> threading.Event:
        return self._changed

    def _wake(self) -> None:
        """(under the lock) Wake every waiter; the next change sets a new event."""
        self._changed.set()
        self._changed = threading.Event()


def enter(
    limiter: WindowLimiter,
    window: Window,
    amount: float,
    *,
    name: str,
    admission: Admission,
    waiting: Waiting,
) -> tuple[object | None, ErrorKind | None]:
    """Wait for ``amount`` of ``window`` as long as the item's allowance leaves: (the entry,
    None), or (None, the kind that ends the item), the reason then in ``admission.why``."""
    turn = object()
    began = waiting.now()
    try:
        while True:
            left, limit = admission.allowance.tightest(waiting.now())
            change = limiter.changed()
            entry, wait = limiter.take(amount, window, turn, max(left, 0.0))
            if entry is not None:
                return entry, None
            if left <= 0 or left <= wait < INFINITE:
                if wait < INFINITE:
                    cause = f"the {name} limit of {window} has room again"
                    admission.why = f"{cause} in {wait:.1f} s, more than the {limit} left"
                return None, limit
            admission.waited = True
            if wait == INFINITE:  # woken by a change, or looking again shortly
                waiting.clock.wait(change, min(left, limiter.poll))
            else:
                waiting.clock.wait(admission.stop, wait)
            if admission.stop.is_set():
                return None, "cancelled"
    finally:
        limiter.withdraw(turn)
        waiting.stats.add(name, waiting.now() - began)


class WindowGate:
    """A window's gate: one unit per attempt (``rate``) or, ``weighed``, the attempt's cost
    (``token_rate``); its hold: the attempt's entry in the log."""

    recheck = False

    def __init__(
        self, name: str, rank: int, limiter: WindowLimiter, window: Window, *, weighed: bool
    ) -> None:
        self.name = name
        self.rank = rank
        self.limiter = limiter
        self.window = window
        self.weighed = weighed

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        amount = admission.cost if self.weighed else 1
        if amount <= 0:
            return None
        entry, refusal = enter(
            self.limiter, self.window, amount, name=self.name, admission=admission, waiting=waiting
        )
        if entry is not None:
            admission.held[self.name] = entry
        return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        entry = admission.held.get(self.name)
        if entry is not None:
            self.limiter.finish(entry, feedback.used if self.weighed else None)

    def abandon(self, admission: Admission) -> None:
        entry = admission.held.pop(self.name, None)
        if entry is not None:
            self.limiter.cancel(entry)
