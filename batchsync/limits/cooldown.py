"""The cooldown (``cooldown="host"``, ``"global"`` or ``"off"``): a server that answers 429 or
503 with Retry-After holds its host's attempts, or every host's, until then.

Its board of holds is the quota reset's too (``quota``): ``Holds`` makes one board for both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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

    def lift(self, key: str) -> None:
        with self._lock:
            self._until.pop(key, None)

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
    host (``global``).

    A host's hold ends early when the host answers an attempt sent after the refused one:
    the refusal was that item's alone (a limit of one key, one resource), and that item still
    waits its Retry-After. A host that refuses every caller gives no such answer, and its
    hold lasts. A ``global`` hold lasts whatever the hosts answer."""

    board: CooldownBoard
    scope: CooldownScope
    name = "cooldown"
    rank = 40
    recheck = True
    # By host: when the latest attempt it answered was sent, and when the refusal that holds
    # it was (this process's clock: ``Admission.sent``).
    _answered: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _refused: dict[str, float] = field(default_factory=dict, init=False, repr=False)

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        held = self.board.remaining(GLOBAL if self.scope == "global" else admission.host)
        return waiting.sleep(self.name, held, admission) if held > 0 else None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        if self.scope == "global":
            if feedback.hold:
                self.board.hold(GLOBAL, feedback.hold)
            return
        host, sent = admission.host, admission.sent
        if feedback.hold:
            if not answered_after(self._answered.get(host), sent):
                if sent is not None:
                    self._refused[host] = max(sent, self._refused.get(host, sent))
                self.board.hold(host, feedback.hold)
        elif sent is not None and not feedback.congested:
            if sent > self._answered.get(host, sent - 1):
                self._answered[host] = sent
            if answered_after(sent, self._refused.get(host)):
                self._refused.pop(host, None)
                self.board.lift(host)

    def abandon(self, admission: Admission) -> None:
        """Nothing is held."""


def answered_after(answered: float | None, refused: float | None) -> bool:
    """Whether a host answered an attempt sent after a refused one (when each was sent):
    then the refusal was the item's own, not the host's."""
    return answered is not None and refused is not None and answered > refused
