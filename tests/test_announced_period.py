"""``rate="auto"`` holds the limits a provider announces to a minute, as OpenAI's and
Anthropic's are. When the resets show them counted over a far shorter period (a server whose
"minute" is 6 s), the run would crawl at a tenth of what it may: it says so, once a run."""

from __future__ import annotations

import logging

import pytest

from batchsync import fetch_all
from batchsync.core.verdict import Announced, Feedback
from batchsync.jobs.options import FetchOptions, build
from batchsync.limits.announced import short_period
from batchsync.limits.gates import Gates

from .fakeclock import FakeClock
from .mockserver import MockServerProcess
from .test_limits_at_the_limit import account, chats
from .test_token_rate import admit

WARNING = "rate auto holds the limits"


def test_a_short_window_shows_its_period() -> None:
    # (remaining, reset, limit): 4 of 600 used, back in 6 s: counted over 6 s, not a minute
    assert short_period((596, 6.0, 600)) == pytest.approx(6.0)
    assert short_period((29_500, 6.0, 30_000)) == pytest.approx(6.0)
    assert short_period((596, 6.0, 600), assumed=6.0) is None


def test_a_minute_shows_no_other_period() -> None:
    assert short_period((300, 30.0, 600)) is None  # even over a minute: half used, 30 s
    assert short_period((590, 1.0, 600)) is None  # the same, 10 used
    assert short_period((599, 60.0, 600)) is None  # a minute's sliding window, after a count
    assert short_period((0, 5.0, 600)) is None  # the same, full, 5 s before its last leaves
    assert short_period((149_984, 360.0, 150_000)) is None  # longer: not judged
    # Anthropic's resets in whole seconds rounded up: 2.2 s of an even minute read as 3
    assert short_period((582, 3.0, 600)) is None


def test_too_little_said_shows_no_period() -> None:
    assert short_period((None, 6.0, 600)) is None
    assert short_period((596, None, 600)) is None
    assert short_period((596, 6.0, None)) is None
    assert short_period((0, 6.0, 0)) is None
    assert short_period((4_000, 2.0, 4_000)) is None  # 15 ms rounded up to a whole second


def test_the_gate_warns_once_a_run(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    option = build(FetchOptions, rate="auto").announced_rates
    assert option is not None
    gates = Gates([option.gate(concurrency=4, shared=None, clock=clock)], clock=clock)
    short = Announced(requests_limit=600, requests_remaining=596, requests_reset=6.0)
    for _ in range(3):
        taken = admit(gates, clock, 0)
        assert not isinstance(taken, str)
        gates.release(taken, Feedback(announced=short))
    warned = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert warned == [
        "rate auto holds the limits h announces to a minute, but its requests resets show "
        "them coming back in about 6 s: the run may go much slower than they allow (give "
        "rate and token_rate instead)"
    ]


@pytest.mark.integration
@pytest.mark.parametrize(("window", "warnings"), [(6, 1), (60, 0)])
def test_against_the_mock_a_short_window_is_told_once(
    server: MockServerProcess, caplog: pytest.LogCaptureFixture, window: int, warnings: int
) -> None:
    """20 requests, the mock's 600 counted over ``window`` s: the first answers' resets show
    its period (the run paced at 600 a minute, 2 s)."""
    url, key = account(server, f"rpm=600,tpm=10000000,window={window}")
    caplog.set_level(logging.WARNING, logger="batchsync")
    rs = fetch_all(chats(url, 20, 20), rate="auto", concurrency=4)
    assert all(r.ok for r in rs), rs.summary()
    warned = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(warned) == warnings, warned
    assert all(key not in message and "?" not in message for message in warned)
