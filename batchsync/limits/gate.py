"""What a limit is to the gates: one ``Gate`` an attempt passes before it is sent, and hears
from after, built by the ``GateOption`` that is its option's value (see ``gates.Gates``, which
runs them, and ``run.assembly.gates_for``, which lists a run's options).

A gate admits one attempt at a time — waiting, if it must, only as long as the item's
allowance leaves and until the run stops — and keeps in the attempt's ``Admission`` what it
took (a slot, a probe, a token), to give it back on ``release`` (with what the attempt told,
its ``Feedback``) or ``abandon`` (the attempt was never sent). A new kind of limit is one
module holding its gate, its ``GateOption`` and its in-process state (``breaker`` is one),
and one line in ``gates_for``.
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.stop import woken_by
from ..core.verdict import ErrorKind, Feedback
from .shared import SharedLimits

# How often a gate looks again for what nothing wakes it for (room, a probe that ended).
POLL_SECONDS = 0.05
# The longest round of a wait that is woken when its turn comes and on a stop (a safety net).
QUIET_ROUND_SECONDS = 30.0


T = TypeVar("T")


class Gate(Protocol):
    """One limit. ``rank`` places it among the others, lowest first: the breaker 10, the
    adaptive limit 20, host slots 30, the cooldown 40, a quota's reset 50, the rate window 60,
    the provider's announced budgets 62, the token budget 65.
    ``recheck``: it holds nothing and only makes attempts wait for a time that may begin at
    any moment (a cooldown): passed again after a later gate, not such a one, made the
    attempt wait (a hold may have begun meanwhile).

    A weighted limit (a budget of tokens per item) reserves the attempt's cost in ``admit``
    and sets it right in ``release`` from what the attempt reports; ``Admission`` is where
    the cost travels."""

    name: str
    rank: int
    recheck: bool

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        """Let the attempt through (None), keeping in ``admission.held[name]`` what it took,
        or the kind that ends the item instead (holding nothing then). Waits go through
        ``waiting``; a shared backend that cannot answer raises ``LimitsUnavailable``."""

    def release(self, admission: Admission, feedback: Feedback) -> None:
        """The attempt came to ``feedback``: give back what it held, learn from it (a weighted
        cost is reconciled here, with what the attempt really cost)."""

    def abandon(self, admission: Admission) -> None:
        """The attempt was never sent (a later gate refused it, an interrupt): give back what
        it held; it tells nothing."""


class GateOption(ABC):
    """An option's value that brings a gate of its own (``Breaker()``, ``TokenRate``, …): a
    run's gates are those of the options ``run.assembly.gates_for`` lists."""

    @abstractmethod
    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> Gate:
        """The option's gate for a run of ``concurrency`` workers, kept by ``shared`` (several
        processes) when there is a backend and the gate can use it."""


@dataclass
class WaitStats:
    """Seconds spent waiting at each gate, summed over all attempts; ``timeline`` the same
    by (gate, unix second), the seconds of each wait that fell in that second (the report's
    chart of waits over time: a few dict updates per wait, none per attempt that passes)."""

    seconds: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    timeline: dict[tuple[str, int], float] = field(default_factory=dict, repr=False)

    def add(self, gate: str, seconds: float) -> None:
        if seconds > 0:
            ended = time.time()
            with self.lock:
                self.seconds[gate] = self.seconds.get(gate, 0.0) + seconds
                begun = ended - seconds
                second = math.floor(begun)
                while second < ended:
                    part = min(ended, second + 1) - max(begun, second)
                    key = (gate, second)
                    self.timeline[key] = self.timeline.get(key, 0.0) + part
                    second += 1


@dataclass(frozen=True)
class Hold:
    """A gate holding a host's attempts right now: how many, and for how long without a
    break (``HeldNow.longest``)."""

    gate: str
    host: str
    attempts: int
    seconds: float


