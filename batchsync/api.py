"""The one-call forms: ``run_all`` for any blocking callable, ``fetch_all`` for HTTP."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Sized
from pathlib import Path
from typing import Any, Concatenate, ParamSpec

from .assembly import call
from .backoff import Backoff
from .batch import Batch, CallBatch, Item
from .calls import CallJob
from .limits import Breaker, CooldownScope
from .observe import log_summary
from .options import CallOptions, build
from .progress import counter, wanted
from .result import AttemptRecord, Result, ResultSet

P = ParamSpec("P")
# run_all's defaults (CallOptions holds them).
CALL_DEFAULT = CallOptions()


def run_all(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    journal: str | Path | None = None,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
    progress: bool | None = None,
    concurrency: int = CALL_DEFAULT.concurrency,
    attempts: int = CALL_DEFAULT.attempts,
    budget: float = CALL_DEFAULT.budget,
    deadline: float | None = CALL_DEFAULT.deadline,
    retry_if: Callable[[BaseException], bool] | None = CALL_DEFAULT.retry_if,
    backoff: Backoff = CALL_DEFAULT.backoff,
    rate: float | None = CALL_DEFAULT.rate,
    per_key: Callable[[Any], str] | None = CALL_DEFAULT.per_key,
    cooldown: CooldownScope = CALL_DEFAULT.cooldown,
    breaker: Breaker | None = CALL_DEFAULT.breaker,
    adaptive: bool = CALL_DEFAULT.adaptive,
    fallbacks: tuple[Callable[[Any, Result | None], Any], ...] = CALL_DEFAULT.fallbacks,
    on_attempt: Callable[[Any, AttemptRecord], None] | None = CALL_DEFAULT.on_attempt,
    on_result: Callable[[Result], None] | None = CALL_DEFAULT.on_result,
    metrics: Any = CALL_DEFAULT.metrics,
    tracer: Any = CALL_DEFAULT.tracer,
    limits: Any = CALL_DEFAULT.limits,
    namespace: str = CALL_DEFAULT.namespace,
    lease_ttl: float = CALL_DEFAULT.lease_ttl,
) -> ResultSet:
    """Call ``fn(item)`` for every item with bounded concurrency, retries and the limits
    ``fetch_all`` has; one Result per item, in order. ``rs[i].data`` is what ``fn`` returned.

    Nothing ``fn`` raises escapes. An exception is retried when ``retry_if`` says so; without
    it, one carrying an HTTP status (``exc.status_code`` or ``exc.response.status_code``, as
    SDK and requests/httpx errors do) by the HTTP rules (429, 408, 5xx), any other when it is
    a timeout or a connection error (or ``Retryable``). A wait it names (``exc.retry_after``,
    or its response's Retry-After) is a floor under the backoff and, for a 429 or 503, holds
    every call of its key (``per_key``; all calls without it) like an HTTP Retry-After.

    With ``journal=``, each final Result is written to that SQLite file as it is made and a
    later ``run_all`` over the same items runs only the rest (``CallBatch``): what ``fn``
    returned is stored as JSON, through ``encode`` when given and read back through
    ``decode``.
    """
    given = locals()
    options = build(CallOptions, **{name: given[name] for name in CallOptions.model_fields})
    if journal is not None:
        batch = CallBatch(
            fn, items, options, journal=journal, progress=progress, encode=encode, decode=decode
        )
        return batch.run()
    started = time.monotonic()
    collector = _Collector()
    total = len(items) if isinstance(items, Sized) else None
    with counter(total, wanted(progress)) as bar:
        job = CallJob(fn, options, options.secrets())
        ran = call(options, job, enumerate(items), collector, progress=bar)
    results = ResultSet(
        collector.in_order(), elapsed=time.monotonic() - started, waits=ran.waits,
        circuits_opened=ran.circuits_opened,
    )  # fmt: skip
    log_summary(results.summary)
    return results


class _Collector:
    """Keeps Results by index; safe to call from any worker thread."""

    def __init__(self) -> None:
        self._by_index: dict[int, Result] = {}

    def __call__(self, result: Result, item: object) -> None:
        self._by_index[result.index] = result

    def in_order(self) -> list[Result]:
        return [self._by_index[index] for index in range(len(self._by_index))]


def _options_of(
    init: Callable[Concatenate[Batch, Iterable[Item], P], None],
) -> Callable[[Callable[..., ResultSet]], Callable[Concatenate[Iterable[Item], P], ResultSet]]:
    """Give the decorated function ``Batch``'s options: its parameters, for type checkers
    and for ``help()``, so that they are written (and defaulted) once."""

    def with_options(
        fn: Callable[..., ResultSet],
    ) -> Callable[Concatenate[Iterable[Item], P], ResultSet]:
        signature = inspect.signature(init)
        fn.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=list(signature.parameters.values())[1:], return_annotation=ResultSet
        )
        return fn

    return with_options


@_options_of(Batch.__init__)
def fetch_all(items: Iterable[Item], **options: Any) -> ResultSet:
    """Fetch every item (a URL, a request mapping or a RequestSpec); one Result per item, in
    order. The one-call form of ``Batch(items, **options).run()``: the same options, with the
    same defaults (see ``help(Batch)`` and the README's options table). ``headers`` go on
    every request and are treated as secrets: never logged, never sent to another host on a
    redirect.
    """
    return Batch(items, **options).run()
