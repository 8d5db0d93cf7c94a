"""What the engine needs of the limits: an ``Admitter`` that lets each attempt in, or refuses
it, and hears what it came to. The limits themselves (``limits.gates.Gates``) implement it; the
engine knows nothing else of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .budget import Allowance
from .verdict import ErrorKind, Feedback, TokenSide, Usage

# The limits' key of an attempt that has no host (a callable's item without a key).
GLOBAL = "*"
# An LLM request's input and output tokens, each side's worst case.
Sides = tuple[int, int]
# Pico-dollars a dollar: what a spend cap counts in, whole, so that its sums are exact.
PICO = 10**12


class Price(Protocol):
    """What a spend cap needs of a request (``limits.spend.Priced``): the most one attempt
    can cost, and what an answer's usage says it did, in pico-dollars; the model priced."""

    @property
    def worst(self) -> int: ...

    @property
    def model(self) -> str: ...

    def spent(self, usage: Usage | None) -> int: ...


def weight_of(cost: int, sides: Sides | None, side: TokenSide) -> int:
    """What a request of ``cost`` tokens weighs at a budget of ``side``'s: all of it, or its
    side's share when ``sides`` knows them apart (else all of it, the most either can be)."""
    if side == "tokens" or sides is None:
        return cost
    return sides[side == "output"]


@dataclass(slots=True)
class Admission:
    """One attempt at the gates, then in flight: its host (the limits' key), how long it may
    wait, and what each gate holds for it by the gate's name; handed back to ``release``."""

    host: str
    allowance: Allowance
    stop: threading.Event
    held: dict[str, Any] = field(default_factory=dict)
    # What the attempt weighs at a weighted limit (its item's ``Task.cost``: LLM tokens), and
    # that by side (``Task.sides``).
    cost: int = 0
    sides: Sides | None = None
    # Whether the gate it is at made it wait (see ``Gate.recheck``).
    waited: bool = False
    # Whether it passed a run-wide window (a rate, a token budget) while other attempts still
    # waited in line behind it: the window, not the callers, sets the pace then.
    held_back: bool = False
    # Called (once) when a gate holds it where other items need not wait behind it (a host's
    # circuit, cooldown, quota or slots; the adaptive limit; the spend cap): its caller may
    # start other work meanwhile.
    going: Callable[[], None] | None = None

    def holding(self) -> None:
        """A gate holds it (see ``going``): tell ``going``, the first time."""
        going, self.going = self.going, None
        if going is not None:
            going()

    # Why a gate refused it, when a person needs more than the kind (a reset past the budget).
    why: str | None = None
    # When the attempt was sent, once it was: the gates may have held it long after they took.
    sent: float | None = None
    # Under a spend cap: what the attempt may cost, then what it did (in pico-dollars).
    price: Price | None = None
    spent: int = 0

    def weight(self, side: TokenSide) -> int:
        """What the attempt weighs at a budget of ``side``'s tokens (``weight_of``)."""
        return weight_of(self.cost, self.sides, side)

    @property
    def cost_in_dollars(self) -> float | None:
        """What the attempt spent under a spend cap (None: there is none)."""
        return None if self.price is None else self.spent / PICO

    @property
    def reserved_in_dollars(self) -> float | None:
        """What the spend cap reserved for the attempt, its worst case (None: no cap)."""
        return None if self.price is None else self.price.worst / PICO

    @property
    def model(self) -> str | None:
        """The model the spend cap priced the attempt at (None: no cap)."""
        return None if self.price is None else self.price.model

    @property
    def probe(self) -> bool:
        """Whether this attempt is the one trial of a half-open circuit (see ``Breaker``)."""
        return self.held.get("breaker") is True


@dataclass(frozen=True, slots=True)
class Refusal:
    """What ends an item at the gates: its kind, and why in a person's words when the kind
    alone would mislead (a server's reset further off than the budget)."""

    kind: ErrorKind
    why: str | None = None


class Admitter(Protocol):
    """Lets attempts in by the limits, one at a time, and takes back what each held."""

    def enter(
        self,
        host: str,
        allowance: Allowance,
        stop: threading.Event,
        cost: int = 0,
        *,
        price: Price | None = None,
        sides: Sides | None = None,
        going: Callable[[], None] | None = None,
    ) -> Admission | Refusal:
        """Wait at every limit; an Admission, or the Refusal that ends the item instead.
        ``going``: see ``Admission.going``."""

    def abandon(self, admission: Admission) -> None:
        """Give back what an attempt that was never sent held."""

    def release(self, admission: Admission, feedback: Feedback) -> None:
        """Give back what an attempt held and tell each limit what it came to."""
