"""A budget of tokens per period (``token_rate``): each attempt takes its item's estimated
cost (``Task.cost``, an LLM request's tokens) before it is sent, and the answer sets the
estimate right.

The budget is a token bucket of one period's tokens that starts empty and fills at the rate:
a run's first period holds no more than the rate, and a quiet spell saves up at most one
period's (the provider's own window emptied meanwhile). After an answer, what the provider
said stands over the estimate: the tokens it says are left (``x-ratelimit-remaining-tokens``,
Anthropic's ``anthropic-ratelimit-tokens-remaining``), less what attempts sent after the
answered one took, cap what the budget holds; without that header, the tokens the answer
says it used (its ``usage``) replace the estimate, giving back or taking more. (OpenAI counts
a request at admission from its size and ``max_tokens``: there the estimate already is the
provider's count, and the header agrees.) ``AnnouncedRates`` is ``rate="auto"``: the budgets
taken from the limits the provider's headers announce.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .clock import Clock
from .gates import Admission, Waiting
from .limits import GateOption, RateLimiter, SharedLimits, TokenBucket
from .rates import Rate, parse_rate
from .tokens import estimate_tokens
from .verdict import ErrorKind, Feedback, InvalidItem


@dataclass(frozen=True)
class TokenRate(GateOption):
    """``token_rate``: at most ``rate.count`` tokens per ``rate.period`` over all workers (and
    all processes sharing ``--redis``)."""

    rate: Rate

    @classmethod
    def of(cls, value: TokenRate | float | str) -> TokenRate:
        """The option from what a user wrote: ``"200000/min"``, ``"5000/s"``, a number a
        second; a ValueError naming the accepted forms otherwise."""
        return value if isinstance(value, TokenRate) else cls(parse_rate(value, name="token_rate"))

    def too_costly(self, cost: int) -> str | None:
        """Why an item of ``cost`` tokens can never be sent under this budget; None when it can."""
        if cost <= self.rate.count:
            return None
        return f"needs about {cost} tokens, more than the token_rate of {self.rate} allows at once"

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> BudgetGate:
        rate, capacity = self.rate.per_second, self.rate.count
        if shared is None:
            return BudgetGate(TokenBucket(rate, capacity, clock.now, start=0.0))
        return BudgetGate(shared.token_bucket(rate, capacity, name="tokens", start=0.0))

    def __str__(self) -> str:
        return str(self.rate)


class BudgetGate:
    """Takes each attempt's cost from the budget, waiting for it as the rate token is waited
    for; its hold: the cost taken, reconciled on ``release`` and given back on ``abandon``."""

    rank = 65
    recheck = False

    def __init__(self, budget: RateLimiter, *, name: str = "tokens") -> None:
        self.budget = budget
        self.name = name
        # Tokens taken so far, all attempts together: what was taken after an attempt, the
        # remaining-tokens header of that attempt's answer does not count yet.
        self._taken = 0
        self._lock = threading.Lock()

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        cost = admission.cost
        if cost <= 0:
            return None
        refusal = waiting.sleep(self.name, self.budget.reserve(cost), admission)
        if refusal is not None:
            self.budget.refund(cost)
            return refusal
        with self._lock:
            self._taken += cost
            admission.held[self.name] = (cost, self._taken)
        return None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        held = admission.held.get(self.name)
        if held is None:
            return
        cost, taken = held
        left = None if feedback.announced is None else feedback.announced.tokens_remaining
        if left is not None:  # (less what was taken since: that is not counted in it yet)
            self.budget.at_most(left - (self._taken - taken))
        elif feedback.used is not None and feedback.used != cost:
            self.budget.reserve(feedback.used - cost)

    def abandon(self, admission: Admission) -> None:
        held = admission.held.get(self.name)
        if held is not None:
            with self._lock:
                self._taken -= held[0]
            self.budget.refund(held[0])


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
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 0:
            raise InvalidItem(f"cost must give a whole number of tokens, 0 or more: got {weight!r}")
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
    if not isinstance(used, int) or isinstance(used, bool) or used < 0:
        return None
    return used


@dataclass(frozen=True)
class AnnouncedRates(GateOption):
    """``rate="auto"``: the budgets a provider's headers announce (OpenAI's and Anthropic's
    requests and tokens a minute), taken up from the first answer that tells them; the
    tokens' only when the run has no ``token_rate`` of its own."""

    tokens: bool = True

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> AnnouncedGate:
        def bucket(name: str, per_minute: int, burst: float, start: float) -> RateLimiter:
            if shared is None:
                return TokenBucket(per_minute / 60.0, burst, clock.now, start=start)
            return shared.token_bucket(per_minute / 60.0, burst, name=name, start=start)

        return AnnouncedGate(bucket, tokens=self.tokens)


class AnnouncedGate:
    """Passes every attempt until an answer announces the provider's limits, then holds them
    to those: a request rate (one at a time, no burst: providers enforce a minute's limit over
    shorter spans too) and a token budget as ``BudgetGate``'s."""

    name = "announced"
    rank = 62
    recheck = False

    def __init__(
        self, bucket: Callable[[str, int, float, float], RateLimiter], *, tokens: bool
    ) -> None:
        self._bucket = bucket
        self._learn_tokens = tokens
        self._lock = threading.Lock()
        self.requests: RateLimiter | None = None
        self.tokens: BudgetGate | None = None

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        requests, tokens = self.requests, self.tokens
        if requests is not None:
            refusal = waiting.sleep(self.name, requests.reserve(), admission)
            if refusal is not None:
                requests.refund()
                return refusal
            admission.held[self.name] = requests
        if tokens is not None:
            refusal = tokens.admit(admission, waiting)
            if refusal is not None:
                self.abandon(admission)
                return refusal
        return None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        if self.tokens is not None:
            self.tokens.release(admission, feedback)
        said = feedback.announced
        if said is not None and (self.requests is None or self.tokens is None):
            self._learn(said.requests_limit, said.tokens_limit)

    def abandon(self, admission: Admission) -> None:
        requests = admission.held.pop(self.name, None)
        if requests is not None:
            requests.refund()
        if self.tokens is not None:
            self.tokens.abandon(admission)

    def _learn(self, requests_limit: int | None, tokens_limit: int | None) -> None:
        with self._lock:
            if self.requests is None and requests_limit:
                self.requests = self._bucket("announced-requests", requests_limit, 1.0, 1.0)
            if self.tokens is None and self._learn_tokens and tokens_limit:
                budget = self._bucket("announced-tokens", tokens_limit, tokens_limit, 0.0)
                self.tokens = BudgetGate(budget, name="announced-tokens")
