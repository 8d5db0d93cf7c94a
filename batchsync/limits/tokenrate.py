"""A budget of tokens per period (``token_rate``): each attempt takes its item's estimated
cost (``Task.cost``, an LLM request's tokens) from a window of the period (``window``), and
the answer's ``usage`` sets the estimate right when it says more.

Like ``rate``, the budget holds over every window of its period as the server counts it, paced
evenly from the start: a run's first period holds no more than the budget, and a quiet spell
saves nothing up. What the provider's own headers say is left is the quota gate's to hold
(``quota``); the limits they announce are ``rate="auto"``'s (``announced``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.clock import Clock
from ..core.numbers import MAX_COUNT, count_of
from ..core.verdict import InvalidItem
from .gate import GateOption
from .rates import Rate, Window, parse_rate
from .shared import SharedLimits
from .tokens import estimate_tokens
from .window import LocalWindow, WindowGate


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
