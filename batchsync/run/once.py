"""One resilient call: retries, fallbacks and the result envelope around a single call.

``call(fn, *args, ...)`` and the decorator ``@resilient(...)`` run one call through the same
engine and job as ``run_all``; ``Limits`` are the rate, breaker and cooldown that a loop of
single calls, or the threads of a web handler, share.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, Unpack, overload

from ..core.backoff import Backoff
from ..core.redact import Secrets
from ..core.result import AttemptRecord, Result
from ..jobs.calls import CallArguments
from ..jobs.options import CALL_DEFAULT, CallOptions, FlowOptions, build
from ..jobs.settings import CallSettings
from ..limits.breaker import Breaker
from ..limits.cooldown import CooldownScope
from ..limits.gates import Gates
from ..limits.tokenrate import TokenRate
from .assembly import call_once, gates_for
from .batch import refuse_async

P = ParamSpec("P")
T = TypeVar("T")


class Limits:
    """Limits kept across calls and threads: a rate, budgets of LLM tokens, a circuit
    breaker and a cooldown per key (``key=`` of ``call``; one key for all without it). Give
    the same object to every call that should share them; ``limits="redis://…"`` shares
    them with other processes too."""

    def __init__(
        self,
        *,
        rate: float | str | None = CALL_DEFAULT.rate,
        token_rate: TokenRate | float | str | None = CALL_DEFAULT.token_rate,
        input_token_rate: TokenRate | float | str | None = CALL_DEFAULT.input_token_rate,
        output_token_rate: TokenRate | float | str | None = CALL_DEFAULT.output_token_rate,
        breaker: Breaker | None = CALL_DEFAULT.breaker,
        cooldown: CooldownScope = CALL_DEFAULT.cooldown,
        limits: Any = CALL_DEFAULT.limits,
        namespace: str = CALL_DEFAULT.namespace,
        lease_ttl: float = CALL_DEFAULT.lease_ttl,
    ) -> None:
        options = build(
            FlowOptions,
            rate=rate,
            token_rate=token_rate,
            input_token_rate=input_token_rate,
            output_token_rate=output_token_rate,
            breaker=breaker,
            cooldown=cooldown,
            limits=limits,
            namespace=namespace,
            lease_ttl=lease_ttl,
        )
        self.gates: Gates = gates_for(options)
        self.options = options  # (its token budgets weigh each call)
        # (the Redis URL's password, masked in what the calls sharing these limits report)
        self.secrets: Secrets = options.secrets()


def call(
    fn: Callable[..., T],
    /,
    *args: Any,
    attempts: int = CALL_DEFAULT.attempts,
    budget: float = CALL_DEFAULT.budget,
    backoff: Backoff = CALL_DEFAULT.backoff,
    retry_if: Callable[[BaseException], bool] | None = CALL_DEFAULT.retry_if,
    fallbacks: tuple[Callable[..., T], ...] | list[Callable[..., T]] = (),
    idempotency_key: str | None = None,
    key: str | None = None,
    limits: Limits | None = None,
    cost: Callable[..., int] | None = CALL_DEFAULT.cost,
    usage: Callable[[Any], int | None] | None = CALL_DEFAULT.usage,
    on_attempt: Callable[[Any, AttemptRecord], None] | None = CALL_DEFAULT.on_attempt,
    on_result: Callable[[Result], None] | None = CALL_DEFAULT.on_result,
    **kwargs: Any,
) -> Result:
    """``fn(*args, **kwargs)`` with retries, as one item of ``run_all``: never raises what
    ``fn`` raises; the Result says what happened (``data`` is what ``fn`` returned).

    ``fallbacks`` are called with the same arguments, in order, after ``fn`` has used up its
    attempts on a retryable failure; ``idempotency_key`` is passed to ``fn`` (and to each
    fallback) as that keyword argument, the same on every attempt, for SDKs that take one.
    ``limits`` (shared ``Limits``) make the call wait for the rate, a cooldown and an open
    circuit of ``key``, as a batch's items do; without it the call has no limits. With a
    ``token_rate`` (or ``input_token_rate``, ``output_token_rate``) in them, the call weighs
    ``cost(*args, **kwargs)`` tokens (default: the estimate of its keyword arguments as a
    request body) until ``usage(returned)`` (default: its ``.usage``) or the provider's
    headers say what it used. The
    keyword arguments named as this function's options are its own, not ``fn``'s: to pass
    ``fn`` an argument called ``key``, say, wrap it (``lambda: fn(key=…)``).
    """
    if idempotency_key is not None:
        kwargs = {**kwargs, "idempotency_key": idempotency_key}
    refuse_async(fn)
    options = _options(
        fallbacks,
        key,
        attempts=attempts,
        budget=budget,
        backoff=backoff,
        retry_if=retry_if,
        on_attempt=on_attempt,
        on_result=on_result,
        token_rate=None if limits is None else limits.options.token_rate,
        input_token_rate=None if limits is None else limits.options.input_token_rate,
        output_token_rate=None if limits is None else limits.options.output_token_rate,
        cost=None if cost is None else _unpacking(cost),
        usage=usage,
    )
    return _call(fn, args, kwargs, options, limits)


@overload
def resilient(fn: Callable[P, Any], /) -> Callable[P, Result]: ...


@overload
def resilient(
    *,
    attempts: int = ...,
    budget: float = ...,
    backoff: Backoff = ...,
    retry_if: Callable[[BaseException], bool] | None = ...,
    fallbacks: tuple[Callable[..., Any], ...] | list[Callable[..., Any]] = ...,
    key: str | None = ...,
    rate: float | str | None = ...,
    breaker: Breaker | None = ...,
    cooldown: CooldownScope = ...,
    limits: Limits | None = ...,
) -> Callable[[Callable[P, Any]], Callable[P, Result]]: ...


def resilient(
    fn: Callable[P, Any] | None = None,
    /,
    *,
    attempts: int = CALL_DEFAULT.attempts,
    budget: float = CALL_DEFAULT.budget,
    backoff: Backoff = CALL_DEFAULT.backoff,
    retry_if: Callable[[BaseException], bool] | None = CALL_DEFAULT.retry_if,
    fallbacks: tuple[Callable[..., Any], ...] | list[Callable[..., Any]] = (),
    key: str | None = None,
    rate: float | str | None = CALL_DEFAULT.rate,
    breaker: Breaker | None = CALL_DEFAULT.breaker,
    cooldown: CooldownScope = CALL_DEFAULT.cooldown,
    limits: Limits | None = None,
) -> Callable[P, Result] | Callable[[Callable[P, Any]], Callable[P, Result]]:
    """A decorator (``@resilient`` or ``@resilient(...)``): the function, called, returns
    the Result of ``call`` instead of raising.

    Its calls share one ``Limits`` made here from ``rate``, ``breaker`` and ``cooldown``, or
    the ``limits`` given (to share with other functions; then give those three to it).
    """
    own = (rate, breaker, cooldown) != (CALL_DEFAULT.rate, CALL_DEFAULT.breaker, "host")
    if limits is not None and own:
        raise ValueError("give rate, breaker and cooldown to the Limits, not beside it")
    shared = limits or Limits(rate=rate, breaker=breaker, cooldown=cooldown)
    options = _options(
        fallbacks, key, attempts=attempts, budget=budget, backoff=backoff, retry_if=retry_if
    )

    def decorate(function: Callable[P, Any]) -> Callable[P, Result]:
        refuse_async(function)

        @functools.wraps(function)
        def resilient_call(*args: P.args, **kwargs: P.kwargs) -> Result:
            return _call(function, args, kwargs, options, shared)

        return resilient_call

    return decorate if fn is None else decorate(fn)


def _options(
    fallbacks: tuple[Callable[..., Any], ...] | list[Callable[..., Any]],
    key: str | None,
    /,
    **settings: Unpack[CallSettings],
) -> CallOptions:
    """A single call's options: ``run_all``'s, for one item with the call's arguments."""
    if callable(fallbacks):
        raise ValueError("fallbacks must be a list of callables")
    return build(
        CallOptions,
        concurrency=1,
        fallbacks=tuple(_unpacking(f) for f in fallbacks),
        per_key=None if key is None else (lambda packed: key),
        **settings,
    )


def _call(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    options: CallOptions,
    limits: Limits | None,
) -> Result:
    gates, secrets = (None, options.secrets()) if limits is None else (limits.gates, limits.secrets)
    packed = CallArguments(args, kwargs)
    return call_once(options, _unpacking(fn), packed, gates=gates, secrets=secrets)


def _unpacking(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with the arguments the item packs (a fallback is also handed the Result
    so far, which it does not take)."""

    def unpacked(packed: tuple[tuple[Any, ...], dict[str, Any]], *so_far: Any) -> Any:
        args, kwargs = packed
        return fn(*args, **kwargs)

    return unpacked
