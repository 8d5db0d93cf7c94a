"""Limits cut into fixed shares, one per worker process (``processes=``, ``--processes``):
each process holds its share alone, and the shares sum to the whole, so the processes
together never pass a limit, without talking to each other. Pure functions of the numbers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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


def process_count(asked: int | str, *, limits: Sequence[float], cpus: int) -> int:
    """How many worker processes a run gets: ``asked`` (``"auto"``: ``cpus``), never more than
    any of ``limits`` has whole units: each process needs at least one of each (of the
    concurrency, of a host's slots, of a rate's count in its period: a share below one a
    period lets every process send its first at once, which together overdraw it)."""
    count = cpus if asked == AUTO else int(asked)
    if count < 1:
        raise ValueError(f"processes must be at least 1 or 'auto', got {asked!r}")
    return max(1, min(count, *(int(limit) for limit in limits)))


def split(total: int, parts: int) -> list[int]:
    """``total`` cut into ``parts`` whole shares as equal as they can be, the larger first,
    summing to ``total`` (256 over 3: 86, 85, 85)."""
    if parts < 1:
        raise ValueError(f"cannot split into {parts} parts")
    whole, extra = divmod(total, parts)
    return [whole + (index < extra) for index in range(parts)]


def split_rate(rate: Rate, parts: int) -> list[Rate]:
    """A rate of at least one a share (see ``process_count``) cut into ``parts`` shares of the
    same period that sum to it: whole counts when it has them (100/s over 3: 34, 33, 33), else
    equal fractions, each at least one (2.5/s over 2: 1.25/s each)."""
    count = rate.count
    if count < parts:
        raise ValueError(f"a rate of {rate} cannot give {parts} processes one each")
    if float(count).is_integer():
        return [Rate(share, rate.period) for share in split(int(count), parts)]
    return [Rate(count / parts, rate.period)] * parts


def split_token_rate(budget: TokenRate, parts: int) -> list[TokenRate]:
    """A token budget cut as ``split_rate`` cuts a rate, its side kept."""
    return [replace(budget, rate=share) for share in split_rate(budget.rate, parts)]
