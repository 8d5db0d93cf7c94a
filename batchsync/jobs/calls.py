"""The job of a batch of calls: a blocking callable per item, the counterpart of ``fetch``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, replace
from functools import partial
from typing import Any, NamedTuple

from ..core.admission import GLOBAL
from ..core.redact import Secrets
from ..core.result import Result
from ..core.task import Route, Task
from ..core.verdict import InvalidItem, Usage, Verdict, success, terminal
from ..http.answers import taken
from ..http.classify import classify_raised, describe, headers_of, host_feedback
from ..http.httpfacts import facts_of
from ..http.quota import answer_limits
from ..http.spec import item_label
from ..limits.gates import Gates
from ..limits.tokenrate import item_cost, used_tokens
from ..limits.tokens import usage_parts
from .options import CallOptions


class CallArguments(NamedTuple):
    """One ``call``'s arguments: weighed at the token budgets by its keyword arguments, read
    as a request body (an SDK's ``create(model=…, messages=…, max_tokens=…)``)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(eq=False, repr=False)
class CallJob:
    """Runs ``fn(item)`` per item; an attempt is one call, which cannot be cut short.

    An exception becomes a Verdict (``classify.classify_raised``): its HTTP status and wait
    hint count as an HTTP answer's do, for the retry decision and for the limits of the
    item's key (``per_key``; one key for all without it).
    """

    timeout = None

    fn: Callable[[Any], Any]
    options: CallOptions
    secrets: Secrets
    gates: InitVar[Gates | None] = None
    unix_time: Callable[[], float] = time.time

    def __post_init__(self, gates: Gates | None) -> None:
        self._usage = self.options.usage_reader
        self._hedger = self.options.hedger(gates)

    def close(self) -> None:
        """End the hedging threads; a call that lost its race is not waited for (it cannot
        be cut short: it ends on its own, its answer dropped)."""
        if self._hedger is not None:
            self._hedger.close(wait=False)

    def label(self, item: object) -> tuple[str | None, Any]:
        url, item_id = item_label(item)
        return (None if url is None else self.secrets.url(url)), item_id

    feedback = staticmethod(host_feedback)

    def prepare(self, item: object) -> Task:
        try:
            body = item.kwargs if isinstance(item, CallArguments) else item
            cost, sides = item_cost(item, body, self.options.cost, self.options.token_rates)
        except InvalidItem as exc:
            raise InvalidItem(self._masked(str(exc))) from None
        key = None
        if self.options.per_key is not None:
            try:
                # (masked: the key is shown, in an open circuit's error)
                key = self._masked(str(self.options.per_key(item)))
            except Exception as exc:  # the caller's key function failing is that item's fault
                raise InvalidItem(f"per_key: {self._masked(describe(exc))}") from None
        fallbacks = fallback_routes(self.options.fallbacks, item, self._masked)
        route = Route(partial(self._call, item, key or GLOBAL), key)
        return Task(*self.label(item), route, fallbacks, subject=item, cost=cost, sides=sides)

    def _call(
        self, item: object, key: str, ends_at: float | None, so_far: Result | None
    ) -> Verdict:
        if self._hedger is None:
            return self._call_once(item)
        # (the loser of a race is not told: a call cannot be cut short)
        return self._hedger.run(lambda lost: self._call_once(item), key)

    def _call_once(self, item: object) -> Verdict:
        try:
            returned = self.fn(item)
        except Exception as exc:  # the caller's errors become Results, never crashes
            try:
                verdict = classify_raised(exc, self.options.retry_if, self.unix_time())
            except Exception as broken:  # retry_if raising: the item still says what happened
                error = f"{describe(exc)} (retry_if raised {describe(broken)})"
                verdict = terminal("exception", error)
            verdict = replace(verdict, error=self._masked(verdict.error or ""))
            return self._told(verdict, exc, None)
        used = None if self._usage is None else used_tokens(self._usage, returned)
        usage = usage_parts(returned, cached=True) if self.options.sides_read else None
        verdict = self._told(success(returned), returned, used, usage)
        return taken(verdict, self.options.retry_answers)

    def _told(
        self, verdict: Verdict, answer: object, used: int | None, usage: Usage | None = None
    ) -> Verdict:
        """``verdict`` with what an SDK's ``answer`` (a raw response, or an exception with one)
        says of the provider's limits, read as an HTTP answer's, and what it ``used`` (by side:
        ``usage``)."""
        headers = headers_of(answer)
        quota, announced = (
            (None, None) if headers is None else answer_limits(headers, self.unix_time)
        )
        if quota is None and announced is None and used is None and usage is None:
            return verdict
        facts = facts_of(verdict)._replace(quota=quota, announced=announced, used=used, usage=usage)
        return replace(verdict, facts=facts)

    def _masked(self, text: str) -> str:
        # (an exception's message may carry a URL with its key: ``for url: …?api_key=…``)
        return self.secrets.text(text)


def fallback_routes(
    fallbacks: Iterable[Callable[[Any, Result | None], Any]],
    subject: object,
    mask: Callable[[str], str],
) -> tuple[Route, ...]:
    """The routes of the caller's fallback functions, each called once with the item (its
    RequestSpec for HTTP) and the Result so far; its exception, ``mask``-ed, is that route's
    failure."""
    return tuple(
        Route(partial(_fall_back, fallback, subject, mask), gated=False, max_attempts=1)
        for fallback in fallbacks
    )


def _fall_back(
    fallback: Callable[[Any, Result | None], Any],
    subject: object,
    mask: Callable[[str], str],
    ends_at: float | None,
    so_far: Result | None,
) -> Verdict:
    try:
        return success(fallback(subject, so_far))
    except Exception as exc:
        return terminal("exception", mask(describe(exc)))
