"""The one reading of a number that came from outside: a header value, a ``usage`` count, a
``cost()`` result, a body's ``max_tokens``.

Such a number steers the limits (how long to hold, how much to take), so it is read here and
nowhere else: ASCII digits only (``int()`` also reads ``²`` and other scripts' digits), a
bounded size (a 400-digit count is no count, and ``float()`` of it overflows), finite.
Nothing raises: a value that cannot be what it claims is None, and the caller ignores it.
"""

from __future__ import annotations

import math
import re

# More than any provider's limit of requests or tokens a period, and far below 2**53, so
# that every count is exact as a float too.
MAX_COUNT = 10**12
# About 116 days: longer than any reset, wait or window a server means.
MAX_SECONDS = 1e7

# (an ASCII text whose every character is a digit is of 0 to 9 only: ``isdigit`` reads no other)
_MOST_DIGITS = 13
_DECIMAL = re.compile(r"(?:[0-9]{1,13}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})")


def count_of(value: object) -> int | None:
    """A whole count from 0 to ``MAX_COUNT``: an int (not a bool) or a text of ASCII digits
    (spaces around allowed); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdigit() and len(text) <= _MOST_DIGITS:
            number = int(text)
            return number if number <= MAX_COUNT else None
    return None


def seconds_of(value: object, *, scale: float = 1.0, most: float = MAX_SECONDS) -> float | None:
    """Seconds from 0 to ``most``: a finite number, or a text of an ASCII decimal (``12``,
    ``0.5``, ``.25``), times ``scale`` (1e-3 for milliseconds); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        number = float(value) if -1e300 < value < 1e300 else math.inf
    elif isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        number = float(value.strip())
    else:
        return None
    seconds = number * scale
    return seconds if math.isfinite(seconds) and 0 <= seconds <= most else None
