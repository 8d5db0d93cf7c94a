"""The counts a provider's headers announce, held whatever a reset means (issue 43). A client
cannot tell a server whose reset frees the whole count (OpenAI's and Anthropic's word) from a
sliding window that announces when its OLDEST entry leaves, or from a bucket: so before the
reset no more than the announced remaining is sent, and after it capacity comes back only as
far as the next answer confirms: one attempt (a probe) goes, and its answer tells the rest.
A limit announced alone (no remaining, no reset) is held as a window of its period, a minute,
as the providers' limits are per minute. On explicit instants."""

from __future__ import annotations

import pytest

from batchsync.core.verdict import Announced
from batchsync.http.quota import answer_limits
from batchsync.limits.quota import AnnouncedCounts
from batchsync.limits.taken import TakenLog, Taking
from batchsync.limits.window import INFINITE


class Now:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def told(counts: AnnouncedCounts, clock: Now, **said: float) -> None:
    """One attempt taken and answered at ``clock.now``, its answer saying ``said``."""
    mark, wait = counts.take("h", 0)
    assert mark is not None and wait == 0
    counts.ended("h", mark, Announced(**said), sent=clock.now, counted=True)  # type: ignore[arg-type]


def takes(counts: AnnouncedCounts, many: int) -> list[int]:
    """The marks of ``many`` takes that must each go now."""
    marks = []
    for _ in range(many):
        mark, wait = counts.take("h", 0)
        assert mark is not None and wait == 0
        marks.append(mark)
    return marks


def wait_of(counts: AnnouncedCounts) -> float:
    """How long a take must wait (it must not go now)."""
    mark, wait = counts.take("h", 0)
    assert mark is None
    return wait


def test_before_the_reset_no_more_than_the_remaining_and_nothing_assumed_back() -> None:
    """3 left of 100, the reset in 2 s: 3 go, the 4th waits for the reset, and halfway there
    it still does (a bucket would have given some back by then; a sliding window announcing
    its oldest entry, nothing)."""
    clock = Now()
    counts = AnnouncedCounts(clock)
    told(counts, clock, requests_limit=100, requests_remaining=3, requests_reset=2.0)
    takes(counts, 3)
    assert wait_of(counts) == pytest.approx(2.0)
    clock.now += 1.0
    assert wait_of(counts) == pytest.approx(1.0)


def past_a_spent_reset(clock: Now, reset: float) -> tuple[AnnouncedCounts, int]:
    """A host whose answer said nothing is left until ``reset``, once it has passed, and the
    mark of the one attempt (the probe) that may go then."""
    counts = AnnouncedCounts(clock)
    told(counts, clock, requests_limit=100, requests_remaining=0, requests_reset=reset)
    clock.now += reset
    (probe,) = takes(counts, 1)
    return counts, probe


def test_after_the_reset_one_probe_goes_and_its_answer_tells_the_rest() -> None:
    clock = Now()
    counts, probe = past_a_spent_reset(clock, 2.0)
    assert wait_of(counts) == INFINITE  # until the probe's answer
    # A window announcing its oldest entry: one came back, and the next leaves in 0.5 s.
    said = Announced(requests_limit=100, requests_remaining=1, requests_reset=0.5)
    counts.ended("h", probe, said, sent=clock.now, counted=True)
    takes(counts, 1)
    assert wait_of(counts) == pytest.approx(0.5)


def test_a_probe_that_tells_nothing_lets_the_next_probe_go_one_at_a_time() -> None:
    clock = Now()
    counts, probe = past_a_spent_reset(clock, 1.0)
    counts.ended("h", probe, None, sent=clock.now, counted=True)  # (no answer: a timeout)
    (again,) = takes(counts, 1)
    assert wait_of(counts) == INFINITE
    counts.give_back("h", again)  # (never sent: the next may probe)
    takes(counts, 1)


def test_a_full_reset_confirmed_by_the_probe_lets_the_whole_count_go() -> None:
    clock = Now()
    counts = AnnouncedCounts(clock)
    told(counts, clock, tokens_limit=1000, tokens_remaining=0, tokens_reset=2.0)
    clock.now += 2.5
    mark, wait = counts.take("h", 100)
    assert mark and wait == 0
    said = Announced(tokens_limit=1000, tokens_remaining=900, tokens_reset=0.2)
    counts.ended("h", mark, said, sent=clock.now, counted=True)
    for _ in range(9):
        assert counts.take("h", 100)[1] == 0
    assert counts.take("h", 100)[1] == pytest.approx(0.2)


