"""The rate window (``rate``, one per attempt: ``RateWindow``), and the window gate that the
token budget (``token_rate``) and the provider's announced limits (``rate="auto"``) hold theirs
with: a limit of N per period that holds over every window of that period as servers count it.

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
used: a server may count what was asked for (OpenAI counts ``max_tokens``), never less. An
output side's entry (``output_token_rate``) keeps what was used, as Anthropic counts it, and
gives back the pace it took for the rest: sends are paced by what answers make.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.stop import woken_by
from ..core.verdict import ErrorKind, Feedback, TokenSide
from .gate import POLL_SECONDS, GateOption, Waiting
from .rates import Window
from .shared import SharedLimits, WindowLimiter

INFINITE = math.inf
# The side a provider counts as used, not as asked for: Anthropic takes a request's output
# tokens at its max_tokens when it admits it and sets them to those made when it ends.
EXACT_SIDE = "output"
# How late a paced send may come and keep the pace's schedule: a thread's wake-up, no more.
WAKE_SLACK = 0.002


@dataclass(eq=False, slots=True)
class Entry:
    """One attempt's amount in a log, leaving it ``period`` after the attempt ends (``leaves``
    is infinite while it is in flight)."""

    amount: float
    period: float
    leaves: float = INFINITE
    paced_from: float = -INFINITE  # the pace before it was taken, given back if it is the last
    interval: float = 0.0  # the pace's seconds a unit of its amount


def paced_from(paced_until: float, now: float) -> float:
    """Where the next send's pace starts: on schedule when this one came at most
    ``WAKE_SLACK`` late (a waiter's wake-up, which would otherwise add to every gap and keep a
    run 2 % under its rate), else now (after a quiet spell: no burst)."""
    return paced_until if now - paced_until <= WAKE_SLACK else max(paced_until, now)


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


class LocalWindow:
    """A window's log in this process; turns are served first come, first served.

    Quiet: only the waiter first in line is woken, when it becomes first or when the log
    changes (an entry ended or was taken back, the limit changed); the others sleep until
    their turn comes. Waking every waiter at each change cost more CPU than the requests
    (8.5 ms a request at concurrency 256) and, without the GIL, kept the cores busy.
    """

    # (every change wakes the waiter it may let go: the look again is only a safety net)
    poll = 30.0

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._in_flight: set[Entry] = set()
        self._ended: deque[Entry] = deque()  # in the order they leave
        self._held = 0.0  # every entry's amount together
        self._paced_until = -INFINITE  # the earliest instant the pace lets the next go
        self._last: Entry | None = None  # the entry taken last
        self._line: deque[threading.Event] = deque()
        # Whether the waiter first in line waits for room only an attempt's end can make (then
        # an end wakes it; one told to wait for the pace is not woken early for nothing).
        self._first_waits_room = True
        self._lock = threading.Lock()

    def take(
        self, amount: float, window: Window, turn: threading.Event, longest: float
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
                self._first_waits_room = wait == INFINITE
                return None, wait
            self._line.popleft()
            entry = Entry(
                amount, window.period, paced_from=self._paced_until, interval=window.interval
            )
            self._in_flight.add(entry)
            self._held += amount
            self._paced_until = paced_from(self._paced_until, now) + amount * window.interval
            self._last = entry
            self._wake_first()
            return entry, 0.0

    def finish(self, entry: object, used: float | None, *, exact: bool = False) -> None:
        assert isinstance(entry, Entry)
        with self._lock:
            if entry not in self._in_flight:
                return
            self._in_flight.remove(entry)
            wake = self._first_waits_room
            if used is not None and (used > entry.amount or exact):
                self._held += used - entry.amount
                if used < entry.amount:  # (the pace it took for what it did not use, back)
                    self._paced_until -= (entry.amount - used) * entry.interval
                    wake = True
                entry.amount = used
            entry.leaves = self._clock() + entry.period
            ended = self._ended
            position = len(ended)
            while position and ended[position - 1].leaves > entry.leaves:
                position -= 1  # (only when periods differ: a window whose limit changed)
            ended.insert(position, entry)
            if wake:
                self._wake_first()

    def cancel(self, entry: object) -> None:
        assert isinstance(entry, Entry)
        with self._lock:
            if entry in self._in_flight:
                self._in_flight.remove(entry)
                self._held -= entry.amount
                if entry is self._last:  # nothing was paced after it: its pace is back too
                    self._paced_until = entry.paced_from
                self._wake_first()

    def withdraw(self, turn: threading.Event) -> None:
        with self._lock:
            if self._line and self._line[0] is turn:
                self._line.popleft()
                self._wake_first()
            elif turn in self._line:
                self._line.remove(turn)

    def recheck(self) -> None:
        with self._lock:
            self._wake_first()

    def queued(self) -> bool:
        return bool(self._line)  # (a deque's length, read in one step)

    def _wake_first(self) -> None:
        """(under the lock) Wake the waiter first in line, if any: only it may go."""
        if self._line:
            self._first_waits_room = True  # (until it looks: it may)
            self._line[0].set()


def enter(
    limiter: WindowLimiter,
    window_now: Callable[[], Window],
    amount: float,
    *,
    name: str,
    admission: Admission,
    waiting: Waiting,
) -> tuple[object | None, ErrorKind | None]:
    """Wait for ``amount`` of the window ``window_now`` gives (read at each look: an announced
    limit may change meanwhile), at most its whole count, as long as the item's allowance
    leaves: (the entry, None), or (None, the kind that ends the item), the reason then in
    ``admission.why``. An entry taken while other turns wait in line behind it marks the
    admission ``held_back``: the window, not the workers, sets the pace."""
    turn = threading.Event()  # (set by the limiter when this waiter may go, or by the stop)
    began = waiting.now()
    try:
        with woken_by(admission.stop, turn.set) as stop_wakes:
            while True:
                turn.clear()  # (before the stop is looked at: a stop's wake after it is kept)
                if admission.stop.is_set():
                    return None, "cancelled"
                left, limit = admission.allowance.tightest(waiting.now())
                window = window_now()
                entry, wait = limiter.take(min(amount, window.count), window, turn, max(left, 0.0))
                if entry is not None:
                    admission.held_back = admission.held_back or limiter.queued()
                    return entry, None
                if left <= 0 or left <= wait < INFINITE:
                    if wait < INFINITE:
                        cause = f"the {name} limit of {window} has room again"
                        admission.why = f"{cause} in {wait:.1f} s, more than the {limit} left"
                    return None, limit
                admission.waited = True
                seconds = min(left, limiter.poll) if wait == INFINITE else wait
                if not stop_wakes:  # (a stop that cannot wake it: looked at now and then)
                    seconds = min(seconds, POLL_SECONDS)
                waiting.clock.wait(turn, seconds)  # (a stop is looked at above)
    finally:
        limiter.withdraw(turn)
        waiting.stats.add(name, waiting.now() - began)


def given_back(limiter: WindowLimiter, entry: object, admission: Admission) -> None:
    """An entry whose attempt came to no answer the limits could read: taken back when it was
    never sent; when it was, still counted at what it took (the server may have counted it),
    leaving a period from now."""
    if admission.sent is None:
        limiter.cancel(entry)
    else:
        limiter.finish(entry, None)


@dataclass(eq=False)
class WindowGate:
    """A window's gate: one unit per attempt (``rate``) or, ``weighs`` a side, the attempt's
    tokens of it (``token_rate`` and its input and output kin); its hold: the attempt's entry
    in the log."""

    name: str
    rank: int
    limiter: WindowLimiter
    window: Window
    weighs: TokenSide | None = field(kw_only=True)
    recheck = False

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        amount = 1 if self.weighs is None else admission.weight(self.weighs)
        if amount <= 0:
            return None
        window = self.window
        entry, refusal = enter(
            self.limiter, lambda: window, amount, name=self.name, admission=admission,
            waiting=waiting,
        )  # fmt: skip
        if entry is not None:
            admission.held[self.name] = entry
        return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        entry = admission.held.get(self.name)
        if entry is not None:
            weighs = self.weighs
            used = None if weighs is None else feedback.used_of(weighs)
            self.limiter.finish(entry, used, exact=weighs == EXACT_SIDE)

    def abandon(self, admission: Admission) -> None:
        entry = admission.held.pop(self.name, None)
        if entry is not None:
            given_back(self.limiter, entry, admission)


@dataclass(frozen=True)
class RateWindow(GateOption):
    """``rate``: at most ``window.count`` attempts in any ``window.period`` over all workers
    (and all processes sharing ``--redis``)."""

    window: Window

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> WindowGate:
        return self.kept_in(LocalWindow(clock.now) if shared is None else shared.window("rate"))

    def kept_in(self, limiter: WindowLimiter) -> WindowGate:
        """The rate's gate, its log kept in ``limiter``."""
        return WindowGate("rate", 60, limiter, self.window, weighs=None)
