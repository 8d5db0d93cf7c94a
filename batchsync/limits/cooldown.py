"""The cooldown (``cooldown="host"``, ``"global"`` or ``"off"``): a server that answers 429 or
503 with Retry-After holds its host's attempts, or every host's, until then.

Its board of holds is the quota reset's too (``quota``): ``Holds`` makes one board for both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
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
    hold lasts. A ``global`` hold lasts whatever the hosts answer, and so does a hold on a
    shared board (``--redis``): another process's refusal cannot be judged here."""

    board: CooldownBoard
    scope: CooldownScope
    name = "cooldown"
    rank = 40
    recheck = True
    # By host: when the latest attempt it answered was sent (a few thousand hosts at most:
    # forgotten, a refusal holds, as without), and when the refusal that holds it was (this
    # process's clock: ``Admission.sent``); the lock keeps a refusal and a lift apart.
    _answered: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _refused: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    # Set when a hold is lifted here (then a new one takes its place): its waiters go at
    # once, not at its end.
    _lifted: threading.Event = field(default_factory=threading.Event, init=False, repr=False)

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        key = GLOBAL if self.scope == "global" else admission.host
        held = self.board.remaining(key)
        if held <= 0:
            return None
        if held >= admission.allowance.tightest(waiting.now())[0]:
            return waiting.sleep(self.name, held, admission)  # (refused at once: too long)
        ended = partial(self._ended, key, waiting.clock)
        _, refusal = waiting.poll(self.name, ended, admission, wake=self._wake)
        return refusal

    def _ended(self, key: str, clock: Clock, timeout: float) -> bool | None:
        """True once the key's hold has passed or was lifted; else None, after waiting for
        that at most ``timeout``."""
        lifted = self._lifted  # (before the look: a lift after it sets this one)
        held = self.board.remaining(key)
        if held > 0 and timeout > 0:
            clock.wait(lifted, min(timeout, held))
            held = self.board.remaining(key)
        return True if held <= 0 else None

    def _wake(self) -> None:
        """Wake every waiter (a hold lifted, or the run's stop)."""
        with self._lock:  # (two at once must not leave a waiter on an event none sets)
            lifted, self._lifted = self._lifted, threading.Event()
        lifted.set()

    def release(self, admission: Admission, feedback: Feedback) -> None:
        board = self.board
        if self.scope == "global" or not isinstance(board, Cooldowns):
            if feedback.hold:
                board.hold(GLOBAL if self.scope == "global" else admission.host, feedback.hold)
            return
        host, sent = admission.host, admission.sent
        if feedback.hold:
            self._refused_at(host, sent, feedback.hold, board)
        elif sent is not None and feedback.unwell is False and not feedback.congested:
            self._answered_at(host, sent, board)

    def _refused_at(self, host: str, sent: float | None, hold: float, board: Cooldowns) -> None:
        """The host refused an attempt sent at ``sent`` for ``hold`` seconds: its attempts are
        held, unless it answered one sent after it (then the refusal was the item's own)."""
        with self._lock:
            if sent is not None:  # (first: an answer told meanwhile then sees it, and lifts)
                refused = self._refused
                if host not in refused and len(refused) >= _HOSTS_KEPT:
                    refused.clear()  # (their holds stay, and pass as they would have)
                refused[host] = max(sent, refused.get(host, sent))
            if answered_after(self._answered.get(host), sent):
                return
            board.hold(host, hold)

    def _answered_at(self, host: str, sent: float, board: Cooldowns) -> None:
        """The host answered an attempt sent at ``sent`` (an answer, not a refusal, a lost
        connection or an attempt cut short): a hold set by a refusal sent before it ends."""
        if sent > self._answered.get(host, sent - 1):
            if len(self._answered) >= _HOSTS_KEPT:
                self._answered.clear()
            self._answered[host] = sent
        # (most answers: no hold to judge; a refusal told meanwhile is noted before it looks at
        # the answers, so that it sees this one or this one sees it)
        if host not in self._refused:
            return
        with self._lock:
            lifted = answered_after(sent, self._refused.get(host))
            if lifted:
                del self._refused[host]
                board.lift(host)
        if lifted:
            self._wake()

    def abandon(self, admission: Admission) -> None:
        """Nothing is held."""


# The hosts whose latest answer, and latest refusal, the cooldown keeps (see
# ``CooldownGate._answered``, ``_refused``).
_HOSTS_KEPT = 4096


def answered_after(answered: float | None, refused: float | None) -> bool:
    """Whether a host answered an attempt sent after a refused one (when each was sent):
    then the refusal was the item's own, not the host's."""
    return answered is not None and refused is not None and answered > refused
