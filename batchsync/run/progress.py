"""Counting a run's results, and a progress bar (tqdm.auto) redrawn by its own thread."""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, NoReturn

from tqdm.auto import tqdm

from ..core.observe import Observer
from ..core.result import AttemptRecord, Result

if TYPE_CHECKING:
    from ..core.task import Task

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


class _Counts:
    """One worker thread's share of a Tally."""

    __slots__ = ("done", "failed", "requests")

    def __init__(self) -> None:
        self.done = 0
        self.failed = 0
        self.requests = 0


class Tally(Observer):
    """Counts finished items, failures and requests sent.

    Each worker thread counts into its own share, so counting takes no lock; reading sums
    the shares (the bar does that a few times a second, the summary once).
    A context manager, like Progress, so either serves the same ``with`` block. ``total``:
    the items the run is to finish (None: not known).
    """

    def __init__(self, total: int | None = None) -> None:
        self.total = total
        self._lock = threading.Lock()
        self._local = threading.local()
        self._shares: list[_Counts] = []

    def _new_share(self) -> _Counts:
        share = self._local.share = _Counts()
        with self._lock:
            self._shares.append(share)
        return share

    def item_finished(self, result: Result) -> None:
        share: _Counts = getattr(self._local, "share", None) or self._new_share()
        share.done += 1
        share.requests += result.attempts
        if not result.ok:
            share.failed += 1

    def counts(self) -> tuple[int, int, int]:
        """(done, failed, requests) so far."""
        with self._lock:
            shares = list(self._shares)
        return (
            sum(share.done for share in shares),
            sum(share.failed for share in shares),
            sum(share.requests for share in shares),
        )

    @property
    def requests(self) -> int:
        """Requests sent for the items finished so far."""
        return self.counts()[2]

    def __enter__(self) -> Tally:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Progress(Tally):
    """A Tally shown as a bar — done/total, ok, failed, items waiting to retry, requests/s —
    that its own thread redraws a few times a second, off the hot path."""

    def __init__(self, total: int | None) -> None:
        super().__init__(total)
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
        self._bar = tqdm(total=self.total, unit="item", dynamic_ncols=True)
        self._painter = threading.Thread(
            target=self._paint_until_closed, name="batchsync-progress", daemon=True
        )
        self._painter.start()
        return self

    def __exit__(self, *exc: object) -> None:
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
        done, failed, requests = self.counts()
        with self._lock:
            retrying = len(self._retrying)
        rate = requests / max(time.monotonic() - self._started, 1e-9)
        self._bar.n = done
        self._bar.set_postfix(
            ok=done - failed, failed=failed, retrying=retrying, req_s=f"{rate:.0f}", refresh=False
        )
        self._bar.refresh()


def counter(total: int | None, show: bool) -> Tally:
    """A Progress bar when it is to be shown, else a plain Tally."""
    return Progress(total) if show else Tally(total)
