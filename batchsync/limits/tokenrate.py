"""A budget of tokens per period (``token_rate``): each attempt takes its item's estimated
cost (``Task.cost``, an LLM request's tokens) from a window of the period (``window``), and
the answer's ``usage`` sets the estimate right when it says more. ``input_token_rate`` and
``output_token_rate`` hold one side each, as providers that count them apart do: the prompt's
estimate, and the completion's limit (``max_tokens`` times ``n``), each set right by its side
of the usage.

Like ``rate``, the budget holds over every window of its period as the server counts it, paced
evenly from the start: a run's first period holds no more than the budget, and a quiet spell
saves nothing up. What the provider's own headers say is left is the quota gate's to hold
(``quota``); the limits they announce are ``rate="auto"``'s (``announced``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..core.admission import Sides, weight_of
from ..core.clock import Clock
from ..core.numbers import MAX_COUNT, count_of
from ..core.verdict import InvalidItem, TokenSide
from .gate import GateOption
from .rates import Rate, Window, parse_rate
from .shared import SharedLimits
from .tokens import estimate_sides
from .window import LocalWindow, WindowGate

# Each side's option, and its gate's name and rank (see ``gate.Gate``).
OPTION_OF: dict[TokenSide, str] = {
    "tokens": "token_rate",
    "input": "input_token_rate",
    "output": "output_token_rate",
}
_GATES: dict[TokenSide, tuple[str, int]] = {
    "tokens": ("tokens", 65),
    "input": ("input tokens", 66),
    "output": ("output tokens", 67),
}


@dataclass(frozen=True)
class TokenRate(GateOption):
    """``token_rate``: at most ``rate.count`` tokens in any ``rate.period`` over all workers
    (and all processes sharing ``--redis``); ``input_token_rate`` and ``output_token_rate``
    the same of one ``side`` of each request: its prompt's, or its completion's."""

    rate: Rate
    side: TokenSide = "tokens"

    @classmethod
    def of(cls, value: TokenRate | float | str, side: TokenSide = "tokens") -> TokenRate:
        """The option from what a user wrote: ``"200000/min"``, ``"5000/s"``, a number a
        second; a ValueError naming the accepted forms otherwise."""
        if isinstance(value, TokenRate):
            return value if value.side == side else replace(value, side=side)
        return cls(parse_rate(value, name=OPTION_OF[side]), side)

    def too_costly(self, cost: int, sides: Sides | None) -> str | None:
        """Why an item of ``cost`` tokens (``sides``: by side) can never be sent under this
        budget; None when it can."""
        weight = weight_of(cost, sides, self.side)
        if weight <= Window.of(self.rate).count:
            return None
        what = "" if self.side == "tokens" else f"{self.side} "
        return (
            f"needs about {weight} {what}tokens, more than the {OPTION_OF[self.side]} of "
            f"{self.rate} allows at once"
        )

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> WindowGate:
        name, rank = _GATES[self.side]
        shared_name = name.replace(" ", "-")  # (a key without spaces: "input-tokens")
        limiter = LocalWindow(clock.now) if shared is None else shared.window(shared_name)
        return WindowGate(name, rank, limiter, Window.of(self.rate), weighs=self.side)

    def __str__(self) -> str:
        return str(self.rate)


def item_cost(
    item: object, body: object, cost: Callable[[Any], int] | None, budgets: Iterable[TokenRate]
) -> tuple[int, Sides | None]:
    """What each attempt of ``item`` weighs, and that by side when known apart: ``cost(item)``
    (on either side, whole: the most each can be), else the estimate of its request ``body``
    (``tokens.estimate_sides``). InvalidItem (the item is never sent) when ``cost`` fails, or
    its weight is more than one of ``budgets`` can ever hold, or a budget of the output side
    meets a prompt that sets no completion limit (its output could be anything)."""
    budgets = tuple(budgets)
    weight, sides = _estimated(body, budgets) if cost is None else (_given(item, cost), None)
    for budget in budgets:
        refusal = budget.too_costly(weight, sides)
        if refusal is not None:
            raise InvalidItem(refusal)
    return weight, sides


def _estimated(body: object, budgets: tuple[TokenRate, ...]) -> tuple[int, Sides]:
    prompt, completion = estimate_sides(body)
    if completion is None and any(budget.side == "output" for budget in budgets):
        raise InvalidItem(
            "sets no max_tokens (nor max_completion_tokens, max_output_tokens): its output "
            "cannot be held to the output_token_rate"
        )
    return min(prompt + (completion or 0), MAX_COUNT), (prompt, completion or 0)


def _given(item: object, cost: Callable[[Any], int]) -> int:
    try:
        weight = cost(item)
    except Exception as exc:  # the caller's function failing is that item's fault
        raise InvalidItem(f"cost raised {type(exc).__name__}: {exc}") from None
    if count_of(weight) is None or not isinstance(weight, int):
        raise InvalidItem(
            f"cost must give a whole number of tokens from 0 to {MAX_COUNT}: got {weight!r}"
        )
    return weight


def used_tokens(usage: Callable[[Any], int | None], data: object) -> int | None:
    """The tokens ``usage(data)`` says an answer used; None when it cannot say (no usage in
    the answer, a function that raises or gives no whole number): the estimate then stands."""
    try:
        used = usage(data)
    except Exception:
        return None
    return count_of(used) if isinstance(used, int) else None
