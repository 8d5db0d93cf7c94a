"""OpenTelemetry traces of a run (the optional ``otel`` extra: opentelemetry-api).

One span per item, with a child span per attempt carrying its status, error kind and the
wait before the next one. Nothing happens when the API is not installed or no tracer
provider is configured.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ..core.observe import Observer
from ..core.result import AttemptRecord, Result

if TYPE_CHECKING:
    from ..core.task import Task


def tracer_for(explicit: Any) -> Any:
    """The tracer to use: the one given, else the configured global provider's, else None."""
    if explicit is not None:
        return explicit
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return provider.get_tracer("batchsync")


# The fields of an attempt's record and of an item's Result its span carries (and an attempt's
# ``wait``, as ``retry_wait``).
_ATTEMPT_FIELDS = ("attempt", "status_code", "error_kind", "fallback", "hedged")
_ITEM_FIELDS = ("ok", "attempts", "status_code", "error_kind", "fallback_used")


def _attributes(**values: object) -> dict[str, Any]:
    """OpenTelemetry takes no None values: leave those out."""
    return {f"batchsync.{name}": value for name, value in values.items() if value is not None}


class Tracing(Observer):
    """Opens and ends the spans as the engine reports; spans of items in flight are kept by
    index (each item is carried by one worker thread at a time)."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = tracer
        self._items: dict[int, Any] = {}
        self._attempts: dict[int, Any] = {}
        self._lock = threading.Lock()

    def item_started(self, index: int, task: Task) -> None:
        url = task.url  # (masked when the Task was made)
        span = self._tracer.start_span(
            "batchsync.item", attributes=_attributes(index=index, url=url, id=_plain(task.id))
        )
        with self._lock:
            self._items[index] = span

    def attempt_started(self, index: int) -> None:
        with self._lock:
            parent = self._items.get(index)
        context = None if parent is None else self._trace.set_span_in_context(parent)
        span = self._tracer.start_span("batchsync.attempt", context=context)
        with self._lock:
            self._attempts[index] = span

    def attempt_finished(self, index: int, task: Task, record: AttemptRecord) -> None:
        with self._lock:
            span = self._attempts.pop(index, None)
        taken = {name: getattr(record, name) for name in _ATTEMPT_FIELDS}
        self._end(span, record.error_kind, retry_wait=record.wait, **taken)

    def item_finished(self, result: Result) -> None:
        with self._lock:
            span = self._items.pop(result.index, None)
        error = None if result.ok else result.error or ""
        self._end(span, error, **{name: getattr(result, name) for name in _ITEM_FIELDS})

    def _end(self, span: Any, error: str | None, **attributes: object) -> None:
        """Set a span's attributes, mark it failed when there is an ``error``, and end it."""
        if span is None:
            return
        span.set_attributes(_attributes(**attributes))
        if error is not None:
            span.set_status(self._trace.StatusCode.ERROR, error)
        span.end()


def _plain(value: object) -> str | int | float | bool | None:
    """An item id as a span attribute: kept when it is a plain value, else its text."""
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)
