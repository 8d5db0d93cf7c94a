"""How long to wait before the next try: exponential backoff with jitter, floored by Retry-After."""

from __future__ import annotations

import email.utils
import math
from dataclasses import dataclass
from datetime import UTC

from .numbers import seconds_of


@dataclass(frozen=True)
class Backoff:
    """An immutable backoff policy.

    The wait after attempt ``n`` is ``min(base * factor**(n-1), max)`` stretched by a random
    share of up to ``jitter`` of itself, so that workers that failed together do not retry
    together. A server's Retry-After is a floor that the wait never undercuts.
    """

    base: float = 0.5
    factor: float = 2.0
    max: float = 30.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        for name in ("base", "max", "jitter"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"backoff {name} must be a finite number >= 0, got {value!r}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"backoff factor must be a finite number >= 1, got {self.factor!r}")

    def wait(self, attempt: int, retry_after: float | None, rand: float) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based).

        ``rand`` is a uniform draw from [0, 1); passing it in keeps the policy a pure function.
        """
        exponent = max(attempt - 1, 0)
        # factor**exponent overflows long before it matters: the cap applies first.
        try:
            grown = self.base * self.factor**exponent
        except OverflowError:
            grown = self.max
        wait = min(grown, self.max) * (1.0 + self.jitter * rand)
        return wait if retry_after is None else max(wait, retry_after)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header value, or None when it says nothing usable.

    Accepts delay-seconds and an HTTP-date; ``now`` is the current Unix time, used for dates.
    A date in the past means "no wait" (0.0); garbage and negative numbers mean None.
    """
    text = (value or "").strip()
    if not text:
        return None
    if text[0] in "0123456789.+-" and not any(char.isalpha() for char in text):
        return seconds_of(text)  # (a number, or no usable one: ASCII digits, bounded)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are always GMT; a zone-less parse is still GMT.
        when = when.replace(tzinfo=UTC)
    return max(when.timestamp() - now, 0.0)