class HeldNow:
    """The hosts each gate holds attempts of right now, and since when: what the progress
    line names when a gate holds the run. Only a wait that begins touches it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, str], list[float]] = {}  # (gate, host): [attempts, since]

    def begin(self, gate: str, host: str, now: float) -> tuple[str, str]:
        key = (gate, host)
        with self._lock:
            entry = self._held.setdefault(key, [0, now])
            entry[0] += 1
        return key

    def end(self, key: tuple[str, str]) -> None:
        with self._lock:
            entry = self._held[key]
            entry[0] -= 1
            if not entry[0]:
                del self._held[key]

    def longest(self, now: float) -> Hold | None:
        """The hold that has lasted longest (None: nothing is held)."""
        with self._lock:
            if not self._held:
                return None
            (gate, host), (attempts, since) = min(self._held.items(), key=lambda kv: kv[1][1])
        return Hold(gate, host, int(attempts), now - since)


class Waiting:
    """The waits a gate makes: each bounded by what is left of the item's allowance, ended
    by the run's stop, measured on the clock and counted in ``stats`` under the gate's name;
    ``held_now`` the holds going on."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.now = clock.now
        self.stats = WaitStats()
        self.held_now = HeldNow()

    @contextmanager
    def holding(self, gate: str, admission: Admission) -> Iterator[None]:
        """A hold of the attempt's host by ``gate`` while the block runs (see ``held_now``)."""
        admission.waited = True
        admission.holding()
        key = self.held_now.begin(gate, admission.host, self.now())
        try:
            yield
        finally:
            self.held_now.end(key)

    def sleep(
        self, gate: str, seconds: float, admission: Admission, cause: str | None = None
    ) -> ErrorKind | None:
        """Wait ``seconds`` (none when 0 or less); the kind that ends the item when its
        allowance cannot cover them or the run stops meanwhile. ``cause``: what the wait is
        for, said in ``admission.why`` when it is longer than the allowance."""
        if seconds <= 0:
            return None
        left, limit = admission.allowance.tightest(self.now())
        if seconds >= left:
            if cause is not None:
                admission.why = f"{cause} in {seconds:.1f} s, more than the {limit} left"
            return limit
        with self.holding(gate, admission):
            if self.clock.wait(admission.stop, seconds):
                return "cancelled"
        self.stats.add(gate, seconds)
        return None

    def poll(
        self,
        gate: str,
        attempt: Callable[[float], T | None],
        admission: Admission,
        *,
        wake: Callable[[], None] | None = None,
    ) -> tuple[T | None, ErrorKind | None]:
        """Call ``attempt(timeout)`` in short rounds until it gives a value or time runs out.

        ``wake``: ends every ``attempt`` waiting, called on the run's stop; with it, a round
        lasts until the attempt's own wake-up (its turn came) rather than ``POLL_SECONDS``.
        """
        if wake is None:
            return self._rounds(gate, attempt, admission, POLL_SECONDS)
        with woken_by(admission.stop, wake) as stop_wakes:
            rounds = QUIET_ROUND_SECONDS if stop_wakes else POLL_SECONDS
            return self._rounds(gate, attempt, admission, rounds)

    def _rounds(
        self, gate: str, attempt: Callable[[float], T | None], admission: Admission, rounds: float
    ) -> tuple[T | None, ErrorKind | None]:
        began = self.now()
        # A first look that does not wait (a wait is one the gate says it made), then rounds.
        value, refusal = self._round(attempt, admission, 0.0)
        if value is not None or refusal is not None:
            return value, refusal
        with self.holding(gate, admission):
            while True:
                value, refusal = self._round(attempt, admission, rounds)
                if value is not None:
                    self.stats.add(gate, self.now() - began)
                if value is not None or refusal is not None:
                    return value, refusal

    def _round(
        self, attempt: Callable[[float], T | None], admission: Admission, timeout: float
    ) -> tuple[T | None, ErrorKind | None]:
        """One look, waiting at most ``timeout`` within the allowance: a value, or the kind
        that ends the item, or neither (look again)."""
        left, limit = admission.allowance.tightest(self.now())
        if admission.stop.is_set():
            return None, "cancelled"
        value = attempt(max(0.0, min(left, timeout)))
        if value is None and left <= 0:
            return None, limit
        return value, None
