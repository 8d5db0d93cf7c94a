"""A cap on what a run spends (``max_cost``), priced by the user's own table (``prices``).

Before an attempt is sent, its worst case is reserved: every byte of its body as sent counted
as an input token (a byte-level tokenizer never makes more tokens than bytes), plus four a
message, two for the reply and a thousand for the system prompt a provider adds to a body
that offers tools, at the model's input price, and its completion allowance (``max_tokens``
times ``n``, or ``best_of``) at the output price. The answer's ``usage`` then replaces the
reservation; an answer that says none, or no answer at all, is charged the worst case. No
attempt is let through while what was spent, what is reserved and its own worst case would
go over the cap, so the cap holds whatever is in flight. Amounts are whole pico-dollars, so
the sums are exact.

No price is ever guessed: a body without a ``model`` the table prices, without a completion
allowance, or with parts the input bound cannot hold (images, audio, files) is refused.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from ..core.admission import PICO, Admission
from ..core.clock import Clock
from ..core.verdict import ErrorKind, Feedback, InvalidItem, Usage
from .gate import GateOption, Waiting
from .shared import SharedLimits, SpendLedger, SpendStore
from .tokens import completion_allowance

_PER = 10**6  # prices are per million tokens
_MESSAGE_OVERHEAD, _REPLY_PRIMING = 4, 2
# A body that offers tools gets a system prompt the provider adds of its own, whose tokens
# its bytes do not hold (Anthropic documents a few hundred): this many are reserved for it.
_TOOLS, _TOOL_PROMPT = ("tools", "functions"), 1000
# Parts whose tokens a body's bytes do not bound (an image's URL is short, its tokens many),
# by their type or a key of theirs; a tool of any type but a function the caller runs (the
# provider's own: a search, a fetch, a code run) bills what it reads; and a body naming input
# kept elsewhere (an earlier answer, a stored prompt or conversation, a cache) or asking for
# audio out.
_UNBOUNDED = frozenset(
    {"image", "image_url", "input_image", "audio", "input_audio", "file", "input_file",
     "document", "video", "video_url", "input_video", "file_id", "file_data"}
)  # fmt: skip
_PAYLOADS = frozenset({"image_url", "input_audio", "video_url"})  # (a part without its type)
_CALLERS_TOOLS = frozenset({None, "function", "custom"})
_ELSEWHERE = ("previous_response_id", "conversation", "cached_content", "audio")
_DEPTH = 8
# Dollars a million tokens: at most a million, to the millionth of a cent (so that a price
# reads quickly and exactly).
_PRICE_STEP = Decimal("1e-8")


def _eight_places_at_most(price: Decimal) -> Decimal:
    """The price when it has at most 8 decimal places. (pydantic's ``decimal_places`` before
    2.14 rounds the value in the default context first: 1e-999999999 went through as 0, and
    its exact sums would carry a billion digits.)"""
    if price != price.quantize(_PRICE_STEP):
        raise ValueError("a price has at most 8 decimal places")
    return price


Price = Annotated[
    Decimal, Field(ge=0, le=10**6, allow_inf_nan=False), AfterValidator(_eight_places_at_most)
]
_MOST_DOLLARS = 10**9  # the largest cap


class ModelPrice(BaseModel):
    """One model's prices, in dollars per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    input: Price
    output: Price


