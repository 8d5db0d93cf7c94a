"""The one-call forms: ``run_all`` for any blocking callable, ``fetch_all`` for HTTP; and
``run_iter``/``fetch_iter``, the same yielding each Result as it comes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Unpack

from ..jobs.options import CallOptions, FetchOptions, spelled_out
from ..jobs.settings import CallSettings, FetchSettings
from ..output.resultset import ResultSet
from .batch import Batch, CallBatch, Item
from .stream import Stream


@spelled_out(FetchSettings, FetchOptions)
def fetch_all(
    items: Iterable[Item] | Iterable[Mapping[str, Any]],
    *,
    url: str | None = None,
    method: str = "GET",
    body: Any = None,
    id_field: str | None = None,
    journal: str | Path | None = None,
    fresh: bool = False,
    progress: bool | None = None,
    **options: Unpack[FetchSettings],
) -> ResultSet:
    """Fetch every item (a URL, a request mapping or a RequestSpec); one Result per item, in
    order. The one-call form of ``Batch(items, **options).run()``: the same options, with the
    same defaults (see ``help(Batch)`` and the options table in docs/library.md). ``headers`` go on
    every request and are treated as secrets: never logged, never sent to another host on a
    redirect.
    """
    return Batch(
        items,
        url=url,
        method=method,
        body=body,
        id_field=id_field,
        journal=journal,
        fresh=fresh,
        progress=progress,
        **options,
    ).run()


@spelled_out(CallSettings, CallOptions)
def run_all(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    journal: str | Path | None = None,
    fresh: bool = False,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
    progress: bool | None = None,
    **options: Unpack[CallSettings],
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
    return CallBatch(
        fn,
        items,
        journal=journal,
        fresh=fresh,
        encode=encode,
        decode=decode,
        progress=progress,
        **options,
    ).run()


@spelled_out(FetchSettings, FetchOptions)
def fetch_iter(
    items: Iterable[Item] | Iterable[Mapping[str, Any]],
    *,
    url: str | None = None,
    method: str = "GET",
    body: Any = None,
    id_field: str | None = None,
    journal: str | Path | None = None,
    fresh: bool = False,
    progress: bool | None = None,
    **options: Unpack[FetchSettings],
) -> Stream:
    """``fetch_all`` yielding each Result as it is kept, in the order they finish (``.index``
    is its item's): ``Batch(items, **options).stream()``. Leaving the loop stops the run as
    Ctrl-C does (as does closing it: ``with fetch_iter(...) as results:``); with
    ``journal=``, a later call goes on with the rest."""
    return Batch(
        items,
        url=url,
        method=method,
        body=body,
        id_field=id_field,
        journal=journal,
        fresh=fresh,
        progress=progress,
        **options,
    ).stream()


@spelled_out(CallSettings, CallOptions)
def run_iter(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    journal: str | Path | None = None,
    fresh: bool = False,
    encode: Callable[[Any], Any] | None = None,
    decode: Callable[[Any], Any] | None = None,
    progress: bool | None = None,
    **options: Unpack[CallSettings],
) -> Stream:
    """``run_all`` yielding each Result as it is kept, in the order they finish (``.index``
    is its item's): ``CallBatch(fn, items, **options).stream()``. Leaving the loop stops the
    run as Ctrl-C does (as does closing it); with ``journal=``, a later call goes on with the
    rest."""
    return CallBatch(
        fn,
        items,
        journal=journal,
        fresh=fresh,
        encode=encode,
        decode=decode,
        progress=progress,
        **options,
    ).stream()
