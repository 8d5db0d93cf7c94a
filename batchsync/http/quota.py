"""What a host's rate-limit headers say: how long until its quota resets, when none is left.

Pure functions of header values, so that a host is held before it answers 429, not after.
Read, the first that says something winning:

* ``X-RateLimit-Remaining`` / ``X-RateLimit-Reset`` (GitHub, Twitter, many others): the reset
  is an epoch time or a number of seconds left, told apart by size;
* ``RateLimit-Remaining`` / ``RateLimit-Reset`` (the IETF draft's early form): seconds left;
* ``RateLimit: "policy";r=0;t=30`` (the IETF draft's structured field; also its older
  ``limit=100, remaining=0, reset=30`` form), with ``RateLimit-Policy``'s window (``w=60``) as
  the wait when the field gives no reset.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from ..core.numbers import count_of, seconds_of
from ..core.verdict import Announced
from .internals import items_named, lower_names
from .provider import ANTHROPIC_SETS, READ_NAMES, announced

# A reset above this is an epoch time (2001-09-09), below it a number of seconds: no quota
# window lasts 31 years, and no server clock is set before 2001.
_EPOCH_THRESHOLD = 1e9
# Each value whole up to the next parameter: "t=1e5" is no reset of 1 s, "r=0x10" no 0 left.
_END = r"(?=$|[;,\s])"
_REMAINING = re.compile(r"(?:^|[;,\s])(?:r|remaining)\s*=\s*([0-9]+)" + _END)
_RESET = re.compile(r"(?:^|[;,\s])(?:t|reset)\s*=\s*([0-9]+(?:\.[0-9]+)?)" + _END)
_WINDOW = re.compile(r"(?:^|[;,\s])w\s*=\s*([0-9]+(?:\.[0-9]+)?)" + _END)
# Headers one of which an answer that tells its quota has.
_QUOTA_MARKS = frozenset({"x-ratelimit-remaining", "ratelimit-remaining", "ratelimit"})
# Headers one of which an answer that tells a provider's counts has (a server may send only
# its tokens' or only its requests', or a limit alone).
_COUNTS = ("remaining", "limit")
_PROVIDER_MARKS = frozenset(
    {
        *(f"x-ratelimit-{part}-{kind}" for part in _COUNTS for kind in ("requests", "tokens")),
        *(f"anthropic-ratelimit-{kind}-{part}" for part in _COUNTS for kind in ANTHROPIC_SETS),
    }
)
# The largest reset read: an epoch time in seconds far in the future, not a 400-digit number.
_LATEST_EPOCH = 1e11


def answer_limits(
    headers: Mapping[str, str], unix_time: Callable[[], float]
) -> tuple[float | None, Announced | None]:
    """An answer's ``quota_wait`` and what an LLM provider's own headers announce
    (``provider.announced``: OpenAI's, Anthropic's), each read only when a header it looks at
    first is there (most answers have none, and reading every header of every answer costs
    more than a few look-ups). The provider's counts are the quota gate's to hold
    (``announced``)."""
    names = lower_names(headers)
    if names is None:  # (another mapping: asked name by name, as it compares names)
        told = any(name in headers for name in _QUOTA_MARKS)
        provider = any(name in headers for name in _PROVIDER_MARKS)
    else:
        told = not _QUOTA_MARKS.isdisjoint(names)
        provider = not _PROVIDER_MARKS.isdisjoint(names)
    quota = quota_wait(headers.items(), unix_time) if told else None
    return quota, announced(items_named(headers, READ_NAMES), unix_time()) if provider else None


def retry_after_of(headers: Mapping[str, str]) -> str | None:
    """An answer's Retry-After, or Azure's ``retry-after-ms`` / ``x-ms-retry-after-ms`` in its
    terms (seconds) when it has none."""
    value = headers.get("Retry-After")
    if value is not None:
        return value
    seconds = seconds_of(headers.get("retry-after-ms"), scale=1e-3)
    if seconds is None:  # (absent, or no number: the other name may say it)
        seconds = seconds_of(headers.get("x-ms-retry-after-ms"), scale=1e-3)
    # (in plain decimals, as a Retry-After is written: no "1e-05")
    return None if seconds is None else f"{seconds:.6f}".rstrip("0").rstrip(".")


def quota_wait(headers: Iterable[tuple[str, str]], unix_time: Callable[[], float]) -> float | None:
    """Seconds until the host's quota resets, when its headers say nothing is left; None when
    they say something is left, or nothing at all. ``headers`` are a response's (name, value)
    pairs, read once; ``unix_time`` reads the clock, for an epoch reset."""
    found: dict[str, str] = {}
    for name, value in headers:  # (one pass: most answers have no such header at all)
        lowered = name.lower()
        if "ratelimit" in lowered:
            found[lowered] = value
    if not found:
        return None
    for prefix in ("x-ratelimit-", "ratelimit-"):
        remaining = found.get(f"{prefix}remaining")
        if remaining is not None:
            return _wait(remaining, found.get(f"{prefix}reset"), unix_time)
    field = found.get("ratelimit")
    return None if field is None else _structured(field, found, unix_time)


def _structured(field: str, found: dict[str, str], unix_time: Callable[[], float]) -> float | None:
    """The wait of a ``RateLimit`` field (``r=0;t=30``): its reset, else the policy's window."""
    left, reset = _REMAINING.search(field), _RESET.search(field)
    if left is None:
        return None
    if reset is None:  # the policy's window: the longest the wait can be
        policy = found.get("ratelimit-policy")
        reset = _WINDOW.search(policy) if policy is not None else None
    return _wait(left[1], reset[1] if reset is not None else None, unix_time)


def _wait(remaining: str, reset: str | None, unix_time: Callable[[], float]) -> float | None:
    if count_of(remaining) != 0:  # something left, or a value that says nothing usable
        return None
    seconds = seconds_of(reset, most=_LATEST_EPOCH)
    if seconds is None:
        return None
    if seconds > _EPOCH_THRESHOLD:
        seconds -= unix_time()
    return seconds_of(max(seconds, 0.0))
