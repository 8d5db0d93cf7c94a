"""The one clock every wait is measured on: the system's, unless a test gives its own.

A ``Clock`` reads a monotonic time (``now``) and waits on an event for some seconds
(``wait``): the engine's retry waits, the gates' holds and the journal's group-commit linger
all go through one, so a test can run them on a fake clock without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Clock:
    """Monotonic readings, and waits measured on them."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        # (the system clock's ``now`` is time.monotonic itself: no call in between)
        self.now = now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until ``event`` is set or ``seconds`` have passed; whether it is set."""
        return event.wait(seconds)

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        self.wait(threading.Event(), seconds)


SYSTEM = Clock()


def clock_of(clock: Clock | Callable[[], float]) -> Clock:
    """``clock``, or a bare reading function as a Clock whose waits are real."""
    return clock if isinstance(clock, Clock) else Clock(clock)