class Prices(BaseModel):
    """The user's price table: ``models`` by name, and ``batch``, the factor the batch
    endpoint's prices are of the live ones (0.5: half price); None when not given."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    models: dict[str, ModelPrice]
    batch: Annotated[Decimal, Field(gt=0, le=1, allow_inf_nan=False)] | None = None

    @classmethod
    def of(cls, value: object) -> Prices:
        """The table from a ``Prices``, a mapping of its fields, or the path of a JSON file
        of them; a ValueError in one line otherwise."""
        if isinstance(value, Prices):
            return value
        if isinstance(value, str | Path):
            try:
                value = json.loads(Path(value).read_text("utf-8"), parse_float=Decimal)
            except (OSError, ValueError) as exc:
                raise ValueError(f"cannot read {str(value)!r}: {exc}") from None
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            problem = exc.errors()[0]
            where = ".".join(str(part) for part in problem["loc"])
            raise ValueError(f"{where}: {problem['msg']}") from None

    def per_million(self, model: object, *, batch: bool) -> tuple[Fraction, Fraction]:
        """The input and output prices of ``model``, in pico-dollars a million tokens, at the
        batch factor when ``batch``; Unpriced when the table cannot say."""
        price = self.models.get(model) if isinstance(model, str) else None
        if price is None:
            raise Unpriced(f"no price for model {model!r} in the price table")
        if batch and self.batch is None:
            raise Unpriced("the price table gives no batch factor")
        factor = Fraction(self.batch) if batch and self.batch is not None else Fraction(1)
        return Fraction(price.input) * PICO * factor, Fraction(price.output) * PICO * factor


class Unpriced(InvalidItem):
    """A request whose worst case cannot be priced: it is never sent under a cap."""

    kind = "cost"


def dollars(value: object) -> int:
    """A cap in dollars as whole pico-dollars, rounded down; a ValueError unless a finite
    amount of at least 0."""
    try:
        if isinstance(value, bool) or not isinstance(value, Decimal | float | int | str):
            raise InvalidOperation
        amount = Decimal(str(value))
        if not amount.is_finite() or not 0 <= amount <= _MOST_DOLLARS:
            raise InvalidOperation
        return math.floor(amount * PICO)
    except ArithmeticError:  # (decimal's Overflow and InvalidOperation among them)
        raise ValueError(
            f"max_cost must be an amount of dollars from 0 to {_MOST_DOLLARS}, got {value!r}"
        ) from None


def charge(tokens: int, per_million: Fraction) -> int:
    """``tokens`` at ``per_million`` pico-dollars a million, rounded up."""
    return math.ceil(tokens * per_million / _PER)


# What an answer that came with an error status used: nothing (providers bill no failure).
NOTHING: Usage = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class Priced:
    """One request under a cap: the most input and output tokens one attempt of it can take,
    and its model's input and output prices, in pico-dollars a million tokens; ``model``: its
    name in the price table."""

    inputs: int
    outputs: int
    input: Fraction
    output: Fraction
    model: str = ""

    @property
    def worst(self) -> int:
        """The most one attempt can cost, in pico-dollars."""
        return charge(self.inputs, self.input) + charge(self.outputs, self.output)

    def spent(self, usage: Usage | None) -> int:
        """What an attempt cost by its answer's ``usage``, a side it does not say (or says in
        no count) at its worst case; a usage that gives only a total, at the dearer price."""
        if usage is None:
            return self.worst
        inputs, outputs, total = usage
        if inputs is None and outputs is None and total is not None:
            return charge(total, max(self.input, self.output))
        inputs = self.inputs if inputs is None else inputs
        return charge(inputs, self.input) + charge(
            self.outputs if outputs is None else outputs, self.output
        )


def priced(body: object, prices: Prices, *, batch: bool = False) -> Priced:
    """The request ``body`` (a JSON mapping as sent) priced by ``prices``, its worst case as
    the module says; Unpriced when it has no bound or no price."""
    if not isinstance(body, Mapping):
        raise Unpriced("only a JSON request body can be priced")
    model = body.get("model")
    input_price, output_price = prices.per_million(model, batch=batch)
    allowance = completion_allowance(body)
    if allowance is None:
        raise Unpriced("no max_tokens: its output has no bound to reserve")
    if _elsewhere(body) or _unbounded(body, 0):
        raise Unpriced(
            "images, audio, video, files, server-side tools and stored prompts or "
            "conversations have no bound a body's size gives"
        )
    messages = body.get("messages")
    framing = _MESSAGE_OVERHEAD * len(messages) if isinstance(messages, list) else 0
    sent = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    offered = _TOOL_PROMPT if any(body.get(key) for key in _TOOLS) else 0
    inputs = len(sent) + framing + _REPLY_PRIMING + offered
    return Priced(inputs, allowance, input_price, output_price, str(model))


def _elsewhere(body: Mapping[str, object]) -> bool:
    """Whether the body names input kept elsewhere, the provider's own tools or audio out."""
    modalities, tools = body.get("modalities"), body.get("tools")
    if isinstance(modalities, list) and "audio" in modalities:
        return True
    if isinstance(tools, list) and any(_servers(tool) for tool in tools):
        return True
    return isinstance(body.get("prompt"), Mapping) or any(map(body.get, _ELSEWHERE))


def _unbounded(value: object, depth: int) -> bool:
    """Whether ``value`` holds a part its size does not bound (or nests too deep to tell)."""
    if depth > _DEPTH:
        return True
    if isinstance(value, Mapping):
        if value.get("type") in _UNBOUNDED or not _PAYLOADS.isdisjoint(value):
            return True
        return any(_unbounded(inner, depth + 1) for inner in value.values())
    if isinstance(value, list):
        return any(_unbounded(inner, depth + 1) for inner in value)
    return False


def _servers(tool: object) -> bool:
    """Whether a tool is one the provider runs (any type but the caller's function)."""
    return isinstance(tool, Mapping) and tool.get("type") not in _CALLERS_TOOLS


@dataclass(frozen=True)
class MaxCost(GateOption):
    """``max_cost``: at most ``cap`` pico-dollars spent and reserved at any moment, over all
    workers."""

    cap: int
    prices: Prices

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> SpendGate:
        return SpendGate(Ledger(self.cap) if shared is None else shared.ledger(self.cap))


