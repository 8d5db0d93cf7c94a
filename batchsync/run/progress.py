"""Counting a run's results, and a progress bar (tqdm.auto) redrawn by its own thread."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from tqdm.auto import tqdm

from ..core.observe import Observer
from ..core.result import AttemptRecord, Result
from ..limits.gate import Hold

if TYPE_CHECKING:
    from ..core.task import Task

REFRESH_SECONDS = 0.25
# A hold the bar names: one that has held a host's attempts this long without a break.
HELD_SHOWN_SECONDS = 3.0
# The gate holding a host's attempts longest right now, and what turns it off (``Gates.holding``).
Holding = Callable[[], tuple[Hold, str] | None]


def held_words(hold: Hold, off: str) -> str | None:
    """What the bar says of the longest hold going on: which gate, which host, for how long,
    and what turns it off; None while it is short (a cooldown of a second is no news)."""
    if hold.seconds < HELD_SHOWN_SECONDS:
        return None
    verb = "turns it off" if off.startswith("--") else "lets more through"
    hint = f"; {off} {verb}" if off else ""
    return f"{hold.gate} holds {hold.host} ({hold.attempts} waiting, {hold.seconds:.0f} s{hint})"


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
    """A Tally shown as a bar — done/total, ok, failed, items waiting to retry, requests/s,
    and a gate that has held a host's attempts a while (``holding``) — that its own thread
    redraws a few times a second, off the hot path."""

    def __init__(self, total: int | None, holding: Holding | None = None) -> None:
        super().__init__(total)
        self._holding = holding
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
        fields = {
            "ok": done - failed,
            "failed": failed,
            "retrying": retrying,
            "req_s": f"{rate:.0f}",
        }
        holding = None if self._holding is None else self._holding()
        held = None if holding is None else held_words(*holding)
        if held is not None:
            fields["held"] = held
        self._bar.set_postfix(fields, refresh=False)
        self._bar.refresh()


def counter(total: int | None, show: bool, holding: Holding | None = None) -> Tally:
    """A Progress bar when it is to be shown (naming what ``holding`` says holds the run),
    else a plain Tally."""
    return Progress(total, holding) if show else Tally(total)
