"""The one-call forms: ``run_all`` for any blocking callable, ``fetch_all`` for HTTP."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Sized
from dataclasses import replace
from functools import partial
from typing import Any, Concatenate, ParamSpec

from .assembly import call
from .backoff import Backoff
from .batch import Batch, Item
from .classify import classify_raised, host_feedback, is_transient
from .engine import Job, Route, Task
from .observe import log_summary
from .options import EngineOptions, build
from .progress import counter, wanted
from .redact import Secrets
from .result import Result, ResultSet
from .spec import item_label
from .verdict import Feedback, Verdict, success

P = ParamSpec("P")
# Where run_all's defaults are read from (but its concurrency).
ENGINE_DEFAULT = EngineOptions()
# Secrets masked by their shape alone (URL userinfo, secret query parameters).
_SHAPES = Secrets()


class _Collector:
    """Keeps Results by index; safe to call from any worker thread."""

    def __init__(self) -> None:
        self._by_index: dict[int, Result] = {}

    def __call__(self, result: Result, item: object) -> None:
        self._by_index[result.index] = result

    def in_order(self) -> list[Result]:
        return [self._by_index[index] for index in range(len(self._by_index))]


def _run(
    job: Job, items: Iterable[object], options: EngineOptions, progress: bool | None
) -> ResultSet:
    collector = _Collector()
    total = len(items) if isinstance(items, Sized) else None
    started = time.monotonic()
    bar = counter(total, wanted(progress))
    with bar:
        call(options, job, enumerate(items), collector, progress=bar)
    results = ResultSet(collector.in_order(), elapsed=time.monotonic() - started)
    log_summary(results.summary)
    return results


class CallJob:
    """Runs a blocking callable per item; an attempt is one call, which cannot be cut short."""

    timeout = None

    def __init__(self, fn: Callable[[Any], Any], retry_if: Callable[[BaseException], bool]) -> None:
        self._fn = fn
        self._retry_if = retry_if

    def label(self, item: object) -> tuple[str | None, Any]:
        url, item_id = item_label(item)
        return (None if url is None else _SHAPES.url(url)), item_id

    def feedback(self, verdict: Verdict) -> Feedback:
        return host_feedback(verdict)

    def prepare(self, item: object) -> Task:
        url, item_id = self.label(item)
        return Task(url, item_id, Route(partial(self._call, item)), subject=item)

    def _call(self, item: object, ends_at: float | None, so_far: Result | None) -> Verdict:
        try:
            return success(self._fn(item))
        except Exception as exc:  # the caller's errors become Results, never crashes
            verdict = classify_raised(exc, self._retry_if)
            # (an exception's message may carry a URL with its key: ``for url: …?api_key=…``)
            return replace(verdict, error=_SHAPES.text(verdict.error or ""))


def run_all(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    *,
    concurrency: int = 4,  # (calls, often heavier than requests: fewer at once by default)
    attempts: int = ENGINE_DEFAULT.attempts,
    budget: float = ENGINE_DEFAULT.budget,
    deadline: float | None = ENGINE_DEFAULT.deadline,
    retry_if: Callable[[BaseException], bool] | None = None,
    backoff: Backoff = ENGINE_DEFAULT.backoff,
    progress: bool | None = None,
) -> ResultSet:
    """Call ``fn(item)`` for every item with bounded concurrency and retries.

    ``rs[i].data`` is what ``fn`` returned for ``items[i]``. An exception for which
    ``retry_if`` is true (by default: timeouts, connection errors, ``Retryable``) is retried;
    any other ends the item as a failure. Nothing ``fn`` raises escapes ``run_all``.
    """
    options = build(
        EngineOptions,
        concurrency=concurrency,
        attempts=attempts,
        budget=budget,
        deadline=deadline,
        backoff=backoff,
    )
    return _run(CallJob(fn, retry_if or is_transient), items, options, progress)


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