def test_a_limit_announced_alone_is_read() -> None:
    _, said = answer_limits({"x-ratelimit-limit-requests": "30"}, lambda: 0.0)
    assert said is not None and said.requests_limit == 30 and said.requests_remaining is None
    _, said = answer_limits({"anthropic-ratelimit-tokens-limit": "8000"}, lambda: 0.0)
    assert said is not None and said.tokens_limit == 8000


def test_a_limit_announced_alone_is_held_as_a_window_of_a_minute() -> None:
    """30 a minute, said by an answer with no remaining and no reset: what was sent in the
    last minute counts, each attempt until a minute after it ended; the 31st waits for the
    first to leave."""
    clock = Now()
    counts = AnnouncedCounts(clock)
    told(counts, clock, requests_limit=30)  # (the answered attempt is one of the 30)
    marks = takes(counts, 29)
    assert wait_of(counts) == pytest.approx(60.0)  # the told one ended at 100
    clock.now += 1.0
    for mark in marks:
        counts.ended("h", mark, Announced(requests_limit=30), sent=None, counted=True)
    assert wait_of(counts) == pytest.approx(59.0)
    clock.now += 59.0
    takes(counts, 1)
    assert wait_of(counts) == pytest.approx(1.0)


def answered(counts: AnnouncedCounts, clock: Now, sent: float, **said: float) -> None:
    """An attempt sent at ``sent`` and answered now, its answer saying ``said``."""
    now, clock.now = clock.now, sent
    mark, wait = counts.take("h", 0)
    assert mark is not None and wait == 0
    clock.now = now
    counts.ended("h", mark, Announced(**said), sent=sent, counted=True)  # type: ignore[arg-type]


def half_spent(clock: Now) -> AnnouncedCounts:
    """A host whose first answer, at 100, says 5 of 10 requests left until 101."""
    counts = AnnouncedCounts(clock)
    told(counts, clock, requests_limit=10, requests_remaining=5, requests_reset=1.0)
    return counts


def test_a_reset_that_moves_later_shows_the_whole_count_comes_back() -> None:
    """The second answer's attempt was sent 0.4 s after the first answer and ended before its
    reset, and its reset is 0.5 s later: a window announcing its oldest entry would have
    announced the same instant, so this host's resets are full, and our own attempts come back
    a window after they ended (the window at most the reset plus the answered one's age: the
    first's, 1 s, ended at 100, is back at 101, before the reset at 101.5)."""
    clock = Now()
    counts = half_spent(clock)
    clock.now = 100.5
    answered(counts, clock, 100.4, requests_limit=10, requests_remaining=0, requests_reset=1.0)
    assert wait_of(counts) == pytest.approx(0.5)


def test_a_reset_that_stays_put_keeps_the_host_held_to_what_answers_confirm() -> None:
    """The same answers from a window announcing its oldest entry: the second's reset is the
    first's instant. Nothing comes back before it, and after it one probe goes."""
    clock = Now()
    counts = half_spent(clock)
    clock.now = 100.5
    answered(counts, clock, 100.4, requests_limit=10, requests_remaining=0, requests_reset=0.5)
    assert wait_of(counts) == pytest.approx(0.5)
    clock.now = 101.0
    takes(counts, 1)
    assert wait_of(counts) == INFINITE


def test_an_answer_read_late_does_not_pass_for_a_moved_reset() -> None:
    """A window announcing its oldest entry, whose second answer took 0.3 s to come: it reads
    the same reset 0.25 s later than the first did, which its own latency explains."""
    clock = Now()
    counts = half_spent(clock)
    clock.now = 100.7
    answered(counts, clock, 100.4, requests_limit=10, requests_remaining=0, requests_reset=0.55)
    assert wait_of(counts) == pytest.approx(0.55)  # nothing back before the reset


