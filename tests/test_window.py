"""The window's log and pace (``window``) on explicit instants, and the counts a provider's
headers announce (``announced``) against both kinds of server they may come from."""

from __future__ import annotations

import threading
from collections import deque

import pytest

from batchsync.core.admission import Admission
from batchsync.core.budget import Allowance
from batchsync.core.clock import SYSTEM
from batchsync.core.stop import Stop
from batchsync.core.verdict import Announced, Feedback, retry
from batchsync.http.classify import host_feedback
from batchsync.http.httpfacts import HttpFacts
from batchsync.limits.cooldown import CooldownGate, Cooldowns
from batchsync.limits.gate import Waiting
from batchsync.limits.gates import Gates, Refusal
from batchsync.limits.quota import AnnouncedCounts, QuotaGate
from batchsync.limits.rates import Window
from batchsync.limits.window import INFINITE, Entry, LocalWindow, enter, room_wait

from .fakeclock import FakeClock


class Now:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ended(amount: float, leaves: float) -> Entry:
    return Entry(amount, 1.0, leaves)


def test_room_is_now_when_it_fits_else_when_enough_ended_entries_leave() -> None:
    log = deque([ended(3, 101.0), ended(4, 102.0)])
    assert room_wait(log, 7, 3, 10, 100.0) == 0.0  # 7 + 3 fits 10
    assert room_wait(log, 7, 4, 10, 100.0) == 1.0  # one over: the first to leave frees 3
    assert room_wait(log, 7, 7, 10, 100.0) == 2.0  # four over: both must leave
    assert room_wait(log, 9, 9, 10, 100.0) == INFINITE  # the other 2 held are in flight
    assert room_wait(deque(), 0, 50, 10, 100.0) == 0.0  # more than the count: an empty log


def test_sends_are_paced_evenly_and_an_entry_leaves_a_period_after_its_attempt_ended() -> None:
    clock, turn = Now(), threading.Event()
    log, window = LocalWindow(clock), Window(2, 1)  # 2 in any second: one each 0.5 s
    first, wait = log.take(1, window, turn, 10)
    assert first is not None and wait == 0
    assert log.take(1, window, turn, 10) == (None, 0.5)  # the pace
    clock.now += 0.5
    second, _ = log.take(1, window, turn, 10)
    assert second is not None
    clock.now += 0.5
    assert log.take(1, window, turn, 10) == (None, INFINITE)  # both in flight: full
    log.finish(first, None)  # ended at 101.0: leaves at 102.0
    assert log.take(1, window, turn, 10)[1] == pytest.approx(1.0)
    clock.now += 1.0
    third, _ = log.take(1, window, turn, 10)
    assert third is not None


def test_turns_are_served_in_the_order_they_came() -> None:
    clock = Now()
    log, window = LocalWindow(clock), Window(1, 1)
    first, second, third = threading.Event(), threading.Event(), threading.Event()
    held, _ = log.take(1, window, first, 10)
    assert held is not None
    assert log.take(1, window, second, 10) == (None, INFINITE)
    assert log.take(1, window, third, 10) == (None, INFINITE)  # behind the second
    log.finish(held, None)
    clock.now += 1.0
    assert log.take(1, window, third, 10) == (None, INFINITE)  # still behind
    taken, _ = log.take(1, window, second, 10)
    assert taken is not None
    log.withdraw(third)  # gave up: out of the line, nothing taken


def test_a_change_wakes_the_first_waiter_alone_and_each_in_its_turn() -> None:
    """Only the waiter that may go is woken (a change woke every waiter, each of which took
    the lock to find it still behind: 8.5 ms of CPU a request at concurrency 256)."""
    clock = Now()
    log, window = LocalWindow(clock), Window(1, 1)
    held, _ = log.take(1, window, threading.Event(), 10)
    waiters = [threading.Event() for _ in range(5)]
    for waiter in waiters:
        assert log.take(1, window, waiter, 10) == (None, INFINITE)
    log.finish(held, None)  # the room may come: the first looks again, no other
    assert [waiter.is_set() for waiter in waiters] == [True, False, False, False, False]
    waiters[0].clear()
    log.withdraw(waiters[2])  # one behind leaves: nobody's turn came
    assert not any(waiter.is_set() for waiter in waiters)
    clock.now += 1.0
    taken, _ = log.take(1, window, waiters[0], 10)
    assert taken is not None  # the first went: the next is first now, and woken
    assert [waiter.is_set() for waiter in waiters] == [False, True, False, False, False]
    log.recheck()  # a limit changed: the first looks again
    waiters[1].clear()
    log.recheck()
    assert [waiter.is_set() for waiter in waiters] == [False, True, False, False, False]


def test_a_change_wakes_a_waiter_at_once() -> None:
    log, window = LocalWindow(Now()), Window(1, 1)
    held, _ = log.take(1, window, threading.Event(), 10)
    waiter = threading.Event()
    assert log.take(1, window, waiter, 10) == (None, INFINITE)
    threading.Timer(0.05, log.cancel, args=(held,)).start()
    assert waiter.wait(5)


def test_a_provider_429_with_a_reset_is_a_hold_never_a_breaker_failure() -> None:
    said = Announced(tokens_limit=1000, tokens_remaining=0, tokens_reset=0.5)
    refused = retry("status", "HTTP 429", HttpFacts(429, announced=said))
    assert host_feedback(refused).unwell is None
    bare = retry("status", "HTTP 429", HttpFacts(429))  # nothing says when: the host is unwell
    assert host_feedback(bare).unwell is True


