"""The adaptive limit (``adaptive=True``): the attempts in flight grow while answers come back
well and halve at a sign of congestion, up to the run's concurrency; always this process's own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.verdict import ErrorKind, Feedback
from .gate import GateOption, Waiting
from .shared import SharedLimits

# Adaptive concurrency keeps this share of its limit on a congestion signal.
DECREASE = 0.5


@dataclass(frozen=True)
class Adaptive(GateOption):
    """``adaptive=True``: an ``AdaptiveLimit`` up to the run's concurrency, kept in this process
    even when other limits are shared (congestion is what this process's attempts meet)."""

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> AdaptiveGate:
        return AdaptiveGate(AdaptiveLimit(concurrency, clock.now))


class AdaptiveLimit:
    """Additive increase, multiplicative decrease of the attempts in flight, from 1 to ``ceiling``.

    Starts at 1 and grows by one per success (slow start) until the first congestion signal
    (429, 503, timeout); then it halves on congestion — at most once per round of attempts —
    and grows by one after each ``limit`` successes.
    """

    def __init__(self, ceiling: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ceiling = ceiling
        self._clock = clock
        self.limit = 1
        self._in_flight = 0
        self._successes = 0
        self._slow_start = True
        self._last_cut = float("-inf")
        self._changed = threading.Condition()

    def enter(self, timeout: float, stop: threading.Event | None = None) -> float | None:
        """Room now, or after one wait of at most ``timeout``: the admission time, or None
        (none came, or the wait was woken for another reason: the caller looks again).
        ``stop`` is looked at under the lock ``wake`` takes: a stop's wake-up is never lost."""
        with self._changed:
            if self._in_flight >= self.limit:
                if stop is not None and stop.is_set():
                    return None
                self._changed.wait(timeout)
                if self._in_flight >= self.limit:
                    return None
            self._in_flight += 1
            return self._clock()

    def wake(self) -> None:
        """End every ``enter`` waiting now, for the run's stop."""
        with self._changed:
            self._changed.notify_all()

    def leave(self, started: float, congested: bool | None) -> None:
        """One attempt done: ``congested`` True or False, or None when it was never sent."""
        with self._changed:
            self._in_flight -= 1
            if congested:
                self._cut(started)
            elif congested is not None:
                self._grow()
            # (as many waiters as there is room for: waking every waiter, each to find the
            # room taken, cost more CPU than the requests at high concurrency)
            self._changed.notify(max(0, self.limit - self._in_flight))

    def _cut(self, started: float) -> None:
        # React once per round: signals from attempts sent before the last cut describe
        # the old limit.
        if started >= self._last_cut:
            self.limit = max(1, int(self.limit * DECREASE))
            self._slow_start = False
            self._successes = 0
            self._last_cut = self._clock()

    def _grow(self) -> None:
        self._successes += 1
        if self._slow_start or self._successes >= self.limit:
            self.limit = min(self._ceiling, self.limit + 1)
            self._successes = 0


@dataclass(eq=False)
class AdaptiveGate:
    """The attempts in flight the adaptive limit allows (always this process's own); its
    hold: the instant the attempt was let in."""

    limit: AdaptiveLimit
    name = "adaptive"
    rank = 20
    recheck = False

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        since, refusal = waiting.poll(
            self.name,
            lambda timeout: self.limit.enter(timeout, admission.stop),
            admission,
            wake=self.limit.wake,
        )
        if refusal is None:
            admission.held[self.name] = since
        return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        since = admission.held.get(self.name)
        if since is not None:
            self.limit.leave(since, feedback.congested)

    def abandon(self, admission: Admission) -> None:
        since = admission.held.get(self.name)
        if since is not None:
            self.limit.leave(since, congested=None)
