"""A rate as a user writes it: ``500/min``, ``10/s``, ``3600/h``, or a bare number per second.

Providers state their limits per minute (requests and tokens per minute), so a rate keeps the
period it was given in: shown back to the user as they wrote it, and held over windows of that
period (``Window``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_PERIODS = {
    **dict.fromkeys(("s", "sec", "second"), 1.0),
    **dict.fromkeys(("min", "minute"), 60.0),
    **dict.fromkeys(("h", "hr", "hour"), 3600.0),
}
_LABELS = {1.0: "s", 60.0: "min", 3600.0: "h"}
# A plain decimal with an optional exponent: what str(Rate) writes, so every rate shown can be
# read back. Not Python's float() syntax: no "inf", "nan" or "1_000".
_RATE = re.compile(
    r"\s*(?P<count>(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*(?:/\s*(?P<unit>[a-z]+)\s*)?",
    re.IGNORECASE,
)
_FORMS = "a positive number per second or N/s, N/min, N/h"


@dataclass(frozen=True)
class Rate:
    """``count`` units per ``period`` seconds (1, 60 or 3600)."""

    count: float
    period: float

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not (math.isfinite(self.count) and self.count > 0):
            raise ValueError(f"rate count must be a positive finite number, got {self.count!r}")
        if self.period not in _LABELS:
            raise ValueError(f"rate period must be 1, 60 or 3600 seconds, got {self.period!r}")

    def __str__(self) -> str:
        """The rate as a user writes it (``500/min``), which ``parse_rate`` reads back."""
        count = float(self.count)
        number = str(int(count)) if count.is_integer() and count < 1e16 else repr(count)
        return f"{number}/{_LABELS[self.period]}"


def parse_rate(value: float | int | str, *, name: str = "rate") -> Rate:
    """A ``Rate`` from a number (per second) or a string ``N``, ``N/s``, ``N/min``, ``N/h``.

    Units (any case, spaces around ``/`` allowed): ``s``, ``sec``, ``second``, ``min``,
    ``minute``, ``h``, ``hr``, ``hour``. ``N`` is a positive finite decimal, an exponent
    allowed (``1e3/min``). Anything else raises ValueError naming ``name`` and the value.
    """
    read = _count_and_period(value)
    if read is None or not (math.isfinite(read[0]) and read[0] > 0):
        raise _invalid(name, value)
    return Rate(count=read[0], period=read[1])


def _count_and_period(value: object) -> tuple[float, float] | None:
    """What ``value`` says, unchecked; None when it is no number nor rate text."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return float(value), 1.0
        except OverflowError:  # an int beyond any float
            return None
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    unit = (match["unit"] or "s").lower() if match is not None else ""
    if match is None or unit not in _PERIODS:
        return None
    return float(match["count"]), _PERIODS[unit]


def _invalid(name: str, value: object) -> ValueError:
    return ValueError(f"{name} must be {_FORMS}: got {value!r}")


@dataclass(frozen=True)
class Window:
    """At most ``count`` per ``period`` seconds, sent at most one ``interval`` apart."""

    count: float
    period: float

    @classmethod
    def of(cls, rate: Rate) -> Window:
        """A rate as a window that whole sends can fill: below one a period, one per the
        longer period that makes it one (0.5/s: one in any 2 s)."""
        if rate.count < 1:
            return cls(1.0, rate.period / rate.count)
        return cls(float(rate.count), rate.period)

    @property
    def interval(self) -> float:
        """Seconds between the sends of one unit each."""
        return self.period / self.count

    def __str__(self) -> str:
        return f"{self.count:g} per {self.period:g} s"
