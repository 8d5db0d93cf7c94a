"""The circuit breaker (``breaker=Breaker(…)``): a host whose attempts keep failing is held
for a while, then tried again with one probe.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.verdict import ErrorKind, Feedback
from .gate import POLL_SECONDS, GateOption, Waiting
from .shared import BreakerBackend, BreakerSettings, BreakerState, SharedLimits


@dataclass(frozen=True)
class Breaker(BreakerSettings, GateOption):
    """Circuit breaker settings, per host, as resilience4j and Polly define a breaker.

    The circuit opens when at least ``ratio`` of the host's last ``window`` counted attempts
    failed, once it has seen ``min_calls`` of them (a ``min_calls`` above ``window`` acts as
    ``window``). While open, the host's attempts are held — not failed — for ``reset``
    seconds (the break); then exactly one attempt goes through as a probe (half-open): its
    success closes the circuit with a fresh window, its failure starts the break again. See
    ``classify.host_feedback`` for what counts. An item ends ``circuit_open`` only when its
    budget or the batch deadline cannot cover the wait.
    """

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and 0 < self.ratio <= 1):
            raise ValueError(f"breaker ratio must be above 0 and at most 1, got {self.ratio}")
        for name in ("window", "min_calls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"breaker {name} must be a whole number >= 1, got {value}")
        if not (math.isfinite(self.reset) and self.reset > 0):
            raise ValueError(f"breaker reset must be a positive number, got {self.reset}")

    @property
    def threshold_calls(self) -> int:
        """The attempts a window must hold before the ratio can open the circuit."""
        return min(self.min_calls, self.window)

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> BreakerGate:
        backend = CircuitBreaker(self, clock.now) if shared is None else shared.breaker(self)
        return BreakerGate(backend)


_CLOSED: tuple[BreakerState, float] = ("closed", 0.0)


@dataclass
class _Circuit:
    """A host whose window holds a failure, or whose circuit is open (``open_until``)."""

    calls: deque[bool]  # the last counted attempts, oldest first: True for a failure
    failures: int = 0
    open_until: float | None = None
    probing: bool = False


class CircuitBreaker:
    """The in-process breaker (see ``Breaker``).

    A host whose window holds no failure is only a count of successes, kept without a lock;
    a lock guards the hosts with a failure in their window or an open circuit.
    """

    def __init__(
        self, settings: Breaker | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or Breaker()
        self._clock = clock
        self._circuits: dict[str, _Circuit] = {}
        self._healthy: dict[str, int] = {}  # successes in the window of a host with no circuit
        self._lock = threading.Lock()
        self.opened = 0

    def check(self, key: str) -> tuple[BreakerState, float]:
        if key not in self._circuits:  # the healthy path takes no lock
            return _CLOSED
        with self._lock:
            circuit = self._circuits.get(key)
            if circuit is None or circuit.open_until is None:
                return _CLOSED
            left = circuit.open_until - self._clock()
            if left > 0:
                return "open", left
            if circuit.probing:
                return "probing", 0.0
            circuit.probing = True
            return "probe", 0.0

    def record(self, key: str, failed: bool | None, probe: bool) -> None:
        if probe:
            self._probed(key, failed)
            return
        if failed is None:
            return
        window = self.settings.window
        if not failed and key not in self._circuits:
            # Without the lock a success may be lost in a race: the count only fills a window.
            self._healthy[key] = min(self._healthy.get(key, 0) + 1, window)
            return
        with self._lock:
            circuit = self._circuits.get(key)
            if circuit is None:
                if not failed:
                    self._healthy[key] = min(self._healthy.get(key, 0) + 1, window)
                    return
                successes = [False] * self._healthy.pop(key, 0)
                circuit = self._circuits[key] = _Circuit(deque(successes, maxlen=window))
            if circuit.open_until is not None:
                return  # attempts sent before it opened: only the probe speaks now
            self._counted(key, circuit, failed)

    def _counted(self, key: str, circuit: _Circuit, failed: bool) -> None:
        """One attempt into the window of a closed circuit (under the lock): once no failure
        is left in it the host is a count of successes again; once enough attempts failed
        (see ``Breaker``) the circuit opens."""
        if len(circuit.calls) == self.settings.window and circuit.calls[0]:
            circuit.failures -= 1
        circuit.calls.append(failed)
        circuit.failures += failed
        calls = len(circuit.calls)
        if not circuit.failures:  # the last failure slid out of the window
            del self._circuits[key]
            self._healthy[key] = calls
        elif calls >= self.settings.threshold_calls and (
            circuit.failures >= self.settings.ratio * calls
        ):
            circuit.open_until = self._clock() + self.settings.reset
            circuit.calls.clear()
            circuit.failures = 0
            self.opened += 1

    def _probed(self, key: str, failed: bool | None) -> None:
        with self._lock:
            circuit = self._circuits.get(key)
            if circuit is None:
                return
            circuit.probing = False
            if failed:  # the host is still unwell: another break
                circuit.open_until = self._clock() + self.settings.reset
            elif failed is not None:  # closed, with a fresh window that starts with the probe
                del self._circuits[key]
                self._healthy[key] = 1
            # not counted (a 429 with Retry-After, a cut attempt): the next caller probes

    def abandon(self, key: str, probe: bool) -> None:
        if probe:
            self._probed(key, None)


@dataclass(eq=False)
class BreakerGate:
    """Holds a host's attempts while its circuit is open or another attempt probes it, as a
    cooldown holds; ``circuit_open`` when the item's budget or the deadline cannot cover the
    break. Its hold: True for the attempt that is the probe. ``refusals``: the items it ended."""

    backend: BreakerBackend
    refusals: int = field(default=0, init=False)
    # (`+=` is a read and a write: on a free-threaded build two refusals at once could count one)
    _counting: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    name = "breaker"
    rank = 10
    recheck = False

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        state, wait = self.backend.check(admission.host)
        if state == "closed":  # the healthy path: one lock-free look
            return None
        began = waiting.now()
        try:
            refusal = self._refusal(state, wait, admission, waiting.now())
            if state == "probe" or refusal is not None:
                return refusal
            with waiting.holding(self.name, admission):
                return self._held(state, wait, admission, waiting)
        finally:
            waiting.stats.add("breaker", waiting.now() - began)

    def _held(
        self, state: BreakerState, wait: float, admission: Admission, waiting: Waiting
    ) -> ErrorKind | None:
        """Wait while the circuit is open or another attempt probes it; then go (as the probe,
        or the circuit closed), or end the item as ``_refusal`` says."""
        while True:
            left, _ = admission.allowance.tightest(waiting.now())
            pause = wait if state == "open" else min(left, POLL_SECONDS)
            if waiting.clock.wait(admission.stop, pause):
                return "cancelled"
            state, wait = self.backend.check(admission.host)
            refusal = self._refusal(state, wait, admission, waiting.now())
            if state in ("closed", "probe") or refusal is not None:
                return refusal

    def _refusal(
        self, state: BreakerState, wait: float, admission: Admission, now: float
    ) -> ErrorKind | None:
        """``circuit_open`` when the item's budget or the deadline cannot cover the break (or
        the probe another attempt makes); the probe is taken here (``held``)."""
        if state == "probe":
            admission.held["breaker"] = True
            return None
        left, _ = admission.allowance.tightest(now)
        if (state == "open" and wait >= left) or (state == "probing" and left <= 0):
            with self._counting:
                self.refusals += 1
            return "circuit_open"
        return None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        self.backend.record(admission.host, feedback.unwell, self.name in admission.held)

    def abandon(self, admission: Admission) -> None:
        if self.name in admission.held:
            self.backend.abandon(admission.host, True)
