"""Flow control: today's limits, each a ``Gate`` (see ``gates``), and ``Gates``, which runs
them for each attempt.

Each limit keeps its state behind a small interface with an in-process implementation here;
a shared backend (several processes or machines) implements the same interfaces. ``Gates``
runs them in the design's order — circuit breaker, concurrency slots, cooldown, rate window —
each wait bounded by what is left of the item's budget and the batch deadline.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

from ..core.admission import GLOBAL, Admission, Refusal
from ..core.budget import Allowance
from ..core.clock import SYSTEM, Clock, clock_of
from ..core.verdict import ErrorKind, Feedback
from .announced import AnnouncedCounts
from .gate import POLL_SECONDS, Gate, Waiting, WaitStats
from .window import INFINITE, LocalWindow, Window, WindowGate, WindowLimiter

# (Admission and WaitStats are the gates' own, named here too for the callers of the gates)
__all__ = [
    "GLOBAL",
    "AdaptiveGate",
    "AdaptiveLimit",
    "Admission",
    "Breaker",
    "BreakerBackend",
    "BreakerGate",
    "BreakerState",
    "CircuitBreaker",
    "CooldownBoard",
    "CooldownGate",
    "CooldownScope",
    "Cooldowns",
    "GateOption",
    "Gates",
    "HostSlots",
    "LimitsUnavailable",
    "QuotaGate",
    "Refusal",
    "SharedLimits",
    "SlotGate",
    "SlotPool",
    "WaitStats",
    "build_gates",
]

# closed: go; probe: go, as the one trial of a half-open circuit; open: held until the break
# ends; probing: held while another attempt is the probe.
BreakerState = Literal["closed", "probe", "open", "probing"]
CooldownScope = Literal["host", "global", "off"]
# The cooldown board's key of a host's quota reset (beside its cooldown's, the host itself).
_QUOTA = "quota "
_RESET = "the server's reset is"
_BACKEND_RETRY_SECONDS = 0.5
_WARN_EVERY_SECONDS = 10.0
log = logging.getLogger("batchsync")
# Adaptive concurrency keeps this share of its limit on a congestion signal.
DECREASE = 0.5


class LimitsUnavailable(Exception):
    """A shared limits backend cannot be reached; the gates wait and ask again."""


class SharedLimits(Protocol):
    """A backend that keeps the limits for several processes (see ``shared.RedisLimits``)."""

    def window(self, name: str) -> WindowLimiter:
        """The shared log of the window kept under ``name`` (see ``window``)."""
        ...

    def slots(self, limit: int) -> SlotPool: ...

    def cooldowns(self) -> CooldownBoard: ...

    def breaker(self, settings: Breaker) -> BreakerBackend: ...


class SlotPool(Protocol):
    """At most N attempts in flight per key (a host)."""

    def enter(self, key: str, timeout: float) -> bool:
        """Take a slot for ``key``, waiting up to ``timeout`` seconds; False if none came."""
        ...

    def leave(self, key: str) -> None: ...


class CooldownBoard(Protocol):
    """Times until which attempts to a key are held, as servers asked with Retry-After."""

    def hold(self, key: str, seconds: float) -> None: ...

    def remaining(self, key: str) -> float:
        """Seconds left in the key's cooldown (0 when there is none)."""
        ...


class BreakerBackend(Protocol):
    """A circuit breaker per host (see ``Breaker`` for the semantics)."""

    def check(self, key: str) -> tuple[BreakerState, float]:
        """The host's state and, when ``open``, the seconds left in its break (else 0).

        ``closed``: go; ``probe``: go, as the one trial of a half-open circuit (the caller must
        ``record`` or ``abandon`` it); ``open``: wait for the break to end; ``probing``: another
        attempt is the probe, ask again shortly.
        """
        ...

    def record(self, key: str, failed: bool | None, probe: bool) -> None:
        """What an admitted attempt came to: ``failed`` as ``Feedback.unwell`` says (None: not
        counted)."""
        ...

    def abandon(self, key: str, probe: bool) -> None:
        """An admitted attempt was not sent after all."""
        ...

    @property
    def opened(self) -> int:
        """How many circuits this process saw open."""
        ...


