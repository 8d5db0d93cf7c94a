"""Flow control: what an attempt must pass before it is sent, and what it tells on the way back.

Each limit is a small interface with an in-process implementation here; a shared backend
(several processes or machines) implements the same interfaces. ``Gates`` runs them in the
design's order — circuit breaker, concurrency slots, cooldown, rate token — each wait bounded
by what is left of the item's budget and the batch deadline.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from .budget import Allowance
from .verdict import ErrorKind, Feedback

# closed: go; probe: go, as the one trial of a half-open circuit; open: held until the break
# ends; probing: held while another attempt is the probe.
BreakerState = Literal["closed", "probe", "open", "probing"]
CooldownScope = Literal["host", "global", "off"]
GLOBAL = "*"
# The cooldown board's key of a host's quota reset (beside its cooldown's, the host itself).
_QUOTA = "quota "
_POLL_SECONDS = 0.05
_BACKEND_RETRY_SECONDS = 0.5
_WARN_EVERY_SECONDS = 10.0
log = logging.getLogger("batchsync")
# Adaptive concurrency keeps this share of its limit on a congestion signal.
DECREASE = 0.5
T = TypeVar("T")


class LimitsUnavailable(Exception):
    """A shared limits backend cannot be reached; the gates wait and ask again."""


class SharedLimits(Protocol):
    """A backend that keeps the limits for several processes (see ``shared.RedisLimits``)."""

    def token_bucket(self, rate: float, burst: int) -> RateLimiter: ...

    def slots(self, limit: int) -> SlotPool: ...

    def cooldowns(self) -> CooldownBoard: ...

    def breaker(self, settings: Breaker) -> BreakerBackend: ...


class RateLimiter(Protocol):
    """A token bucket shared by every worker: each attempt takes one token."""

    def reserve(self) -> float:
        """Take a token; the seconds to wait before it may be used."""
        ...

    def refund(self) -> None:
        """Give back a reserved token that will not be used."""
        ...


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


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up: no 1-s window sees more than
    rate + burst attempts, and a long run averages the rate."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._updated = clock()

    def reserve(self) -> float:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._updated) * self._rate)
            self._updated = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self._rate

    def refund(self) -> None:
        with self._lock:
            self._tokens = min(self._burst, self._tokens + 1.0)


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
            if len(circuit.calls) == window and circuit.calls[0]:
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


@dataclass
class Admission:
    """An attempt let through the gates; handed back to ``Gates.release`` afterwards."""

    host: str
    probe: bool
    slot: bool
    adaptive_since: float | None


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


class Gates:
    """The limits an attempt passes, in order; see the module docstring."""

    def __init__(
        self,
        *,
        rate: RateLimiter | None = None,
        slots: SlotPool | None = None,
        cooldowns: CooldownBoard | None = None,
        cooldown_scope: CooldownScope = "host",
        breaker: BreakerBackend | None = None,
        adaptive: AdaptiveLimit | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rate = rate
        self._slots = slots
        self._cooldowns = None if cooldown_scope == "off" else cooldowns
        # (a quota's reset holds its host whatever the cooldown's scope, "off" included)
        self._quotas = cooldowns
        self._scope = cooldown_scope
        self._breaker = breaker
        self._adaptive = adaptive
        self._clock = clock
        self.waits = WaitStats()
        self.circuit_refusals = 0
        self._last_warning = float("-inf")

    @property
    def circuits_opened(self) -> int:
        return 0 if self._breaker is None else self._breaker.opened

    def _cooldown_key(self, host: str) -> str:
        return GLOBAL if self._scope == "global" else host

    def admit(
        self, host: str, allowance: Allowance, stop: threading.Event
    ) -> Admission | ErrorKind:
        """Wait at each gate; an Admission, or the kind that ends the item instead.

        While a shared backend cannot be reached, wait and ask again (fail closed): an item
        is never sent without its limits; it ends as ``budget``/``deadline`` if time runs out.
        """
        while True:
            try:
                return self._admit_once(host, allowance, stop)
            except LimitsUnavailable as exc:
                self._unavailable(exc)
                left, limit = allowance.tightest(self._clock())
                if left <= _BACKEND_RETRY_SECONDS:
                    return limit
                if stop.wait(_BACKEND_RETRY_SECONDS):
                    return "cancelled"

    def _unavailable(self, exc: LimitsUnavailable) -> None:
        now = self._clock()
        if now - self._last_warning >= _WARN_EVERY_SECONDS:
            self._last_warning = now
            log.warning("shared limits unavailable, holding attempts until they answer: %s", exc)

    def _admit_once(
        self, host: str, allowance: Allowance, stop: threading.Event
    ) -> Admission | ErrorKind:
        probe = False
        if self._breaker is not None:
            held = self._through_breaker(self._breaker, host, allowance, stop)
            if isinstance(held, str):
                return held
            probe = held
        admission = Admission(host, probe, slot=False, adaptive_since=None)
        try:
            refusal = self._pass(admission, allowance, stop)
        except BaseException:  # (the backend gone, or an interrupt while waiting)
            self.abandon(admission)
            raise
        if refusal is not None:
            self.abandon(admission)
            return refusal
        return admission

    def _through_breaker(
        self, breaker: BreakerBackend, host: str, allowance: Allowance, stop: threading.Event
    ) -> bool | ErrorKind:
        """Hold while the host's circuit is open or another attempt probes it, as a cooldown
        holds; True when this attempt is the probe. ``circuit_open`` when the item's budget or
        the deadline cannot cover the break."""
        state, wait = breaker.check(host)
        if state == "closed":  # the healthy path: one lock-free look
            return False
        began = self._clock()
        try:
            while state != "closed":
                if state == "probe":
                    return True
                left, _ = allowance.tightest(self._clock())
                if (state == "open" and wait >= left) or (state == "probing" and left <= 0):
                    self.circuit_refusals += 1
                    return "circuit_open"
                if stop.wait(wait if state == "open" else min(left, _POLL_SECONDS)):
                    return "cancelled"
                state, wait = breaker.check(host)
            return False
        finally:
            self.waits.add("breaker", self._clock() - began)

    def try_admit(self, host: str) -> Admission | None:
        """Admit an extra request (a hedge) only if every gate has room right now."""
        admitted = self.admit(host, Allowance(self._clock()), threading.Event())
        return admitted if isinstance(admitted, Admission) else None

    def _pass(
        self, admission: Admission, allowance: Allowance, stop: threading.Event
    ) -> ErrorKind | None:
        if self._adaptive is not None:
            since, refusal = self._wait_for("adaptive", self._adaptive.enter, allowance, stop)
            if refusal is not None:
                return refusal
            admission.adaptive_since = since
        if self._slots is not None:
            slots = self._slots
            taken, refusal = self._wait_for(
                "host_slot", lambda t: slots.enter(admission.host, t) or None, allowance, stop
            )
            if refusal is not None:
                return refusal
            admission.slot = bool(taken)
        refusal = self._cooled_down(admission.host, allowance, stop)
        if refusal is not None:
            return refusal
        if self._rate is not None:
            waited = self._rate.reserve()
            refusal = self._sleep("token", waited, allowance, stop)
            if refusal is not None:
                self._rate.refund()
                return refusal
            if waited > 0:  # a cooldown may have begun while this attempt waited its turn
                refusal = self._cooled_down(admission.host, allowance, stop)
                if refusal is not None:
                    self._rate.refund()
                return refusal
        return None

    def _cooled_down(
        self, host: str, allowance: Allowance, stop: threading.Event
    ) -> ErrorKind | None:
        """Wait out the host's cooldown, then its quota's reset (the host's own, whatever
        the cooldown's scope: a quota is one host's)."""
        if self._cooldowns is not None:
            held = self._cooldowns.remaining(self._cooldown_key(host))
            refusal = self._sleep("cooldown", held, allowance, stop)
            if refusal is not None:
                return refusal
        if self._quotas is None:
            return None
        return self._sleep("quota", self._quotas.remaining(_QUOTA + host), allowance, stop)

    def _sleep(
        self, gate: str, seconds: float, allowance: Allowance, stop: threading.Event
    ) -> ErrorKind | None:
        if seconds <= 0:
            return None
        left, limit = allowance.tightest(self._clock())
        if seconds >= left:
            return limit
        if stop.wait(seconds):
            return "cancelled"
        self.waits.add(gate, seconds)
        return None

    def _wait_for(
        self,
        gate: str,
        attempt: Callable[[float], T | None],
        allowance: Allowance,
        stop: threading.Event,
    ) -> tuple[T | None, ErrorKind | None]:
        """Call ``attempt(timeout)`` in short rounds until it gives a value or time runs out."""
        began = self._clock()
        while True:
            left, limit = allowance.tightest(self._clock())
            if stop.is_set():
                return None, "cancelled"
            value = attempt(max(0.0, min(left, _POLL_SECONDS)))
            if value is not None:
                self.waits.add(gate, self._clock() - began)
                return value, None
            if left <= 0:
                return None, limit

    def abandon(self, admission: Admission) -> None:
        """Give back what an admission held when its attempt never came to a Verdict (a
        refusal at a later gate, an interrupt): its slot, its probe; it tells nothing."""
        if admission.adaptive_since is not None and self._adaptive is not None:
            self._adaptive.leave(admission.adaptive_since, congested=None)
        # A backend that cannot be reached forgets on its own: leases and probes expire.
        with contextlib.suppress(LimitsUnavailable):
            if self._breaker is not None:
                self._breaker.abandon(admission.host, admission.probe)
            if admission.slot and self._slots is not None:
                self._slots.leave(admission.host)

    def release(self, admission: Admission, feedback: Feedback) -> None:
        """Give back the slots and tell each limit what the attempt came to."""
        if admission.adaptive_since is not None and self._adaptive is not None:
            self._adaptive.leave(admission.adaptive_since, feedback.congested)
        try:
            if admission.slot and self._slots is not None:
                self._slots.leave(admission.host)
            if self._breaker is not None:
                self._breaker.record(admission.host, feedback.unwell, admission.probe)
            if self._cooldowns is not None and feedback.hold:
                self._cooldowns.hold(self._cooldown_key(admission.host), feedback.hold)
            if self._quotas is not None and feedback.quota:
                self._quotas.hold(_QUOTA + admission.host, feedback.quota)
        except LimitsUnavailable as exc:  # leases expire; what this attempt taught is lost
            self._unavailable(exc)


def build_gates(
    *,
    concurrency: int,
    rate: float | None,
    per_host: int | None,
    cooldown: CooldownScope,
    breaker: Breaker | None,
    adaptive: bool,
    shared: SharedLimits | None = None,
) -> Gates:
    """The gates for a run's settings: in-process, or kept by a ``shared`` backend (the
    adaptive limit is always this process's own)."""
    if shared is None:
        return Gates(
            rate=None if rate is None else TokenBucket(rate, burst=concurrency),
            slots=None if per_host is None else HostSlots(per_host),
            cooldowns=Cooldowns(),
            cooldown_scope=cooldown,
            breaker=None if breaker is None else CircuitBreaker(breaker),
            adaptive=AdaptiveLimit(concurrency) if adaptive else None,
        )
    return Gates(
        rate=None if rate is None else shared.token_bucket(rate, concurrency),
        slots=None if per_host is None else shared.slots(per_host),
        cooldowns=shared.cooldowns(),
        cooldown_scope=cooldown,
        breaker=None if breaker is None else shared.breaker(breaker),
        adaptive=AdaptiveLimit(concurrency) if adaptive else None,
    )
