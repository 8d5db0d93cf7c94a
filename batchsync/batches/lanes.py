"""When a run through a batch endpoint with a deadline (``lanes="auto"``) moves the rows still
open to the live lane: the moment what is left of the deadline would no longer hold a live pass
of them at the pace the live limits allow, with room to see their batches' cancel through.

Pure arithmetic: ``sender`` asks it each round, ``run.batched`` says the live lane's limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# How much longer than the estimate a live pass is given (its retries, a slow spell).
MARGIN = 1.5
# Polls it takes to see a cancel through: the cancel, the batch ending, its results read.
SETTLE_POLLS = 3


@dataclass(frozen=True)
class LivePace:
    """What bounds a live pass: the concurrency, the seconds one call takes, the requests a
    second ``--rate`` allows and the tokens a second ``--token-rate`` allows (None: no such
    limit)."""

    concurrency: int
    latency: float
    requests_per_second: float | None = None
    tokens_per_second: float | None = None

    def seconds_for(self, rows: int, tokens: int) -> float:
        """The seconds a live pass of ``rows`` (``tokens`` estimated in all) takes at least:
        waves of ``concurrency`` calls, or the rate's or token rate's pace, whichever is
        slowest."""
        if rows <= 0:
            return 0.0
        waves = math.ceil(rows / self.concurrency) * self.latency
        paced = rows / self.requests_per_second if self.requests_per_second else 0.0
        metered = tokens / self.tokens_per_second if self.tokens_per_second else 0.0
        return max(waves, paced + self.latency, metered + self.latency)


def goes_live(left: float, live_seconds: float, poll: float, step: float) -> bool:
    """Whether the rows still open move now: ``left`` seconds of the deadline no longer hold
    a live pass of ``live_seconds`` (with ``MARGIN``) after the cancel is seen through: a
    ``step`` (the longest the provider has kept a batch in one status) and ``SETTLE_POLLS``
    polls of ``poll`` seconds."""
    settle = step + SETTLE_POLLS * poll
    return live_seconds > 0 and left <= live_seconds * MARGIN + settle
