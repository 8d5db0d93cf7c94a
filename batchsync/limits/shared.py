"""What a backend that keeps the limits for several processes implements (``contrib.redis``).

``SharedLimits`` hands each limit the state its gate keeps there — a window's log, host slots,
the board of cooldowns, the circuit breakers — behind the same small interface as the
in-process state in the limit's own module (``window.LocalWindow``, ``slots.HostSlots``,
``cooldown.Cooldowns``, ``breaker.CircuitBreaker``). A backend that cannot be reached raises
``LimitsUnavailable``: the gates then hold attempts and ask again (``gates.Gates``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal, Protocol

from .rates import Window

# closed: go; probe: go, as the one trial of a half-open circuit; open: held until the break
# ends; probing: held while another attempt is the probe.
BreakerState = Literal["closed", "probe", "open", "probing"]


class LimitsUnavailable(Exception):
    """A shared limits backend cannot be reached; the gates wait and ask again."""


class SharedLimits(Protocol):
    """A backend that keeps the limits for several processes (``contrib.redis.RedisLimits``)."""

    def window(self, name: str) -> WindowLimiter:
        """The shared log of the window kept under ``name`` (see ``window.WindowGate``)."""

    def slots(self, limit: int) -> SlotPool: ...

    def cooldowns(self) -> CooldownBoard: ...

    def breaker(self, settings: BreakerSettings) -> BreakerBackend: ...

    def ledger(self, cap: int) -> SpendLedger: ...


class SpendLedger(Protocol):
    """What was spent and is reserved under a spend cap (``spend.Ledger``), in pico-dollars."""

    cap: int

    @property
    def spent(self) -> int: ...

    def reserve(self, amount: int) -> object | bool | None:
        """Reserve ``amount``: its mark when done, None while only what is reserved stands in
        the way, False once what was spent does."""

    def settle(self, mark: object, reserved: int, spent: int) -> None:
        """The reservation ``mark`` of ``reserved`` turned into ``spent``."""

    def wait(self, seconds: float) -> None:
        """Wait at most ``seconds`` for a reservation to be settled."""

    def keep(self, store: SpendStore | None) -> None:
        """Keep reservations in ``store`` too (a journal's; None: no more)."""


class SpendStore(Protocol):
    """Where a ledger keeps its reservations beyond the process (the journal's ``spend``)."""

    def total(self) -> int: ...
    def reserve(self, amount: int) -> int: ...
    def settle(self, number: int, spent: int) -> bool: ...


class WindowLimiter(Protocol):
    """Where a window's log is kept: in this process, or shared (``contrib.redis``)."""

    # How often a waiter looks again when nothing wakes it (``changed``).
    poll: float

    def take(
        self, amount: float, window: Window, turn: threading.Event, longest: float
    ) -> tuple[object | None, float]:
        """Let ``amount`` through now if the window and the pace allow and ``turn`` is first
        in line: (its entry, 0). Else (None, the seconds to wait first: infinite while the
        room waits on an attempt in flight or on a turn ahead). ``turn``: the waiter's event,
        which the limiter sets when that may have changed (a limiter that cannot tell, as a
        shared one, never sets it: its waiters look again every ``poll`` seconds).
        ``longest``: how long the attempt can last, after which a shared log forgets it (its
        process may have died)."""

    def finish(self, entry: object, used: float | None, *, exact: bool = False) -> None:
        """The attempt ended now; ``used``: what its answer says it cost, when known, kept
        when more than it took, or ``exact``, whatever it is (a server that counts what was
        used, not what was asked for)."""

    def cancel(self, entry: object) -> None:
        """The attempt was never sent."""

    def withdraw(self, turn: threading.Event) -> None:
        """``turn`` gave up waiting, or went."""

    def recheck(self) -> None:
        """The window's limit changed: the waiter first in line looks again."""

    def queued(self) -> bool:
        """Whether turns wait in line (a shared log keeps no line: False)."""


class SlotPool(Protocol):
    """At most N attempts in flight per key (a host)."""

    def enter(self, key: str, timeout: float, stop: threading.Event | None = None) -> bool:
        """Take a slot for ``key``, waiting up to ``timeout`` seconds; False if none came, or
        ``stop`` is set."""

    def leave(self, key: str) -> None: ...

    def wake(self) -> None:
        """End every ``enter`` waiting now (False), for the run's stop."""


class CooldownBoard(Protocol):
    """Times until which attempts to a key are held, as servers asked with Retry-After."""

    def hold(self, key: str, seconds: float) -> None: ...

    def remaining(self, key: str) -> float:
        """Seconds left in the key's cooldown (0 when there is none)."""


@dataclass(frozen=True)
class BreakerSettings:
    """A circuit breaker's settings, as a backend reads them (``breaker.Breaker`` is the option
    that holds them, and says what they mean)."""

    ratio: float = 0.5
    window: int = 100
    min_calls: int = 20
    reset: float = 5.0


class BreakerBackend(Protocol):
    """A circuit breaker per host (see ``Breaker`` for the semantics)."""

    def check(self, key: str) -> tuple[BreakerState, float]:
        """The host's state and, when ``open``, the seconds left in its break (else 0).

        ``closed``: go; ``probe``: go, as the one trial of a half-open circuit (the caller must
        ``record`` or ``abandon`` it); ``open``: wait for the break to end; ``probing``: another
        attempt is the probe, ask again shortly.
        """

    def record(self, key: str, failed: bool | None, probe: bool) -> None:
        """What an admitted attempt came to: ``failed`` as ``Feedback.unwell`` says (None: not
        counted)."""

    def abandon(self, key: str, probe: bool) -> None:
        """An admitted attempt was not sent after all."""

    @property
    def opened(self) -> int:
        """How many circuits this process saw open."""
