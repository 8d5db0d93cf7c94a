"""The provider's announced limits (``rate="auto"``): the requests and tokens a minute that
OpenAI's and Anthropic's rate-limit headers announce, each held as a window (``window``) sized
by the latest answer that tells it, following them as they change.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from functools import partial
from typing import Literal

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.verdict import Announced, ErrorKind, Feedback, TokenSide, Told
from .gate import GateOption, Waiting
from .rates import Window
from .shared import SharedLimits, WindowLimiter
from .window import EXACT_SIDE, LocalWindow, enter, given_back

log = logging.getLogger("batchsync")
# The period of the limits a provider's headers announce: requests and tokens a minute.
ANNOUNCED_PERIOD = 60.0
# How many times apart a reset and what an assumption has it be must be before ``auto`` judges
# the assumption wrong: the headers' roundings (whole seconds, thousands of tokens, a clock a
# second off) stay well inside that.
SHORTER = 4.0
# The least reset (seconds) that is judged: a shorter one may be a whole second rounded up.
LEAST_RESET = 3.0
# A budget the headers announce, and the name its waits are counted under.
Budget = TokenSide | Literal["requests"]
_NAMES: dict[Budget, str] = {
    "requests": "announced requests",
    "tokens": "announced tokens",
    "input": "announced input tokens",
    "output": "announced output tokens",
}


def short_period(told: Told, assumed: float = ANNOUNCED_PERIOD) -> float | None:
    """The period a budget's answer shows when it is far shorter than ``assumed``; else None.

    A budget that refills evenly over ``assumed`` (OpenAI's, Anthropic's) is back in
    used / limit of it; one counted over a sliding window of ``assumed`` is back in about
    ``assumed`` once it counts an attempt. A reset far under ``assumed`` that is far longer
    than the even refill of what is used is neither: the budget comes back in about that reset
    (a limit counted over 6 s, held to a minute: the run goes 10 times slower than it may).
    A longer period is not judged: some resets run past the minute (a day's limit beside it).
    """
    remaining, reset, limit = told
    if limit is None or remaining is None or reset is None or limit <= 0:
        return None
    even = assumed * max(limit - remaining, 0) / limit
    if reset >= LEAST_RESET and reset * SHORTER < assumed and reset > even * SHORTER:
        return reset
    return None


@dataclass(frozen=True)
class AnnouncedRates(GateOption):
    """``rate="auto"``: the requests and tokens a minute a provider's headers announce (OpenAI's
    and Anthropic's limits, Anthropic's input and output tokens apart), each a window sized by
    the latest answer that tells it; a token budget only when the run has none of that side
    of its own (``own``: the sides the run's ``token_rate`` options hold)."""

    own: frozenset[TokenSide] = frozenset()

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> AnnouncedGate:
        def limiter(budget: Budget) -> WindowLimiter | None:
            if budget in self.own:
                return None
            if shared is None:
                return LocalWindow(clock.now)
            return shared.window(_NAMES[budget].replace(" ", "-"))  # (its keys, as they were)

        return AnnouncedGate({budget: limiter(budget) for budget in _NAMES})


class AnnouncedGate:
    """Passes every attempt until an answer announces the provider's limits, then holds them
    to windows of those (as ``rate`` and ``token_rate`` hold theirs): each answer that
    announces a limit sets its window, down at once and up as the answers say. A value that
    cannot be a limit (0, unreadable) is ignored, with one warning a host and header; resets
    that show a far shorter period than a minute get one warning a run."""

    name = "announced"
    rank = 62
    recheck = False

    def __init__(self, limiters: dict[Budget, WindowLimiter | None]) -> None:
        self._limiters = limiters
        self.windows: dict[Budget, Window] = {}
        self._warned: set[tuple[str, str]] = set()
        self._period_warned = False
        self._lock = threading.Lock()

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        for budget, limiter in self._limiters.items():
            window = self.windows.get(budget)
            if limiter is None or window is None:
                continue
            amount = 1 if budget == "requests" else admission.weight(budget)
            if amount <= 0:
                continue
            name = _NAMES[budget]
            entry, refusal = enter(
                limiter,
                partial(self._window, budget, window),  # (as the answers set it meanwhile)
                amount,
                name=name,
                admission=admission,
                waiting=waiting,
            )
            if entry is None:
                self.abandon(admission)
                return refusal
            admission.held[name] = entry
        return None

    def _window(self, budget: Budget, first: Window) -> Window:
        """``budget``'s window as the answers set it now (``first``: the one the wait began
        with, which an announced limit replaces but never removes)."""
        return self.windows.get(budget, first)

    def release(self, admission: Admission, feedback: Feedback) -> None:
        for budget, limiter in self._limiters.items():
            entry = admission.held.get(_NAMES[budget])
            if entry is not None and limiter is not None:
                used = None if budget == "requests" else feedback.used_of(budget)
                limiter.finish(entry, used, exact=budget == EXACT_SIDE)
        if feedback.announced is not None:
            self._learn(admission.host, feedback.announced)

    def abandon(self, admission: Admission) -> None:
        for budget, limiter in self._limiters.items():
            entry = admission.held.pop(_NAMES[budget], None)
            if entry is not None and limiter is not None:
                given_back(limiter, entry, admission)

    def _learn(self, host: str, said: Announced) -> None:
        for header in said.unreadable:
            self._warn(host, header, "an unreadable value")
        for budget, told in said.budgets():
            self._check_period(host, budget, told)
            limit, limiter = told[2], self._limiters[budget]
            if limit is None or limiter is None:
                continue
            if limit <= 0:
                self._warn(host, _NAMES[budget].removeprefix("announced "), limit)
                continue
            window = Window(float(limit), ANNOUNCED_PERIOD)
            if self.windows.get(budget) != window:
                # (compared again under the lock, so that the check and the store are one step
                # on a free-threaded build too: no store goes by a comparison another made stale)
                with self._lock:
                    if self.windows.get(budget) != window:
                        self.windows[budget] = window
                        limiter.recheck()

    def _check_period(self, host: str, budget: Budget, told: Told) -> None:
        if self._period_warned or self._limiters[budget] is None:
            return
        period = short_period(told)
        if period is None:
            return
        with self._lock:
            if self._period_warned:
                return
            self._period_warned = True
        log.warning(
            "rate auto holds the limits %s announces to a minute, but its %s resets show them "
            "coming back in about %.0f s: the run may go much slower than they allow (give "
            "rate and token_rate instead)",
            host,
            _NAMES[budget].removeprefix("announced "),
            period,
        )

    def _warn(self, host: str, kind: str, value: object) -> None:
        with self._lock:
            if (host, kind) in self._warned:
                return
            self._warned.add((host, kind))
        log.warning(
            "%s announced a %s limit of %r, which cannot be a limit: ignored", host, kind, value
        )
