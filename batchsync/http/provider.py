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

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TypeVar

from ..core.numbers import count_of, seconds_of
from ..core.verdict import Announced

_T = TypeVar("_T")

_OPENAI = "x-ratelimit-"
_ANTHROPIC = "anthropic-ratelimit-"
_RETRY_AFTER_MS = ("retry-after-ms", "x-ms-retry-after-ms")
_PARTS = ("limit", "remaining", "reset")
ANTHROPIC_SETS = ("requests", "tokens", "input-tokens", "output-tokens")
_NAMES = frozenset(
    [
        *(f"{_OPENAI}{part}-{kind}" for part in _PARTS for kind in ("requests", "tokens")),
        *(f"{_ANTHROPIC}{kind}-{part}" for kind in ANTHROPIC_SETS for part in _PARTS),
        *_RETRY_AFTER_MS,
    ]
)

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
        if lowered in _NAMES:
            found[lowered] = value
    if not found:
        return None
    inputs, outputs = (f"{_ANTHROPIC}{kind}-" for kind in ANTHROPIC_SETS[2:])
    return Announced(
        requests_limit=_count(found, f"{_OPENAI}limit-requests", f"{_ANTHROPIC}requests-limit"),
        requests_remaining=_count(
            found, f"{_OPENAI}remaining-requests", f"{_ANTHROPIC}requests-remaining"
        ),
        requests_reset=_either(
            _duration(found, f"{_OPENAI}reset-requests"),
            _until(found, f"{_ANTHROPIC}requests-reset", now),
        ),
        tokens_limit=_count(found, f"{_OPENAI}limit-tokens", f"{_ANTHROPIC}tokens-limit"),
        tokens_remaining=_count(
            found, f"{_OPENAI}remaining-tokens", f"{_ANTHROPIC}tokens-remaining"
        ),
        tokens_reset=_either(
            _duration(found, f"{_OPENAI}reset-tokens"),
            _until(found, f"{_ANTHROPIC}tokens-reset", now),
        ),
        retry_after=_either(*(seconds_of(found.get(name), scale=1e-3) for name in _RETRY_AFTER_MS)),
        unreadable=tuple(  # (sorted: the headers' order says nothing)
            sorted(
                name
                for name, value in found.items()
                if name.endswith("limit") or "-limit-" in name
                if count_of(value) is None
            )
        ),
        input_tokens_limit=_count(found, f"{inputs}limit"),
        input_tokens_remaining=_count(found, f"{inputs}remaining"),
        input_tokens_reset=_until(found, f"{inputs}reset", now),
        output_tokens_limit=_count(found, f"{outputs}limit"),
        output_tokens_remaining=_count(found, f"{outputs}remaining"),
        output_tokens_reset=_until(found, f"{outputs}reset", now),
    )


def _either(*values: _T | None) -> _T | None:
    """The first part that said something."""
    return next((value for value in values if value is not None), None)


def _count(found: Mapping[str, str], *names: str) -> int | None:
    """The first of the headers' counts; None when each is absent or not one (Azure's -1)."""
    return _either(*(count_of(found.get(name)) for name in names))


def _duration(found: Mapping[str, str], name: str) -> float | None:
    text = found.get(name)
    return None if text is None else parse_duration(text)


def _until(found: Mapping[str, str], name: str, now: float) -> float | None:
    """Seconds from ``now`` until a header's RFC 3339 time, 0 when past; None past MAX_SECONDS."""
    text = found.get(name)
    moment = None if text is None else _timestamp(text)
    return None if moment is None else seconds_of(max(moment - now, 0.0))


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
