"""The cooldown (``cooldown="host"``, ``"global"`` or ``"off"``): a server that answers 429 or
503 with Retry-After holds its host's attempts, or every host's, until then.

Its board of holds is the quota reset's too (``quota``): ``Holds`` makes one board for both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ..core.admission import GLOBAL, Admission
from ..core.clock import Clock
from ..core.verdict import ErrorKind, Feedback
from .gate import GateOption, Waiting
from .shared import CooldownBoard, SharedLimits

CooldownScope = Literal["host", "global", "off"]


class Holds:
    """The one board a run's cooldown and quota-reset gates keep their holds on (under keys
    apart), made for the first of them built: in this process, or by the shared backend."""

    _board: CooldownBoard | None = None

    def board(self, *, shared: SharedLimits | None, clock: Clock) -> CooldownBoard:
        if self._board is None:
            self._board = Cooldowns(clock.now) if shared is None else shared.cooldowns()
        return self._board


@dataclass(frozen=True)
class Cooldown(GateOption):
    """``cooldown`` when not ``"off"``: attempts held while a server's Retry-After holds their
    host (``"host"``) or every host (``"global"``), on the board of ``holds``."""

    scope: Literal["host", "global"]
    holds: Holds

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> CooldownGate:
        return CooldownGate(self.holds.board(shared=shared, clock=clock), self.scope)


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


@dataclass(eq=False)
class CooldownGate:
    """Holds attempts while a server's Retry-After (a 429 or 503) holds their host, or every
    host (``global``)."""

    board: CooldownBoard
    scope: CooldownScope
    name = "cooldown"
    rank = 40
    recheck = True

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        held = self.board.remaining(GLOBAL if self.scope == "global" else admission.host)
        return waiting.sleep(self.name, held, admission) if held > 0 else None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        if feedback.hold:
            self.board.hold(GLOBAL if self.scope == "global" else admission.host, feedback.hold)

    def abandon(self, admission: Admission) -> None:
        """Nothing is held."""
