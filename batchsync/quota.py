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

import math
import re
from collections.abc import Callable, Iterable, Mapping

from .provider import Announced, announced

# A reset above this is an epoch time (2001-09-09), below it a number of seconds: no quota
# window lasts 31 years, and no server clock is set before 2001.
_EPOCH_THRESHOLD = 1e9
_REMAINING = re.compile(r"(?:^|[;,\s])(?:r|remaining)\s*=\s*(\d+)")
_RESET = re.compile(r"(?:^|[;,\s])(?:t|reset)\s*=\s*(\d+(?:\.\d+)?)")
_WINDOW = re.compile(r"(?:^|[;,\s])w\s*=\s*(\d+(?:\.\d+)?)")


def answer_limits(
    headers: Mapping[str, str], unix_time: Callable[[], float]
) -> tuple[float | None, Announced | None]:
    """An answer's ``quota_wait`` and what an LLM provider's own headers announce
    (``provider.announced``: OpenAI's, Anthropic's), each read only when a header it looks at
    first is there (most answers have none, and reading every header of every answer costs
    more than a few look-ups); requests none of which are left hold the host until their
    reset, as a spent quota does."""
    told = (
        "x-ratelimit-remaining" in headers
        or "ratelimit-remaining" in headers
        or "ratelimit" in headers
    )
    quota = quota_wait(headers.items(), unix_time) if told else None
    if not (
        "x-ratelimit-remaining-requests" in headers
        or "anthropic-ratelimit-requests-remaining" in headers
    ):
        return quota, None
    said = announced(headers.items(), unix_time())
    if said is not None and said.requests_remaining == 0 and said.requests_reset is not None:
        quota = max(quota or 0.0, said.requests_reset)
    return quota, said


def retry_after_of(headers: Mapping[str, str]) -> str | None:
    """An answer's Retry-After, or Azure's ``retry-after-ms`` / ``x-ms-retry-after-ms`` in its
    terms (seconds) when it has none."""
    value = headers.get("Retry-After")
    if value is not None:
        return value
    millis = headers.get("retry-after-ms") or headers.get("x-ms-retry-after-ms")
    if millis is None or not millis.strip().isdigit():
        return None
    return str(int(millis) / 1000)


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
    """The wait of a structured ``RateLimit`` field (``r=0;t=30``), its reset else the
    window of its ``RateLimit-Policy``."""
    left, reset = _REMAINING.search(field), _RESET.search(field)
    if left is None:
        return None
    if reset is None:  # the policy's window: the longest the wait can be
        policy = found.get("ratelimit-policy")
        reset = _WINDOW.search(policy) if policy is not None else None
    return _wait(left[1], reset[1] if reset is not None else None, unix_time)


def _wait(remaining: str, reset: str | None, unix_time: Callable[[], float]) -> float | None:
    try:
        if int(remaining.strip()) > 0:
            return None
        seconds = float((reset or "").strip())
    except ValueError:  # a value that says nothing usable
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    if seconds > _EPOCH_THRESHOLD:
        seconds -= unix_time()
    return max(seconds, 0.0)
