"""Watching a run: the Observer interface the engine reports to, and the caller's hooks.

Observers are called from worker threads as things happen. The progress bar, metrics and
tracing are observers; so are the ``on_attempt`` / ``on_result`` hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .result import AttemptRecord, Result, Summary

if TYPE_CHECKING:
    from .task import Task

log = logging.getLogger("batchsync")


class Observer:
    """Does nothing; subclasses override what they want to see. Must be thread-safe."""

    def item_started(self, index: int, task: Task) -> None:
        """A worker took the item and is about to make its first attempt."""

    def attempt_started(self, index: int) -> None:
        """An attempt passed the gates and is being sent."""

    def attempt_finished(self, index: int, task: Task, record: AttemptRecord) -> None:
        """An attempt ended; ``record.wait`` is set when the item now waits to retry."""

    def item_finished(self, result: Result) -> None:
        """The item's final Result (also for items never started and copies of dedup)."""


@dataclass(frozen=True)
class Hooks(Observer):
    """The caller's ``on_attempt(spec, record)`` and ``on_result(result)``."""

    on_attempt: Callable[[Any, AttemptRecord], None] | None
    on_result: Callable[[Result], None] | None

    def attempt_finished(self, index: int, task: Task, record: AttemptRecord) -> None:
        if self.on_attempt is not None:
            self.on_attempt(task.subject, record)

    def item_finished(self, result: Result) -> None:
        if self.on_result is not None:
            self.on_result(result)


class Observers(Observer):
    """Tells every observer; one that raises is logged and never ends a worker or an item.

    Only the observers that override an event are called for it, and ``sees_*`` say whether
    any does: the engine does not tell an event that no observer looks at.
    """

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        present = tuple(observers)

        def overriding(event: str) -> tuple[Callable[..., None], ...]:
            base = getattr(Observer, event)
            return tuple(
                getattr(o, event) for o in present if getattr(type(o), event, base) is not base
            )

        self._item_started = overriding("item_started")
        self._attempt_started = overriding("attempt_started")
        self._attempt_finished = overriding("attempt_finished")
        self._item_finished = overriding("item_finished")
        self.sees_item_started = bool(self._item_started)
        self.sees_attempt_started = bool(self._attempt_started)
        self.sees_attempt_finished = bool(self._attempt_finished)
        self.sees_item_finished = bool(self._item_finished)

    @staticmethod
    def _tell(calls: tuple[Callable[..., None], ...], *args: object) -> None:
        for call in calls:
            try:
                call(*args)
            except Exception:
                _log_raised(call)

    def item_started(self, index: int, task: Task) -> None:
        self._tell(self._item_started, index, task)

    def attempt_started(self, index: int) -> None:
        self._tell(self._attempt_started, index)

    def attempt_finished(self, index: int, task: Task, record: AttemptRecord) -> None:
        self._tell(self._attempt_finished, index, task, record)

    def item_finished(self, result: Result) -> None:
        for call in self._item_finished:  # (not through _tell: every item's, the tally's)
            try:
                call(result)
            except Exception:
                _log_raised(call)


def _log_raised(call: Callable[..., None]) -> None:
    log.exception("a batchsync hook or observer raised in %s; carrying on", call.__name__)


def log_summary(results: Callable[[], Summary]) -> None:
    """One record for a finished (or interrupted) run, with its counts as ``extra`` fields.

    ``results`` makes the Summary, only when the record is wanted.
    """
    if not log.isEnabledFor(logging.INFO):
        return
    summary = results()
    counts = {name: getattr(summary, name) for name in ("total", "ok", "failed", "error_kinds")}
    extra = counts | {"requests": summary.requests_sent, "elapsed": summary.elapsed}
    log.info("batch done: %s", summary, extra=extra)