class GateOption(ABC):
    """An option's value that brings a gate of its own: a run's gates include the gate of
    each option holding one (see ``assembly.gates_for``)."""

    @abstractmethod
    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> Gate:
        """The option's gate for a run of ``concurrency`` workers, kept by ``shared`` (several
        processes) when there is a backend and the gate can use it."""


class HostSlots:
    """At most ``limit`` attempts in flight per key; waiters wake as soon as a slot frees."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._in_flight: dict[str, int] = {}
        self._changed = threading.Condition()

    def enter(self, key: str, timeout: float) -> bool:
        with self._changed:
            if not self._changed.wait_for(
                lambda: self._in_flight.get(key, 0) < self._limit, timeout
            ):
                return False
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            return True

    def leave(self, key: str) -> None:
        with self._changed:
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]
            self._changed.notify_all()


class Cooldowns:
    """Cooldown ends per key, in memory."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def hold(self, key: str, seconds: float) -> None:
        with self._lock:
            until = self._clock() + seconds
            if until > self._until.get(key, 0.0):
                self._until[key] = until

    def remaining(self, key: str) -> float:
        until = self._until.get(key)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            with self._lock:
                if self._until.get(key) == until:
                    del self._until[key]
            return 0.0
        return left


@dataclass(frozen=True)
class Breaker:
    """Circuit breaker settings, per host, as resilience4j and Polly define a breaker.

    The circuit opens when at least ``ratio`` of the host's last ``window`` counted attempts
    failed, once it has seen ``min_calls`` of them (a ``min_calls`` above ``window`` acts as
    ``window``). While open, the host's attempts are held — not failed — for ``reset``
    seconds (the break); then exactly one attempt goes through as a probe (half-open): its
    success closes the circuit with a fresh window, its failure starts the break again. See
    ``classify.host_feedback`` for what counts. An item ends ``circuit_open`` only when its
    budget or the batch deadline cannot cover the wait.
    """

    ratio: float = 0.5
    window: int = 100
    min_calls: int = 20
    reset: float = 5.0

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

    def enter(self, timeout: float) -> float | None:
        """Wait up to ``timeout`` for room; the admission time, or None."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._in_flight < self.limit, timeout):
                return None
            self._in_flight += 1
            return self._clock()

    def leave(self, started: float, congested: bool | None) -> None:
        """One attempt done: ``congested`` True or False, or None when it was never sent."""
        with self._changed:
            self._in_flight -= 1
            if congested:
                self._cut(started)
            elif congested is not None:
                self._grow()
            self._changed.notify_all()

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


class BreakerGate:
    """Holds a host's attempts while its circuit is open or another attempt probes it, as a
    cooldown holds; ``circuit_open`` when the item's budget or the deadline cannot cover the
    break. Its hold: True for the attempt that is the probe."""

    name = "breaker"
    rank = 10
    recheck = False

    def __init__(self, backend: BreakerBackend) -> None:
        self.backend = backend
        self.refusals = 0

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        state, wait = self.backend.check(admission.host)
        if state == "closed":  # the healthy path: one lock-free look
            return None
        began = waiting.now()
        try:
            while state != "closed":
                if state == "probe":
                    admission.held["breaker"] = True
                    return None
                left, _ = admission.allowance.tightest(waiting.now())
                if (state == "open" and wait >= left) or (state == "probing" and left <= 0):
                    self.refusals += 1
                    return "circuit_open"
                pause = wait if state == "open" else min(left, POLL_SECONDS)
                if waiting.clock.wait(admission.stop, pause):
                    return "cancelled"
                state, wait = self.backend.check(admission.host)
            return None
        finally:
            waiting.stats.add("breaker", waiting.now() - began)

    def release(self, admission: Admission, feedback: Feedback) -> None:
        self.backend.record(admission.host, feedback.unwell, self.name in admission.held)

    def abandon(self, admission: Admission) -> None:
        if self.name in admission.held:
            self.backend.abandon(admission.host, True)


class AdaptiveGate:
    """The attempts in flight the adaptive limit allows (always this process's own); its
    hold: the instant the attempt was let in."""

    name = "adaptive"
    rank = 20
    recheck = False

    def __init__(self, limit: AdaptiveLimit) -> None:
        self.limit = limit

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        since, refusal = waiting.poll(self.name, self.limit.enter, admission)
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


class SlotGate:
    """At most N attempts in flight per host; its hold: the slot."""

    name = "host_slot"
    rank = 30
    recheck = False

    def __init__(self, slots: SlotPool) -> None:
        self.slots = slots

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        host, slots = admission.host, self.slots
        taken, refusal = waiting.poll(
            self.name, lambda timeout: slots.enter(host, timeout) or None, admission
        )
        if taken:
            admission.held[self.name] = True
        return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        self.abandon(admission)

    def abandon(self, admission: Admission) -> None:
        if admission.held.get(self.name):
            self.slots.leave(admission.host)


class CooldownGate:
    """Holds attempts while a server's Retry-After (a 429 or 503) holds their host, or every
    host (``global``)."""

    name = "cooldown"
    rank = 40
    recheck = True

    def __init__(self, board: CooldownBoard, scope: CooldownScope) -> None:
        self.board = board
        self._global = scope == "global"

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        held = self.board.remaining(GLOBAL if self._global else admission.host)
        return waiting.sleep(self.name, held, admission) if held > 0 else None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        if feedback.hold:
            self.board.hold(GLOBAL if self._global else admission.host, feedback.hold)

    def abandon(self, admission: Admission) -> None:
        """Nothing is held."""


class QuotaGate:
    """Holds a host's attempts until the reset of a quota its headers said is spent (the
    host's own, whatever the cooldown's scope, "off" included: a quota is one host's), and
    each attempt until the host has the requests and tokens it needs, as its provider's
    headers said (``announced.AnnouncedCounts``). Its hold: the mark of what it took."""

    name = "quota"
    rank = 50
    recheck = True

    def __init__(self, board: CooldownBoard, clock: Callable[[], float] = time.monotonic) -> None:
        self.board = board
        self.counts = AnnouncedCounts(clock)

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        host = admission.host
        held = self.board.remaining(_QUOTA + host)
        refusal = waiting.sleep(self.name, held, admission, _RESET) if held > 0 else None
        if refusal is not None or self.name in admission.held:
            return refusal
        while True:
            change = self.counts.changed()
            mark, wait = self.counts.take(host, admission.cost)
            if mark is not None:
                if mark:
                    admission.held[self.name] = mark
                return None
            if wait < INFINITE:
                refusal = waiting.sleep(self.name, wait, admission, _RESET)
            else:  # until an answer to the host tells what is left
                left, limit = admission.allowance.tightest(waiting.now())
                if left <= 0:
                    return limit
                waiting.clock.wait(change, min(left, POLL_SECONDS))
                refusal = "cancelled" if admission.stop.is_set() else None
            if refusal is not None:
                return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        if feedback.quota:
            self.board.hold(_QUOTA + admission.host, feedback.quota)
        mark = admission.held.get(self.name, 0)
        self.counts.ended(
            admission.host,
            mark,
            feedback.announced,
            sent=admission.sent,
            counted=feedback.used is not None,
        )

    def abandon(self, admission: Admission) -> None:
        mark = admission.held.pop(self.name, None)
        if mark is not None:
            self.counts.give_back(admission.host, mark)


class Gates:
    """The gates an attempt passes, by rank (see ``Gate``): ``gates``, and today's limits
    given by their backends — a ``rate``, host ``slots``, ``cooldowns`` (also keeping quota
    resets), a ``breaker``, an ``adaptive`` limit."""

    def __init__(
        self,
        gates: Iterable[Gate] = (),
        *,
        rate: WindowLimiter | None = None,
        rate_window: Window | None = None,
        slots: SlotPool | None = None,
        cooldowns: CooldownBoard | None = None,
        cooldown_scope: CooldownScope = "host",
        breaker: BreakerBackend | None = None,
        adaptive: AdaptiveLimit | None = None,
        clock: Clock | Callable[[], float] = SYSTEM,
    ) -> None:
        self._waiting = Waiting(clock_of(clock))
        given = _limit_gates(
            cooldowns,
            cooldown_scope,
            rate=None if rate is None or rate_window is None else (rate, rate_window),
            slots=slots,
            breaker=breaker,
            adaptive=adaptive,
            clock=self._waiting.now,
        )
        self.gates: list[Gate] = sorted([*given, *gates], key=lambda gate: gate.rank)
        self._now = self._waiting.now
        self.waits = self._waiting.stats
        self._breakers = [gate for gate in self.gates if isinstance(gate, BreakerGate)]
        self._last_warning = float("-inf")

    @property
    def circuits_opened(self) -> int:
        return sum(gate.backend.opened for gate in self._breakers)

    @property
    def circuit_refusals(self) -> int:
        return sum(gate.refusals for gate in self._breakers)

    def admit(
        self, host: str, allowance: Allowance, stop: threading.Event, cost: int = 0
    ) -> Admission | ErrorKind:
        """Wait at each gate; an Admission, or the kind that ends the item instead (see
        ``enter``)."""
        entered = self.enter(host, allowance, stop, cost)
        return entered.kind if isinstance(entered, Refusal) else entered

    def enter(
        self, host: str, allowance: Allowance, stop: threading.Event, cost: int = 0
    ) -> Admission | Refusal:
        """Wait at each gate; an Admission, or the Refusal that ends the item instead (what
        the gates passed hold is given back then).

        While a shared backend cannot be reached, wait and ask again (fail closed): an item
        is never sent without its limits; it ends as ``budget``/``deadline`` if time runs out.
        """
        while True:
            admission = Admission(host, allowance, stop, cost=cost)
            try:
                refusal = self._pass(admission)
            except LimitsUnavailable as exc:
                self.abandon(admission)
                self._unavailable(exc)
                left, limit = allowance.tightest(self._now())
                if left <= _BACKEND_RETRY_SECONDS:
                    return Refusal(limit)
                if self._waiting.clock.wait(stop, _BACKEND_RETRY_SECONDS):
                    return Refusal("cancelled")
                continue
            except BaseException:  # (an interrupt while waiting)
                self.abandon(admission)
                raise
            if refusal is None:
                return admission
            self.abandon(admission)
            return Refusal(refusal, admission.why)

    def _unavailable(self, exc: LimitsUnavailable) -> None:
        now = self._now()
        if now - self._last_warning >= _WARN_EVERY_SECONDS:
            self._last_warning = now
            log.warning("shared limits unavailable, holding attempts until they answer: %s", exc)

    def _pass(self, admission: Admission) -> ErrorKind | None:
        waiting = self._waiting
        for gate in self.gates:
            refusal = gate.admit(admission, waiting)
            if refusal is not None:
                return refusal
            if admission.waited:
                admission.waited = False
                if not gate.recheck:  # a hold may have begun while the attempt waited here
                    refusal = self._recheck(admission, self.gates.index(gate))
                    if refusal is not None:
                        return refusal
        return None

    def _recheck(self, admission: Admission, before: int) -> ErrorKind | None:
        """Pass the gates before ``before`` that hold by time again."""
        for gate in self.gates[:before]:
            if gate.recheck:
                refusal = gate.admit(admission, self._waiting)
                if refusal is not None:
                    return refusal
        admission.waited = False
        return None

    def try_admit(self, host: str) -> Admission | None:
        """Admit an extra request (a hedge) only if every gate has room right now."""
        admitted = self.admit(host, Allowance(self._now()), threading.Event())
        return admitted if isinstance(admitted, Admission) else None

    def abandon(self, admission: Admission) -> None:
        """Give back what an admission held when its attempt never came to a Verdict (a
        refusal at a later gate, an interrupt): its slot, its probe; it tells nothing."""
        for gate in self.gates:
            # A backend that cannot be reached forgets on its own: leases and probes expire.
            with contextlib.suppress(LimitsUnavailable):
                gate.abandon(admission)

    def release(self, admission: Admission, feedback: Feedback) -> None:
        """Give back the slots and tell each limit what the attempt came to. A gate that
        cannot learn from it (a value it cannot use) gives back what it holds instead; the
        others still learn."""
        for gate in self.gates:
            try:
                gate.release(admission, feedback)
            except LimitsUnavailable as exc:  # leases expire; what this attempt taught is lost
                self._unavailable(exc)
            except Exception as exc:
                log.warning("the %s limit could not learn from an answer: %s", gate.name,
                            type(exc).__name__)  # fmt: skip
                log.debug("the %s limit's failure", gate.name, exc_info=True)
                with contextlib.suppress(Exception):
                    gate.abandon(admission)


def _limit_gates(
    cooldowns: CooldownBoard | None,
    cooldown_scope: CooldownScope,
    *,
    rate: tuple[WindowLimiter, Window] | None,
    slots: SlotPool | None,
    breaker: BreakerBackend | None,
    adaptive: AdaptiveLimit | None,
    clock: Callable[[], float],
) -> list[Gate]:
    """Today's limits as gates, one for each backend given; the cooldowns make two, the
    cooldown gate (unless its scope is off) and the quota gate."""
    gates: list[Gate] = []
    if breaker is not None:
        gates.append(BreakerGate(breaker))
    if adaptive is not None:
        gates.append(AdaptiveGate(adaptive))
    if slots is not None:
        gates.append(SlotGate(slots))
    if cooldowns is not None:
        if cooldown_scope != "off":
            gates.append(CooldownGate(cooldowns, cooldown_scope))
        gates.append(QuotaGate(cooldowns, clock))
    if rate is not None:
        gates.append(WindowGate("token", 60, *rate, weighed=False))
    return gates


def build_gates(
    *,
    concurrency: int,
    rate: Window | None,
    per_host: int | None,
    cooldown: CooldownScope,
    breaker: Breaker | None,
    adaptive: bool,
    shared: SharedLimits | None = None,
    more: Iterable[GateOption] = (),
    clock: Clock = SYSTEM,
) -> Gates:
    """The gates for a run's settings, and those of the options in ``more``: in-process, or
    kept by a ``shared`` backend (the adaptive limit is always this process's own)."""
    others = [option.gate(concurrency=concurrency, shared=shared, clock=clock) for option in more]
    adaptive_limit = AdaptiveLimit(concurrency, clock.now) if adaptive else None
    if shared is None:
        return Gates(
            others,
            rate=LocalWindow(clock.now),
            rate_window=rate,
            slots=None if per_host is None else HostSlots(per_host),
            cooldowns=Cooldowns(clock.now),
            cooldown_scope=cooldown,
            breaker=None if breaker is None else CircuitBreaker(breaker, clock.now),
            adaptive=adaptive_limit,
            clock=clock,
        )
    return Gates(
        others,
        rate=shared.window("rate"),
        rate_window=rate,
        slots=None if per_host is None else shared.slots(per_host),
        cooldowns=shared.cooldowns(),
        cooldown_scope=cooldown,
        breaker=None if breaker is None else shared.breaker(breaker),
        adaptive=adaptive_limit,
        clock=clock,
    )