@pytest.mark.parametrize("counted_first", [True, False], ids=["told-first", "told-last"])
@pytest.mark.parametrize(("earlier_left", "go"), [((8, 7), 6), ((8, 5), 5)])
def test_attempts_whose_answers_told_more_left_are_not_counted_twice(
    counted_first: bool, earlier_left: tuple[int, int], go: int
) -> None:
    """Three attempts in flight at once, sent at 100.0, 100.01 and 100.02; the last one's answer
    says 6 of 10 left. The other two ended after it was sent, so it may not hold them, but
    answers that told more left (8, 7) were counted before it: 6 go, whichever answer came
    first. One that told less (5) may have been counted after it, and stays counted: 5 go."""
    clock = Now()
    counts = AnnouncedCounts(clock)
    told(counts, clock, requests_limit=10, requests_remaining=9, requests_reset=2.0)
    marks = []
    for sent in (100.0, 100.01, 100.02):
        clock.now = sent
        marks.append(takes(counts, 1)[0])
    clock.now = 100.05
    answers = [(mark, sent, left) for mark, sent, left in
               zip(marks, (100.0, 100.01, 100.02), (*earlier_left, 6), strict=True)]  # fmt: skip
    for mark, sent, left in answers[-1:] + answers[:-1] if counted_first else answers:
        said = Announced(requests_limit=10, requests_remaining=left, requests_reset=1.9)
        counts.ended("h", mark, said, sent=sent, counted=True)
    takes(counts, go)
    assert wait_of(counts) == pytest.approx(1.9)


def test_an_attempt_ended_after_an_answer_in_the_same_clock_reading_is_not_in_its_count() -> None:
    """A clock that moves in ticks (Windows' monotonic, 15.6 ms) reads 100.0 for every step.
    The fourth answer says 6 tokens of 100 left until 101, on a host its answers showed gives
    the whole count back; a fifth attempt of 5 tokens is taken and ended after it, in the same
    reading. That attempt is in no count the answer told, so it comes back with none of them:
    halfway to the reset, 20 tokens still wait (6 left, and 11 of ours back; before, its 5 were
    counted back too, and the 20 went)."""
    clock = Now()
    counts = AnnouncedCounts(clock)

    def attempt(tokens: int, **said: float) -> None:
        mark, wait = counts.take("h", tokens)
        assert mark is not None and wait == 0
        told = Announced(**said) if said else None  # type: ignore[arg-type]
        counts.ended("h", mark, told, sent=clock.now, counted=True)

    attempt(200, requests_remaining=5, requests_limit=10, requests_reset=30.0,
            tokens_remaining=23, tokens_limit=100, tokens_reset=5.0)  # fmt: skip
    attempt(5, requests_remaining=9, requests_reset=0.0)
    attempt(5, requests_remaining=1, requests_reset=5.0, tokens_remaining=55, tokens_reset=0.5)
    attempt(1, requests_remaining=10, requests_limit=10, tokens_remaining=6, tokens_reset=1.0)
    attempt(5, requests_remaining=10, requests_reset=5.0)
    clock.now = 100.5
    mark, wait = counts.take("h", 20)
    assert mark is None and wait == pytest.approx(0.5)


def test_a_refusal_puts_a_full_reset_host_back_to_what_answers_confirm() -> None:
    clock = Now()
    counts = half_spent(clock)
    clock.now = 100.5
    answered(counts, clock, 100.4, requests_limit=10, requests_remaining=0, requests_reset=1.0)
    clock.now = 101.2  # (the first attempt is back by the full-reset reading)
    (mark,) = takes(counts, 1)
    said = Announced(requests_limit=10, requests_remaining=0, requests_reset=0.3)
    counts.ended("h", mark, said, sent=101.2, counted=False, refused=True)
    assert wait_of(counts) == pytest.approx(0.3)  # nothing back before the reset
    clock.now = 101.5
    takes(counts, 1)
    assert wait_of(counts) == INFINITE  # and after it, one probe


def test_the_log_of_what_attempts_took_answers_from_running_sums() -> None:
    """In flight and ended sums, what ended after an instant, and forgetting: an ended attempt
    a period after its end, one in flight once no attempt could last that long."""
    log = TakenLog(kept=60.0, longest=120.0)
    for mark, sent in ((1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)):
        log.take(Taking(mark, {"tokens": 10 * mark}, sent))
    assert log.in_flight("tokens") == 100
    for mark, end in ((2, 5.0), (1, 6.0), (4, 7.0)):
        taking = log.drop(mark)
        assert taking is not None
        log.end(taking, taking.sent_at, end)
    assert log.drop(5) is None
    assert log.in_flight("tokens") == 30
    assert log.ended_after(5.0, "tokens") == 50 and log.ended_after(4.0, "tokens") == 70
    assert [t.mark for t in log.ended_by(6.0)] == [1, 2]
    assert [t.mark for t in log.ended_since(6.0)] == [1, 4]
    log.forget(65.5)  # the first to end (at 5) is forgotten
    assert log.ended_after(0.0, "tokens") == 50
    log.forget(122.0)  # no attempt lasts 120 s: the one in flight is forgotten too
    assert log.in_flight("tokens") == 0 and log.ended_after(0.0, "tokens") == 0