@dataclass
class Ledger:
    """What was spent and what is reserved, under ``cap``; with a ``store``, each reservation
    is stored before it is granted, and what earlier runs spent counts (their reservations
    not settled yet among it, at their worst case, until a later run settles them: a batch
    endpoint's part is often collected by another run than the one that sent it)."""

    cap: int
    spent: int = 0
    reserved: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)
    store: SpendStore | None = None
    # The stored reservations this ledger made itself (counted in ``reserved``, not ``spent``).
    _own: set[int] = field(default_factory=set)

    def keep(self, store: SpendStore | None) -> None:
        """Keep reservations in ``store`` from now on (None: in the process only), and count
        from what it says was spent (every reservation it holds unsettled among it)."""
        with self.changed:
            self.store = store
            if store is not None:
                self.spent, self.reserved = store.total(), 0
                self._own.clear()

    def fits(self, amount: int) -> bool | None:
        """Whether ``amount`` could be reserved now: None when only what is reserved stands
        in the way, False when what was spent already does."""
        with self.changed:
            if self.spent + amount > self.cap:
                return False
            return None if self.spent + self.reserved + amount > self.cap else True

    def reserve(self, amount: int) -> object | bool | None:
        """Reserve ``amount``: its number in the store (True without one) when done, None
        when only what is reserved stands in the way (an answer may free it), False when what
        was spent already does."""
        with self.changed:
            room = self.fits(amount)
            if not room:
                return room
            number = True if self.store is None else self.store.reserve(amount)
            if not isinstance(number, bool):
                self._own.add(number)
            self.reserved += amount
            return number

    def settle(self, mark: object, reserved: int, spent: int) -> None:
        """The reservation ``mark`` of ``reserved`` turned into ``spent`` (one an earlier run
        made, counted in ``spent`` at ``reserved``, unless the store had it settled already)."""
        with self.changed:
            number = mark if isinstance(mark, int) and not isinstance(mark, bool) else None
            settled = True
            if number is not None and self.store is not None:
                settled = self.store.settle(number, spent)
            if number is None or number in self._own:
                if number is not None:
                    self._own.discard(number)
                self.reserved -= reserved
                self.spent += spent
            elif settled:
                self.spent += spent - reserved
            self.changed.notify_all()

    def wait(self, seconds: float) -> None:
        with self.changed:
            self.changed.wait(seconds)


class KeptHere:
    """A spend store in memory (``SpendStore``), for a ``Batch`` without a journal: its next
    ``run()``, and a batch ``retry_failed`` remakes, count what it spent and what its parts
    still hold, as a journal's runs do."""

    def __init__(self) -> None:
        self._amounts: list[tuple[int, int | None]] = []  # (reserved, spent) by number - 1
        self._lock = threading.Lock()

    def total(self) -> int:
        with self._lock:
            return sum(reserved if spent is None else spent for reserved, spent in self._amounts)

    def reserve(self, amount: int) -> int:
        with self._lock:
            self._amounts.append((amount, None))
            return len(self._amounts)

    def settle(self, number: int, spent: int) -> bool:
        with self._lock:
            reserved, settled = self._amounts[number - 1]
            if settled is not None:
                return False
            self._amounts[number - 1] = (reserved, spent)
            return True


class SpendGate:
    """Holds each attempt until its worst case (``Admission.price``) fits under the cap;
    ends the item as ``cost`` once what was spent leaves it no room. What the attempt spent
    is left in ``Admission.spent``."""

    name = "spend"
    rank = 70
    recheck = False

    def __init__(self, ledger: SpendLedger) -> None:
        self.ledger = ledger

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        if admission.price is None:
            return None
        amount = admission.price.worst
        mark, refusal = waiting.poll(self.name, partial(self._reserved, amount), admission)
        if mark is None:
            return refusal
        if mark is False:
            rest = self.ledger.cap - self.ledger.spent
            admission.why = (
                f"its worst case, ${amount / PICO:.6f}, is more than the "
                f"${rest / PICO:.6f} of max_cost left"
            )
            return "cost"
        admission.held[self.name] = (mark, amount)
        return None

    def _reserved(self, amount: int, timeout: float) -> object | None:
        """The ledger's mark of ``amount`` reserved, False when it never can be, None (after
        waiting up to ``timeout`` for an answer) while what is reserved stands in the way."""
        mark = self.ledger.reserve(amount)
        if mark is None:
            self.ledger.wait(timeout)
        return mark

    def release(self, admission: Admission, feedback: Feedback) -> None:
        held = admission.held.pop(self.name, None)
        if held is not None and admission.price is not None:
            admission.spent = admission.price.spent(feedback.usage)
            number, amount = held
            self.ledger.settle(number, amount, admission.spent)

    def abandon(self, admission: Admission) -> None:
        """An attempt never sent spent nothing; one sent whose answer could not be read, its
        worst case."""
        held = admission.held.pop(self.name, None)
        if held is not None:
            number, amount = held
            self.ledger.settle(number, amount, 0 if admission.sent is None else amount)
