"""A clock for tests whose time moves only when the code under test waits on it."""

from __future__ import annotations

import threading
from collections.abc import Callable

from batchsync.core.clock import Clock


class FakeClock(Clock):
    """A wait ends at once: at its end, or at the first action due (``at``) that sets the
    event it waits on; time-dependent code runs without sleeping, the same on any machine."""

    def __init__(self, start: float = 1000.0) -> None:
        super().__init__(self._read)
        self.time = start
        self.waited: list[float] = []
        self._due: list[tuple[float, Callable[[], object]]] = []
        self._lock = threading.Lock()

    def _read(self) -> float:
        return self.time

    def at(self, seconds: float, action: Callable[[], object]) -> None:
        """Run ``action`` when the clock passes ``seconds`` from now."""
        with self._lock:
            self._due.append((self.time + seconds, action))
            self._due.sort(key=lambda due: due[0])

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.waited.append(seconds)
        end = self.time + seconds
        while not event.is_set():
            with self._lock:
                if not self._due or self._due[0][0] > end:
                    self.time = max(self.time, end)
                    break
                when, action = self._due.pop(0)
            self.time = max(self.time, when)
            action()
        return event.is_set()
