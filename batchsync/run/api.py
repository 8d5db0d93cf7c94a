"""The one-call forms: ``run_all`` for any blocking callable, ``fetch_all`` for HTTP."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, Concatenate, ParamSpec

from ..output.resultset import ResultSet
from .batch import Batch, CallBatch, Item

P = ParamSpec("P")


def _options_of(
    init: Callable[Concatenate[Any, P], None],
) -> Callable[[Callable[..., ResultSet]], Callable[P, ResultSet]]:
    """Give the decorated function the parameters of a batch class's ``__init__``, for type
    checkers and for ``help()``, so that they are written (and defaulted) once."""

    def with_options(fn: Callable[..., ResultSet]) -> Callable[P, ResultSet]:
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
    same defaults (see ``help(Batch)`` and the options table in docs/library.md). ``headers`` go on
    every request and are treated as secrets: never logged, never sent to another host on a
    redirect.
    """
    return Batch(items, **options).run()


@_options_of(CallBatch.__init__)
def run_all(fn: Callable[[Any], Any], items: Iterable[Any], **options: Any) -> ResultSet:
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
    return CallBatch(fn, items, **options).run()
