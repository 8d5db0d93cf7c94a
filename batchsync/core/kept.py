"""A bounded memo shared by threads: values worked out once and cheap to work out again."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
D = TypeVar("D")


class Kept(Generic[K, V]):
    """At most ``limit`` values by key; past that it starts afresh (a forgotten value costs a
    look-up again, never a wrong answer).

    Reads take no lock: one dict look-up is atomic on every build, free-threaded included.
    Storing does, because it is three steps (check the bound, clear, store): without the lock,
    on a free-threaded build two threads storing at once could clear what the other had just
    stored, or both pass the check and grow the dict past its bound.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._values: dict[K, V] = {}
        self._lock = threading.Lock()

    @overload
    def get(self, key: K) -> V | None: ...
    @overload
    def get(self, key: K, default: D) -> V | D: ...
    def get(self, key: K, default: object = None) -> object:
        return self._values.get(key, default)

    def keep(self, key: K, value: V) -> V:
        with self._lock:
            if len(self._values) >= self._limit and key not in self._values:
                self._values.clear()
            self._values[key] = value
        return value

    def forget(self, key: K) -> None:
        with self._lock:
            self._values.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._values.clear()

    def copy(self) -> dict[K, V]:
        with self._lock:
            return dict(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __reduce__(self) -> tuple[type[Kept[K, V]], tuple[int]]:
        """Pickled empty (a lock cannot be): another process works its values out anew."""
        return (type(self), (self._limit,))
