"""Counting a run's results, and a progress bar (tqdm.auto) redrawn by its own thread."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, NoReturn

from tqdm.auto import tqdm

from .observe import Observer
from .result import AttemptRecord, Result

if TYPE_CHECKING:
    from .engine import Task

REFRESH_SECONDS = 0.25


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where tqdm.auto draws a widget)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__module__.startswith("ipykernel")


def wanted(progress: bool | None) -> bool:
    """True/False as given; None means on for a terminal or a notebook, off otherwise."""
    if progress is not None:
        return progress
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty()) or in_notebook()


class Tally(Observer):
    """Counts finished items, failures and requests sent: a lock and three additions per item.

    A context manager, like Progress, so either serves the same ``with`` block.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = 0
        self._failed = 0
        self._requests = 0

    def item_finished(self, result: Result) -> None:
        with self._lock:
            self._done += 1
            self._requests += result.attempts
            if not result.ok:
                self._failed += 1

    @property
    def requests(self) -> int:
        """Requests sent for the items finished so far."""
        with self._lock:
            return self._requests

    def __enter__(self) -> Tally:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class Progress(Tally):
    """A Tally shown as a bar — done/total, ok, failed, items waiting to retry, requests/s —
    that its own thread redraws a few times a second, off the hot path."""

    def __init__(self, total: int | None) -> None:
        super().__init__()
        self._total = total
        self._retrying: set[int] = set()
        self._started = time.monotonic()
        self._closing = threading.Event()
        self._bar: tqdm[NoReturn] | None = None
        self._painter: threading.Thread | None = None

    def attempt_started(self, index: int) -> None:
        if self._retrying:
            with self._lock:
                self._retrying.discard(index)

    def attempt_finished(self, index: int, task: Task, record: AttemptRecord) -> None:
        if record.wait is not None:
            with self._lock:
                self._retrying.add(index)

    def item_finished(self, result: Result) -> None:
        super().item_finished(result)
        if self._retrying:
            with self._lock:
                self._retrying.discard(result.index)

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        self._bar = tqdm(total=self._total, unit="item", dynamic_ncols=True)
        self._painter = threading.Thread(
            target=self._paint_until_closed, name="batchsync-progress", daemon=True
        )
        self._painter.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._closing.set()
        if self._painter is not None:
            self._painter.join()
        if self._bar is not None:
            self._paint()
            self._bar.close()

    def _paint_until_closed(self) -> None:
        while not self._closing.wait(REFRESH_SECONDS):
            self._paint()

    def _paint(self) -> None:
        assert self._bar is not None
        with self._lock:
            done, failed, requests, retrying = (
                self._done, self._failed, self._requests, len(self._retrying)
            )  # fmt: skip
        rate = requests / max(time.monotonic() - self._started, 1e-9)
        self._bar.n = done
        self._bar.set_postfix(
            ok=done - failed, failed=failed, retrying=retrying, req_s=f"{rate:.0f}", refresh=False
        )
        self._bar.refresh()


def counter(total: int | None, show: bool) -> Tally:
    """A Progress bar when it is to be shown, else a plain Tally."""
    return Progress(total) if show else Tally()
