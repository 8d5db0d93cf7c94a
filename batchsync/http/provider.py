"""What a language-model provider's answer says of its rate limits, from its headers.

Pure functions of header values, so that new attempts can be held before they would overdraw
what is left of a provider's requests or tokens per minute, not only once it answers 429:

* OpenAI (and Azure OpenAI, and servers compatible with it):
  ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, the resets Go durations (``6m0s``);
* Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
  remaining,reset}``, the resets RFC 3339 times;
* Azure: ``retry-after-ms`` / ``x-ms-retry-after-ms``, in milliseconds.

These names are exact: OpenAI's ``x-ratelimit-remaining-requests`` is not the
``X-RateLimit-Remaining`` that ``quota`` reads.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from ..core.numbers import count_of, seconds_of
from ..core.verdict import Announced

_OPENAI = "x-ratelimit-"
_ANTHROPIC = "anthropic-ratelimit-"
ANTHROPIC_SETS = ("requests", "tokens", "input-tokens", "output-tokens")
# A duration's text longer than this is no reset a server means (and its parts could overflow).
_LONGEST_DURATION = 40
# Go's time.Duration text: decimal numbers each with a unit ("1h2m3.5s"), the units longest
# first ("ms" is no minute); either micro sign (U+00B5, U+03BC) works as well as "us", as in Go.
_PART = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)"
_DURATION = re.compile(f"(?:{_PART})+")
_DURATION_PART = re.compile(_PART)
_MULTIPLIERS = {"h": 3600.0, "m": 60.0, "s": 1.0}
# The units below a second divide: "20ms" is 0.02 as written, not 20 times an inexact 0.001.
_DIVISORS = {"ms": 1e3, "us": 1e6, "\u00b5s": 1e6, "\u03bcs": 1e6, "ns": 1e9}
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


def announced(headers: Iterable[tuple[str, str]], now: float) -> Announced | None:
    """What a response's (name, value) header pairs say of the provider's limits, read once;
    None when there is none of these headers. ``now`` is the Unix time the answer came, for
    Anthropic's reset times. A value that does not parse leaves its part None; where OpenAI's
    and Anthropic's headers both say a part, OpenAI's wins. Anthropic's ``input-tokens-*`` and
    ``output-tokens-*`` sets are budgets of their own, told apart from its ``tokens-*``.
    """
    found: dict[str, str] = {}
    for name, value in headers:  # (one pass: most answers have none of these headers)
        lowered = name.lower()
        if lowered in _READ:
            found[lowered] = value
    if not found:
        return None
    told: dict[str, Any] = {}
    unreadable: list[str] = []
    for name in sorted(found, key=_RANKS.__getitem__):  # (the one that wins last)
        part, read = _READ[name]
        reading = read(found[name], now)
        if reading is not None:
            told[part] = reading
        elif part.endswith("limit"):
            unreadable.append(name)
    return Announced(**told, unreadable=tuple(sorted(unreadable)))


def _counted(text: str, now: float) -> int | None:
    return count_of(text)


def _go_reset(text: str, now: float) -> float | None:
    return parse_duration(text)


def _reset_at(text: str, now: float) -> float | None:
    """Seconds from ``now`` until an RFC 3339 time, 0 when past; None past MAX_SECONDS."""
    moment = _timestamp(text)
    return None if moment is None else seconds_of(max(moment - now, 0.0))


def _milliseconds(text: str, now: float) -> float | None:
    return seconds_of(text, scale=1e-3)


# Each header read: the part of ``Announced`` it tells and how its value reads, given the Unix
# time of the answer; where two tell a part, the later here wins when it reads.
_READ: dict[str, tuple[str, Callable[[str, float], float | None]]] = {
    **{
        f"{_ANTHROPIC}{kind}-{part}": (f"{kind.replace('-', '_')}_{part}", read)
        for kind in ANTHROPIC_SETS
        for part, read in (("limit", _counted), ("remaining", _counted), ("reset", _reset_at))
    },
    **{
        f"{_OPENAI}{part}-{kind}": (f"{kind}_{part}", read)
        for kind in ("requests", "tokens")
        for part, read in (("limit", _counted), ("remaining", _counted), ("reset", _go_reset))
    },
    "x-ms-retry-after-ms": ("retry_after", _milliseconds),
    "retry-after-ms": ("retry_after", _milliseconds),
}
_RANKS = {name: rank for rank, name in enumerate(_READ)}
# The names ``announced`` reads, in lower case: an answer's other headers need not be read.
READ_NAMES = frozenset(_READ)


@functools.lru_cache(maxsize=256)  # (a server writes the same few resets again and again)
def parse_duration(text: str) -> float | None:
    """Seconds of an OpenAI reset, a Go duration: ``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``.

    Units ``h``, ``m``, ``s``, ``ms``, ``us`` (or ``µs``), ``ns``, as Go writes them. A bare
    number is seconds (Go's ``0``; Azure OpenAI's resets). None when it is neither, negative,
    or longer than ``numbers.MAX_SECONDS``.
    """
    text = text.strip()
    if len(text) <= _LONGEST_DURATION and _DURATION.fullmatch(text):
        return seconds_of(sum(_part_seconds(*part) for part in _DURATION_PART.findall(text)))
    return seconds_of(text)


def _part_seconds(number: str, unit: str) -> float:
    """The seconds of one part of a duration, ``1.5s`` or ``20ms``."""
    multiplier = _MULTIPLIERS.get(unit)
    return float(number) * multiplier if multiplier is not None else float(number) / _DIVISORS[unit]


def _timestamp(text: str) -> float | None:
    """The Unix time of an RFC 3339 time (``2026-12-02T03:04:05.5Z``, or with an offset);
    None when it is not one. A leap second counts as the second before it."""
    match = _TIMESTAMP.fullmatch(text.strip())
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(match[index]) for index in range(1, 7))
    try:
        moment = datetime(year, month, day, hour, minute, min(second, 59), tzinfo=UTC)
    except ValueError:  # no such date or time of day
        return None
    zone = match[8]
    east = 0 if zone in "Zz" else int(zone[1:3]) * 3600 + int(zone[4:6]) * 60
    fraction = float(match[7]) if match[7] else 0.0
    return moment.timestamp() - (-east if zone[0] == "-" else east) + fraction
