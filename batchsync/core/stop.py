"""A run's stop that wakes every wait, those on an event of their own included.

A limiter wakes only the waiter whose turn came (``limits.window``, ``limits.slots``): the
rest sleep on their own event or condition, which the run's stop would not set. Rather than
have each sleeper look at the stop every few milliseconds (256 waiters doing so cost more CPU
than the requests), a sleeper registers how to wake it, and ``Stop.set`` calls that.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class Stop(threading.Event):
    """An Event whose ``set`` also calls the wakes registered by ``woken_by``."""

    def __init__(self) -> None:
        super().__init__()
        self._wakes: dict[object, Callable[[], None]] = {}
        self._wakes_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._wakes_lock:
            wakes = list(self._wakes.values())
        for wake in wakes:
            wake()

    def add_wake(self, key: object, wake: Callable[[], None]) -> None:
        with self._wakes_lock:
            self._wakes[key] = wake

    def remove_wake(self, key: object) -> None:
        with self._wakes_lock:
            self._wakes.pop(key, None)


@contextlib.contextmanager
def woken_by(stop: threading.Event, wake: Callable[[], None]) -> Iterator[bool]:
    """Within the block, ``stop`` being set calls ``wake`` (at once, if it is set already).
    Yields False when ``stop`` is a plain Event, which cannot: its sleepers must look at it
    every ``gate.POLL_SECONDS``."""
    if not isinstance(stop, Stop):
        yield False
        return
    key = object()
    stop.add_wake(key, wake)
    try:
        if stop.is_set():
            wake()
        yield True
    finally:
        stop.remove_wake(key)
