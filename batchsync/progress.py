"""A progress bar (tqdm.auto) fed by Results, redrawn a few times a second by its own thread."""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import NoReturn

from tqdm.auto import tqdm

from .result import Result

REFRESH_SECONDS = 0.25


def wanted(progress: bool | None) -> bool:
    """True/False as given; None means on when stderr is a terminal."""
    if progress is not None:
        return progress
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """Counts Results as they come (a lock and two additions each) and redraws off the hot path.

    Use as a context manager; calling the object records one Result.
    """

    def __init__(self, total: int | None, enabled: bool) -> None:
        self._enabled = enabled
        self._total = total
        self._lock = threading.Lock()
        self._done = 0
        self._failed = 0
        self._requests = 0
        self._closing = threading.Event()
        self._bar: tqdm[NoReturn] | None = None
        self._painter: threading.Thread | None = None

    def __call__(self, result: Result) -> None:
        with self._lock:
            self._done += 1
            self._requests += result.attempts
            if not result.ok:
                self._failed += 1

    @property
    def requests(self) -> int:
        """Requests sent for the Results counted so far."""
        with self._lock:
            return self._requests

    def __enter__(self) -> Progress:
        if self._enabled:
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
            done, failed = self._done, self._failed
        self._bar.n = done
        self._bar.set_postfix(ok=done - failed, failed=failed, refresh=False)
        self._bar.refresh()
