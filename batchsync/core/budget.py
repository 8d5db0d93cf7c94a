"""Budget arithmetic: how much time an item may still spend, and which limit runs out first.

All instants are readings of one monotonic clock; nothing here reads the clock itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Limit = Literal["budget", "deadline"]


@dataclass(slots=True)  # built per item, never changed (frozen would cost 6x to build)
class Allowance:
    """The two instants an item must finish by: its own budget's end and the batch deadline."""

    budget_end: float
    deadline_end: float | None = None

    def tightest(self, now: float) -> tuple[float, Limit]:
        """Seconds left before the nearest limit, and which limit that is."""
        left = self.budget_end - now
        if self.deadline_end is not None and self.deadline_end - now <= left:
            return self.deadline_end - now, "deadline"
        return left, "budget"

    def attempt_end(self, timeout: float, now: float) -> tuple[float, Limit | None]:
        """The instant the next attempt, starting ``now``, must end by: the nearest of its
        timeout, the budget's end and the deadline. Every part of an attempt (connecting,
        headers, body, redirects) is bounded by this one instant.

        Also says which limit set it (None when the attempt's own timeout did), so that an
        attempt cut short by the budget or deadline is reported as such.
        """
        left, limit = self.tightest(now)
        if timeout < left:
            return now + timeout, None
        return now + left, limit

    def refuses_wait(self, wait: float, now: float) -> Limit | None:
        """The limit that a wait of ``wait`` seconds would leave no time under, else None."""
        left, limit = self.tightest(now)
        return limit if wait >= left else None
