"""Limits cut into fixed shares, one per worker process (``processes=``, ``--processes``):
each process holds its share alone, and the shares sum to the whole, so the processes
together never pass a limit, without talking to each other. Pure functions of the numbers.
"""

from __future__ import annotations

import os
from dataclasses import replace

from .rates import Rate
from .tokenrate import TokenRate

AUTO = "auto"


def cores() -> int:
    """The cores this process may run on (its affinity where the system says), at least 1."""
    counted = getattr(os, "process_cpu_count", None)  # (3.13)
    if counted is not None:
        return max(1, counted() or 1)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def process_count(asked: int | str, *, concurrency: int, per_host: int | None, cpus: int) -> int:
    """How many worker processes a run gets: ``asked`` (``"auto"``: ``cpus``), never more than
    an integer limit can be cut into (each process needs at least one of ``concurrency`` and,
    unless a shared backend holds it, of ``per_host``: None)."""
    count = cpus if asked == AUTO else int(asked)
    if count < 1:
        raise ValueError(f"processes must be at least 1 or 'auto', got {asked!r}")
    return max(1, min(count, concurrency, per_host or count))


def split(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` whole shares as equal as they can be, the larger first,
    summing to ``total`` (256 over 3: 86, 85, 85)."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts")
    whole, extra = divmod(total, parts)
    return [whole + (index < extra) for index in range(parts)]


def split_rate(rate: Rate, parts: int) -> list[Rate]:
    """A rate cut into ``parts`` shares of the same period that sum to it: whole counts when it
    has at least one a share (100/s over 3: 34, 33, 33), else equal fractions (one in a longer
    period each: 1/s over 2 is 0.5/s, one in any 2 s, each)."""
    count = rate.count
    if float(count).is_integer() and count >= parts:
        return [Rate(share, rate.period) for share in split(int(count), parts)]
    return [Rate(count / parts, rate.period)] * parts


def split_token_rate(budget: TokenRate, parts: int) -> list[TokenRate]:
    """A token budget cut as ``split_rate`` cuts a rate, its side kept."""
    return [replace(budget, rate=share) for share in split_rate(budget.rate, parts)]
