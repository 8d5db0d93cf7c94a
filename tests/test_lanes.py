"""The arithmetic of ``lanes="auto"``: how long a live pass of the rows still open takes by the
live limits, and when what is left of the deadline no longer holds it."""

from __future__ import annotations

import pytest

from batchsync.batches.lanes import MARGIN, SETTLE_POLLS, LivePace, goes_live


def test_a_live_pass_takes_the_longest_of_its_waves_its_rate_and_its_tokens() -> None:
    pace = LivePace(concurrency=10, latency=2.0)
    assert pace.seconds_for(0, 0) == 0.0
    assert pace.seconds_for(1, 0) == 2.0
    assert pace.seconds_for(10, 0) == 2.0, "one wave"
    assert pace.seconds_for(11, 0) == 4.0, "a second wave"
    rated = LivePace(concurrency=100, latency=1.0, requests_per_second=5.0)
    assert rated.seconds_for(50, 0) == pytest.approx(11.0), "50 at 5 a second, then the last answer"
    metered = LivePace(concurrency=100, latency=1.0, tokens_per_second=1000.0)
    assert metered.seconds_for(10, 30_000) == pytest.approx(31.0)
    both = LivePace(concurrency=2, latency=1.0, requests_per_second=100.0, tokens_per_second=1e9)
    assert both.seconds_for(10, 10) == 5.0, "the waves are the slowest"


def test_the_rows_go_live_once_the_deadline_no_longer_holds_a_live_pass_and_the_cancel() -> None:
    live, poll, step = 10.0, 2.0, 7.0
    edge = live * MARGIN + SETTLE_POLLS * poll + step
    assert not goes_live(edge + 0.001, live, poll, step)
    assert goes_live(edge, live, poll, step)
    assert goes_live(0.0, live, poll, step)
    assert goes_live(edge + 0.005, live, poll, step + 0.01), "a slower provider: sooner"
    assert not goes_live(0.0, 0.0, poll, step), "nothing open: nothing moves"
