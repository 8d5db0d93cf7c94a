"""A budget of tokens per period (``token_rate``): each attempt takes its item's estimated
cost (``Task.cost``, an LLM request's tokens) from a window of the period (``window``), and
the answer's ``usage`` sets the estimate right when it says more.

Like ``rate``, the budget holds over every window of its period as the server counts it, paced
evenly from the start: a run's first period holds no more than the budget, and a quiet spell
saves nothing up. What the provider's own headers say is left is the quota gate's to hold
(``announced``). ``AnnouncedRates`` is ``rate="auto"``: windows sized by the limits the
provider's headers announce, following them as they change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.numbers import MAX_COUNT, count_of
from ..core.verdict import Announced, ErrorKind, Feedback, InvalidItem
from .gate import Waiting
from .gates import GateOption, SharedLimits
from .rates import Rate, parse_rate
from .tokens import estimate_tokens
from .window import LocalWindow, Window, WindowGate, WindowLimiter, enter

log = logging.getLogger("batchsync")
# The period of the limits a provider's headers announce: requests and tokens a minute.
ANNOUNCED_PERIOD = 60.0


@dataclass(frozen=True)
class TokenRate(GateOption):
    """``token_rate``: at most ``rate.count`` tokens in any ``rate.period`` over all workers
    (and all processes sharing ``--redis``)."""

    rate: Rate

    @classmethod
    def of(cls, value: TokenRate | float | str) -> TokenRate:
        """The option from what a user wrote: ``"200000/min"``, ``"5000/s"``, a number a
        second; a ValueError naming the accepted forms otherwise."""
        return value if isinstance(value, TokenRate) else cls(parse_rate(value, name="token_rate"))

    def too_costly(self, cost: int) -> str | None:
        """Why an item of ``cost`` tokens can never be sent under this budget; None when it can."""
        if cost <= Window.of(self.rate).count:
            return None
        return f"needs about {cost} tokens, more than the token_rate of {self.rate} allows at once"

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> WindowGate:
        limiter = LocalWindow(clock.now) if shared is None else shared.window("tokens")
        return WindowGate("tokens", 65, limiter, Window.of(self.rate), weighed=True)

    def __str__(self) -> str:
        return str(self.rate)


def item_cost(
    item: object, body: object, cost: Callable[[Any], int] | None, budget: TokenRate | None
) -> int:
    """What each attempt of ``item`` weighs: ``cost(item)``, else the estimate of its request
    ``body`` (``tokens.estimate_tokens``); InvalidItem (the item is never sent) when ``cost``
    fails or says what ``budget`` can never hold."""
    if cost is None:
        weight = estimate_tokens(body)
    else:
        try:
            weight = cost(item)
        except Exception as exc:  # the caller's function failing is that item's fault
            raise InvalidItem(f"cost raised {type(exc).__name__}: {exc}") from None
        if count_of(weight) is None or not isinstance(weight, int):
            raise InvalidItem(
                f"cost must give a whole number of tokens from 0 to {MAX_COUNT}: got {weight!r}"
            )
    refusal = None if budget is None else budget.too_costly(weight)
    if refusal is not None:
        raise InvalidItem(refusal)
    return weight


def used_tokens(usage: Callable[[Any], int | None], data: object) -> int | None:
    """The tokens ``usage(data)`` says an answer used; None when it cannot say (no usage in
    the answer, a function that raises or gives no whole number): the estimate then stands."""
    try:
        used = usage(data)
    except Exception:
        return None
    return count_of(used) if isinstance(used, int) else None


@dataclass(frozen=True)
class AnnouncedRates(GateOption):
    """``rate="auto"``: the requests and tokens a minute a provider's headers announce (OpenAI's
    and Anthropic's limits), each a window sized by the latest answer that tells it; the
    tokens' only when the run has no ``token_rate`` of its own."""

    tokens: bool = True

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> AnnouncedGate:
        def limiter(name: str) -> WindowLimiter:
            return LocalWindow(clock.now) if shared is None else shared.window(name)

        tokens = limiter("announced-tokens") if self.tokens else None
        return AnnouncedGate(limiter("announced-requests"), tokens)


class AnnouncedGate:
    """Passes every attempt until an answer announces the provider's limits, then holds them
    to windows of those (as ``rate`` and ``token_rate`` hold theirs): each answer that
    announces a limit sets its window, down at once and up as the answers say. A value that
    cannot be a limit (0, unreadable) is ignored, with one warning a host and header."""

    name = "announced"
    rank = 62
    recheck = False

    def __init__(self, requests: WindowLimiter, tokens: WindowLimiter | None) -> None:
        self._limiters = {"requests": requests, "tokens": tokens}
        self.windows: dict[str, Window] = {}
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        for kind, amount in (("requests", 1), ("tokens", admission.cost)):
            limiter, window = self._limiters[kind], self.windows.get(kind)
            if limiter is None or window is None or amount <= 0:
                continue
            name = f"announced {kind}"
            entry, refusal = enter(
                limiter,
                window,
                min(amount, window.count),
                name=name,
                admission=admission,
                waiting=waiting,
            )
            if entry is None:
                self.abandon(admission)
                return refusal
            admission.held[name] = entry
        return None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        for kind, used in (("requests", None), ("tokens", feedback.used)):
            entry, limiter = admission.held.get(f"announced {kind}"), self._limiters[kind]
            if entry is not None and limiter is not None:
                limiter.finish(entry, used)
        if feedback.announced is not None:
            self._learn(admission.host, feedback.announced)

    def abandon(self, admission: Admission) -> None:
        for kind, limiter in self._limiters.items():
            entry = admission.held.pop(f"announced {kind}", None)
            if entry is not None and limiter is not None:
                limiter.cancel(entry)

    def _learn(self, host: str, said: Announced) -> None:
        for header in said.unreadable:
            self._warn(host, header, "an unreadable value")
        for kind, limit in (("requests", said.requests_limit), ("tokens", said.tokens_limit)):
            if limit is None or self._limiters[kind] is None:
                continue
            if limit <= 0:
                self._warn(host, kind, limit)
                continue
            window = Window(float(limit), ANNOUNCED_PERIOD)
            if self.windows.get(kind) != window:
                with self._lock:
                    self.windows[kind] = window

    def _warn(self, host: str, kind: str, value: object) -> None:
        with self._lock:
            if (host, kind) in self._warned:
                return
            self._warned.add((host, kind))
        log.warning(
            "%s announced a %s limit of %r, which cannot be a limit: ignored", host, kind, value
        )