def test_a_reset_past_the_budget_says_so() -> None:
    clock = FakeClock()
    board = Cooldowns(clock.now)
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board, clock.now)], clock=clock)
    first = gates.admit("h", Allowance(clock.now() + 60), threading.Event(), 10)
    assert not isinstance(first, str)
    told = Announced(tokens_limit=1000, tokens_remaining=0, tokens_reset=30.0)
    gates.release(first, Feedback(announced=told))
    refused = gates.enter("h", Allowance(clock.now() + 5), threading.Event(), 10)
    assert refused == Refusal(
        "budget", "the server's reset is in 30.0 s, more than the budget left"
    )


def test_a_sliding_window_gives_back_our_own_attempts_a_window_after_they_ended() -> None:
    """1 000 a second. The first attempt (400) ended at 100.1, its answer telling 600 left;
    the second (400), sent at 100.5 and ended at 100.6, tells 200 left and the window empty
    again in 1 s. The window can be no longer than that reset plus the answered attempt's age
    (1.1 s): the first's 400 are back at 100.1 + 1.1, no sooner; the second's and the rest
    only at the reset. Evenly, as a bucket refills, 300 would be back by 100.975: later of
    the two."""
    clock = Now()
    counts = AnnouncedCounts(clock)
    first, _ = counts.take("h", 400)  # (the host's first, alone)
    assert first
    clock.now = 100.1
    counts.ended("h", first, Announced(tokens_limit=1000, tokens_remaining=600,
                                       tokens_reset=1.0), sent=100.0, counted=True)  # fmt: skip
    clock.now = 100.5
    second, _ = counts.take("h", 400)
    assert second
    clock.now = 100.6
    told = Announced(tokens_limit=1000, tokens_remaining=200, tokens_reset=1.0)
    counts.ended("h", second, told, sent=100.5, counted=True)
    assert counts.take("h", 500)[1] == pytest.approx(0.6)
    clock.now = 101.2
    assert counts.take("h", 500)[1] == 0
    assert counts.take("h", 200)[1] == pytest.approx(0.4)  # the rest: at the reset


def test_what_a_lone_answer_says_is_spent_comes_back_at_its_reset() -> None:
    clock = Now()
    counts = AnnouncedCounts(clock)
    mark, _ = counts.take("h", 10)
    told = Announced(tokens_limit=1000, tokens_remaining=0, tokens_reset=2.0)
    counts.ended("h", mark or 0, told, sent=100.0, counted=True)  # 990 spent by others
    assert counts.take("h", 250)[1] == pytest.approx(2.0)


@pytest.mark.parametrize("counted", [True, False])
def test_the_window_is_the_least_any_counted_answer_bounds_it_to(counted: bool) -> None:
    """The first answer comes 0.05 s after its send and says the window is empty again in
    1 s: the window is at most 1.05 s. A slower second answer (0.4 s, the same reset) cannot
    lengthen it: the first attempt's 400 are back at 100.05 + 1.05, not 100.05 + 1.4. An
    answer the server did not count (no usage: a 429) may have been told of an older window:
    it bounds nothing."""
    clock = Now()
    counts = AnnouncedCounts(clock)
    first, _ = counts.take("h", 400)
    assert first
    clock.now = 100.05
    told = Announced(tokens_limit=1000, tokens_remaining=600, tokens_reset=1.0)
    counts.ended("h", first, told, sent=100.0, counted=counted)
    clock.now = 100.5
    second, _ = counts.take("h", 400)
    assert second
    clock.now = 100.9
    told = Announced(tokens_limit=1000, tokens_remaining=200, tokens_reset=1.0)
    counts.ended("h", second, told, sent=100.5, counted=True)
    back = 100.05 + 1.05 if counted else 100.05 + 1.4
    assert counts.take("h", 300)[1] == pytest.approx(back - 100.9)  # (evenly: by 101.025)


def _admission(stop: threading.Event, seconds: float = 5.0) -> Admission:
    return Admission("h", Allowance(SYSTEM.now() + seconds), stop)


def test_a_stop_set_before_the_wait_ends_it_at_once() -> None:
    """The stop's wake came before the wait cleared its turn, and the wait slept its whole
    allowance (a Ctrl-C held a run 20 s)."""
    log, window = LocalWindow(SYSTEM.now), Window(1, 60)
    held, _ = log.take(1, window, threading.Event(), 10)
    assert held is not None
    stop = Stop()
    stop.set()
    began = SYSTEM.now()
    entry, refusal = enter(
        log, lambda: window, 1, name="token", admission=_admission(stop), waiting=Waiting(SYSTEM)
    )
    assert (entry, refusal) == (None, "cancelled")
    assert SYSTEM.now() - began < 1.0


def test_a_limit_lowered_while_an_attempt_waits_holds_it() -> None:
    """An announced limit that goes down reaches the attempts already waiting (each kept the
    window it began with, and went on at the old limit)."""
    clock = Now()
    log, windows = LocalWindow(clock), [Window(600, 60)]
    for _ in range(3):
        taken, _ = log.take(1, windows[0], threading.Event(), 10)
        assert taken is not None
        clock.now += 1.0  # (past the pace)
    windows[0] = Window(3, 60)  # (three in flight: no room until one ends and a minute passes)
    entry, refusal = enter(
        log,
        lambda: windows[0],
        1,
        name="announced requests",
        admission=_admission(Stop(), seconds=0.3),
        waiting=Waiting(SYSTEM),
    )
    assert entry is None and refusal == "budget"
